# tests of the GPT model under DDP (src/nn/gpt.c): an MPI program run with 2 and 3 ranks
# (tests/run_np.sh; the program itself is not run bare).

if HAVE_CHECK
check_PROGRAMS += tests/test_gpt_ddp
TESTS += tests/test_gpt_ddp_np2.mpi tests/test_gpt_ddp_np3.mpi
tests_test_gpt_ddp_SOURCES = tests/test_gpt_ddp.c
tests_test_gpt_ddp_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_gpt_ddp_LDADD = libmpitrain_all.la $(CHECK_LIBS) -lm
endif

# The PyTorch oracle (skipped without Debian's python3-torch): a helper program writes the
# model file and mpitrain's results, tests/gpt_torch.py compares.
EXTRA_DIST += tests/test_gpt_torch.sh tests/gpt_torch.py
check_PROGRAMS += tests/gpt_torch_helper
TESTS += tests/test_gpt_torch.sh
tests_gpt_torch_helper_SOURCES = tests/gpt_torch_helper.c
tests_gpt_torch_helper_LDADD = libmpitrain_all.la -lm

# The cross-entropy at large logits against PyTorch (skipped without Debian's python3-torch):
# a helper program writes mpitrain's results, tests/xent_torch.py compares.
EXTRA_DIST += tests/test_xent_torch.sh tests/xent_torch.py
check_PROGRAMS += tests/xent_torch_helper
TESTS += tests/test_xent_torch.sh
tests_xent_torch_helper_SOURCES = tests/xent_torch_helper.c
tests_xent_torch_helper_LDADD = libmpitrain_all.la -lm
