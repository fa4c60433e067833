# tests of the DDP engine (src/ddp): MPI programs run by the shell wrappers under
# tests/mpirun.sh with 2, 3 and 4 ranks (the programs themselves are not run bare).
EXTRA_DIST += tests/test_ddp_np2.sh tests/test_ddp_np3.sh tests/test_ddp_np4.sh tests/mpi_check.h

if HAVE_CHECK
check_PROGRAMS += tests/test_ddp tests/test_faults tests/test_ddp_stats
TESTS += tests/test_ddp_stats tests/test_ddp_np2.sh tests/test_ddp_np3.sh tests/test_ddp_np4.sh
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
EXTRA_DIST += tests/test_ddp_bf16.sh
if HAVE_CHECK
check_PROGRAMS += tests/test_ddp_bf16
TESTS += tests/test_ddp_bf16.sh
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
EXTRA_DIST += tests/test_ddp_hook.sh
if HAVE_CHECK
check_PROGRAMS += tests/test_ddp_hook
TESTS += tests/test_ddp_hook.sh
tests_test_ddp_hook_SOURCES = tests/test_ddp_hook.c
tests_test_ddp_hook_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_ddp_hook_LDADD = libmpitrain_all.la $(CHECK_LIBS)
endif
