# src/nn: the autodiff tape, layers and models; see the layer's public header include/mpitrain/nn.h
mpitraininclude_HEADERS += include/mpitrain/nn.h include/mpitrain/autograd.h \
	include/mpitrain/transformer.h include/mpitrain/llama.h
# the GPT's configuration and parameter layout (the file formats of src/ckpt read and write it)
mpitraininclude_HEADERS += include/mpitrain/gpt_config.h
libmpitrain_all_la_SOURCES += \
	src/nn/tape.h src/nn/tape_impl.h src/nn/tape.c src/nn/tape_backward.c src/nn/tape_profile.c \
	src/nn/model.c src/nn/ops_basic.c \
	src/nn/conv.c src/nn/pool.c src/nn/dropout.c src/nn/batchnorm.c src/nn/models.c \
	src/nn/eval.c src/nn/gpt_ops.h src/nn/gpt_ops.c src/nn/attention.c src/nn/gpt.c \
	src/nn/gpt_config.c \
	src/nn/attention_bf16.c src/nn/linear_bf16.c src/nn/llama_ops.c src/nn/llama.c \
	src/nn/lm_common.h src/nn/lm_common.c

if HAVE_CHECK
check_PROGRAMS += tests/test_tape tests/test_tape_model tests/test_tape_ops tests/test_layers tests/test_models tests/test_hooks
TESTS += tests/test_tape tests/test_tape_model tests/test_tape_ops tests/test_layers tests/test_models tests/test_hooks
check_PROGRAMS += tests/test_gpt_ops
TESTS += tests/test_gpt_ops
tests_test_gpt_ops_SOURCES = tests/test_gpt_ops.c tests/gpt_ops_util.h
tests_test_gpt_ops_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_gpt_ops_LDADD = libmpitrain_all.la $(CHECK_LIBS) -lm
check_PROGRAMS += tests/test_gpt_ops_attention
TESTS += tests/test_gpt_ops_attention
tests_test_gpt_ops_attention_SOURCES = tests/test_gpt_ops_attention.c tests/gpt_ops_util.h
tests_test_gpt_ops_attention_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_gpt_ops_attention_LDADD = libmpitrain_all.la $(CHECK_LIBS) -lm
check_PROGRAMS += tests/test_attention_fused
TESTS += tests/test_attention_fused
tests_test_attention_fused_SOURCES = tests/test_attention_fused.c
tests_test_attention_fused_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_attention_fused_LDADD = libmpitrain_all.la $(CHECK_LIBS) -lm
check_PROGRAMS += tests/test_gpt
TESTS += tests/test_gpt
tests_test_gpt_SOURCES = tests/test_gpt.c
tests_test_gpt_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_gpt_LDADD = libmpitrain_all.la $(CHECK_LIBS) -lm
check_PROGRAMS += tests/test_cuda_gpt
TESTS += tests/test_cuda_gpt
tests_test_cuda_gpt_SOURCES = tests/test_cuda_gpt.c
tests_test_cuda_gpt_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_cuda_gpt_LDADD = libmpitrain_all.la $(CHECK_LIBS) -lm
check_PROGRAMS += tests/test_gpt_core
TESTS += tests/test_gpt_core
tests_test_gpt_core_SOURCES = tests/test_gpt_core.c
tests_test_gpt_core_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_gpt_core_LDADD = libmpitrain_all.la $(CHECK_LIBS) -lm
check_PROGRAMS += tests/test_gpt_fused
TESTS += tests/test_gpt_fused
tests_test_gpt_fused_SOURCES = tests/test_gpt_fused.c
tests_test_gpt_fused_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_gpt_fused_LDADD = libmpitrain_all.la $(CHECK_LIBS) -lm
tests_test_tape_SOURCES = tests/test_tape.c tests/tape_util.h
tests_test_tape_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_tape_LDADD = libmpitrain_all.la $(CHECK_LIBS)
tests_test_tape_model_SOURCES = tests/test_tape_model.c tests/tape_util.h
tests_test_tape_model_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_tape_model_LDADD = libmpitrain_all.la $(CHECK_LIBS)
tests_test_tape_ops_SOURCES = tests/test_tape_ops.c tests/tape_util.h
tests_test_tape_ops_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_tape_ops_LDADD = libmpitrain_all.la $(CHECK_LIBS)
tests_test_layers_SOURCES = tests/test_layers.c
tests_test_layers_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_layers_LDADD = libmpitrain_all.la $(CHECK_LIBS)
check_PROGRAMS += tests/test_tape_profile
TESTS += tests/test_tape_profile
tests_test_tape_profile_SOURCES = tests/test_tape_profile.c
tests_test_tape_profile_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_tape_profile_LDADD = libmpitrain_all.la $(CHECK_LIBS)
tests_test_hooks_SOURCES = tests/test_hooks.c
tests_test_hooks_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_hooks_LDADD = libmpitrain_all.la $(CHECK_LIBS)
tests_test_models_SOURCES = tests/test_models.c
tests_test_models_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_models_LDADD = libmpitrain_all.la $(CHECK_LIBS)
# tests/test_eval is an MPI program, run with 2 and 3 ranks (tests/run_np.sh)
check_PROGRAMS += tests/test_eval
TESTS += tests/test_eval_np2.mpi tests/test_eval_np3.mpi
tests_test_eval_SOURCES = tests/test_eval.c
tests_test_eval_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_eval_LDADD = libmpitrain_all.la $(CHECK_LIBS)
endif
