# src/optim: optimizers (SGD, AdamW) over flat buffers and LR schedules; public header
# include/mpitrain/optim.h
mpitraininclude_HEADERS += include/mpitrain/optim.h
libmpitrain_all_la_SOURCES += src/optim/optimizer.c src/optim/schedule.c src/optim/groups.c \
	src/optim/clip.c

if HAVE_CHECK
check_PROGRAMS += tests/test_optim tests/test_optim_groups
TESTS += tests/test_optim tests/test_optim_groups
tests_test_optim_SOURCES = tests/test_optim.c
tests_test_optim_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_optim_LDADD = libmpitrain_all.la $(CHECK_LIBS)
tests_test_optim_groups_SOURCES = tests/test_optim_groups.c
tests_test_optim_groups_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_optim_groups_LDADD = libmpitrain_all.la $(CHECK_LIBS)
endif
