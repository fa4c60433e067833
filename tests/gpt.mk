# tests of the GPT model under DDP (src/nn/gpt.c): an MPI program run by the shell wrappers
# under tests/mpirun.sh with 2 and 3 ranks (the program itself is not run bare).
EXTRA_DIST += tests/test_gpt_ddp_np2.sh tests/test_gpt_ddp_np3.sh

if HAVE_CHECK
check_PROGRAMS += tests/test_gpt_ddp
TESTS += tests/test_gpt_ddp_np2.sh tests/test_gpt_ddp_np3.sh
tests_test_gpt_ddp_SOURCES = tests/test_gpt_ddp.c
tests_test_gpt_ddp_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_gpt_ddp_LDADD = libmpitrain_all.la $(CHECK_LIBS) -lm
endif
