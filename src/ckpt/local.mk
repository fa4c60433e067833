# src/ckpt: checkpoints (include/mpitrain/ckpt.h): the versioned, checksummed file format, its
# atomic writer and validating reader, directories of checkpoints, and the collective wrappers.
mpitraininclude_HEADERS += include/mpitrain/ckpt.h
libmpitrain_all_la_SOURCES += \
	src/ckpt/ckpt_impl.h src/ckpt/write.c src/ckpt/read.c src/ckpt/dir.c

if HAVE_CHECK
check_PROGRAMS += tests/test_ckpt tests/test_ckpt_format
TESTS += tests/test_ckpt tests/test_ckpt_format
tests_test_ckpt_SOURCES = tests/test_ckpt.c tests/ckpt_util.h
tests_test_ckpt_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_ckpt_LDADD = libmpitrain_all.la $(CHECK_LIBS)
tests_test_ckpt_format_SOURCES = tests/test_ckpt_format.c tests/ckpt_util.h
tests_test_ckpt_format_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_ckpt_format_LDADD = libmpitrain_all.la $(CHECK_LIBS)
endif
# llm.c GPT model files (include/mpitrain/gpt_file.h)
mpitraininclude_HEADERS += include/mpitrain/gpt_file.h
libmpitrain_all_la_SOURCES += src/ckpt/gpt_file.c src/ckpt/gpt_load.c
# Hugging Face safetensors files and GPT-2 models in them (include/mpitrain/safetensors.h)
mpitraininclude_HEADERS += include/mpitrain/safetensors.h
libmpitrain_all_la_SOURCES += src/ckpt/json.h src/ckpt/json.c src/ckpt/safetensors.c \
	src/ckpt/gpt_safetensors.c src/ckpt/st_model.h src/ckpt/st_model.c
# Llama models as Hugging Face safetensors (include/mpitrain/llama_file.h)
mpitraininclude_HEADERS += include/mpitrain/llama_file.h
libmpitrain_all_la_SOURCES += src/ckpt/llama_file.c
if HAVE_CHECK
check_PROGRAMS += tests/test_gpt_file
TESTS += tests/test_gpt_file
tests_test_gpt_file_SOURCES = tests/test_gpt_file.c
tests_test_gpt_file_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_gpt_file_LDADD = libmpitrain_all.la $(CHECK_LIBS)
endif
if HAVE_CHECK
check_PROGRAMS += tests/test_safetensors
TESTS += tests/test_safetensors
tests_test_safetensors_SOURCES = tests/test_safetensors.c
tests_test_safetensors_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_safetensors_LDADD = libmpitrain_all.la $(CHECK_LIBS)
endif
