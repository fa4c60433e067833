# src/data: IDX reader, datasets, distributed sampler, batch loader (include/mpitrain/data.h)
mpitraininclude_HEADERS += include/mpitrain/data.h
libmpitrain_all_la_SOURCES += \
	src/data/idx.c src/data/dataset.c src/data/sampler.c src/data/loader.c src/data/source.c

if HAVE_CHECK
check_PROGRAMS += tests/test_idx tests/test_sampler tests/test_loader tests/test_source
TESTS += tests/test_idx tests/test_sampler tests/test_loader tests/test_source
tests_test_idx_SOURCES = tests/test_idx.c
tests_test_idx_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_idx_LDADD = libmpitrain_all.la $(CHECK_LIBS)
tests_test_sampler_SOURCES = tests/test_sampler.c
tests_test_sampler_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_sampler_LDADD = libmpitrain_all.la $(CHECK_LIBS)
tests_test_loader_SOURCES = tests/test_loader.c
tests_test_loader_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_loader_LDADD = libmpitrain_all.la $(CHECK_LIBS)
tests_test_source_SOURCES = tests/test_source.c
tests_test_source_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_source_LDADD = libmpitrain_all.la $(CHECK_LIBS)
endif
# llm.c token shards and the language-model windows over them
libmpitrain_all_la_SOURCES += src/data/tokens_impl.h src/data/tokens.c src/data/token_data.c
if HAVE_CHECK
check_PROGRAMS += tests/test_tokens
TESTS += tests/test_tokens
tests_test_tokens_SOURCES = tests/test_tokens.c
tests_test_tokens_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_tokens_LDADD = libmpitrain_all.la $(CHECK_LIBS)
endif
# the windows sharded over real ranks (mpirun -np 2 and 3)
if HAVE_CHECK
check_PROGRAMS += tests/test_token_ddp
TESTS += tests/test_token_ddp_np2.mpi tests/test_token_ddp_np3.mpi
tests_test_token_ddp_SOURCES = tests/test_token_ddp.c tests/mpi_check.h
tests_test_token_ddp_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_token_ddp_LDADD = libmpitrain_all.la $(CHECK_LIBS)
endif
