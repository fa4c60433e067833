# tests of the Llama model (src/nn/llama.c, src/nn/llama_ops.c)

# The PyTorch oracle (skipped without Debian's python3-torch): a helper program writes the
# parameters and mpitrain's results, tests/llama_torch.py compares.
EXTRA_DIST += tests/test_llama_torch.sh tests/llama_torch.py tests/torch_helper.h \
	tests/lm_ddp_check.h
check_PROGRAMS += tests/llama_torch_helper
TESTS += tests/test_llama_torch.sh
tests_llama_torch_helper_SOURCES = tests/llama_torch_helper.c
tests_llama_torch_helper_LDADD = libmpitrain_all.la -lm

# tests/test_llama_ddp is an MPI program, run by tests/run_np.sh with 2 and 3 ranks (the program
# itself is not run bare).

if HAVE_CHECK
check_PROGRAMS += tests/test_llama_ddp
TESTS += tests/test_llama_ddp_np2.mpi tests/test_llama_ddp_np3.mpi
tests_test_llama_ddp_SOURCES = tests/test_llama_ddp.c
tests_test_llama_ddp_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_llama_ddp_LDADD = libmpitrain_all.la $(CHECK_LIBS) -lm
check_PROGRAMS += tests/test_llama
TESTS += tests/test_llama
tests_test_llama_SOURCES = tests/test_llama.c
tests_test_llama_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_llama_LDADD = libmpitrain_all.la $(CHECK_LIBS) -lm
endif

# `mpitrain train --model llama-tiny` through the trainer: learning, equivalence with one
# process under DDP, ZeRO, accumulation and bf16 gradients, recompute, checkpoints.
TESTS += tests/test_train_llama.sh
EXTRA_DIST += tests/test_train_llama.sh

# Llama models as Hugging Face safetensors + config.json (src/ckpt/llama_file.c)
if HAVE_CHECK
check_PROGRAMS += tests/test_llama_file
TESTS += tests/test_llama_file
tests_test_llama_file_SOURCES = tests/test_llama_file.c
tests_test_llama_file_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_llama_file_LDADD = libmpitrain_all.la $(CHECK_LIBS) -lm
endif
# Llama safetensors models through train --model llama / --init-from / --save-model and generate
TESTS += tests/test_llama_safetensors_cli.sh
EXTRA_DIST += tests/test_llama_safetensors_cli.sh
# Bad input to Llama safetensors models, their --save-model options and --gemm tune's cache
TESTS += tests/test_llama_bad_input.sh
EXTRA_DIST += tests/test_llama_bad_input.sh
