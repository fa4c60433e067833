# tests of the DDP engine (src/ddp): MPI programs run with 2, 3 and 4 ranks (tests/run_np.sh;
# the programs themselves are not run bare): tests/test_ddp (equivalence with one process,
# bucket plan) and tests/test_faults (the docs/faults.md cases F03-F08 with their exact values)
EXTRA_DIST += tests/mpi_check.h

if HAVE_CHECK
check_PROGRAMS += tests/test_ddp tests/test_faults tests/test_ddp_stats
TESTS += tests/test_ddp_stats tests/test_ddp_np2.mpi tests/test_ddp_np3.mpi tests/test_ddp_np4.mpi \
	tests/test_faults_np2.mpi tests/test_faults_np3.mpi tests/test_faults_np4.mpi
tests_test_ddp_SOURCES = tests/test_ddp.c
tests_test_ddp_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_ddp_LDADD = libmpitrain_all.la $(CHECK_LIBS)
tests_test_ddp_stats_SOURCES = tests/test_ddp_stats.c
tests_test_ddp_stats_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_ddp_stats_LDADD = libmpitrain_all.la $(CHECK_LIBS)
tests_test_faults_SOURCES = tests/test_faults.c
tests_test_faults_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_faults_LDADD = libmpitrain_all.la $(CHECK_LIBS)
endif
# bf16 gradient communication (2 and 3 ranks)
if HAVE_CHECK
check_PROGRAMS += tests/test_ddp_bf16
TESTS += tests/test_ddp_bf16_np2.mpi tests/test_ddp_bf16_np3.mpi
tests_test_ddp_bf16_SOURCES = tests/test_ddp_bf16.c
tests_test_ddp_bf16_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_ddp_bf16_LDADD = libmpitrain_all.la $(CHECK_LIBS)
endif
# ZeRO-1 (2, 3 and 4 ranks)
EXTRA_DIST += tests/test_zero.sh tests/test_zero2.sh tests/test_zero3.sh
if HAVE_CHECK
check_PROGRAMS += tests/test_zero
TESTS += tests/test_zero.sh tests/test_zero2.sh tests/test_zero3.sh
tests_test_zero_SOURCES = tests/test_zero.c
tests_test_zero_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_zero_LDADD = libmpitrain_all.la $(CHECK_LIBS)
endif
# the communication hook (a user-defined reducer) against the built-in reducers at 2 and 3 ranks
if HAVE_CHECK
check_PROGRAMS += tests/test_ddp_hook
TESTS += tests/test_ddp_hook_np2.mpi tests/test_ddp_hook_np3.mpi
tests_test_ddp_hook_SOURCES = tests/test_ddp_hook.c
tests_test_ddp_hook_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_ddp_hook_LDADD = libmpitrain_all.la $(CHECK_LIBS)
endif
