# src/comm: the process group and collectives (include/mpitrain/comm.h). MPI backend now; the
# NCCL backend slot is in comm.c's registry (comm_nccl.c, under if HAVE_NCCL, when it exists).
mpitraininclude_HEADERS += include/mpitrain/comm.h
libmpitrain_all_la_SOURCES += \
	src/comm/comm_impl.h src/comm/launch.h \
	src/comm/comm.c src/comm/comm_boot.c src/comm/comm_mpi.c src/comm/comm_wait.c \
	src/comm/launch.c

# MPI test programs run under tests/mpirun.sh (root, oversubscribed, with a timeout).
EXTRA_DIST += tests/mpirun.sh tests/test_comm_np2.sh tests/test_comm_np3.sh \
	tests/test_comm_progress_np2.sh tests/test_comm_progress_np3.sh tests/test_comm_abort_np2.sh \
	tests/test_launch_singleton.sh

if HAVE_CHECK
check_PROGRAMS += tests/test_comm tests/test_comm_progress tests/test_launch
TESTS += tests/test_comm_np2.sh tests/test_comm_np3.sh tests/test_comm_progress_np2.sh \
	tests/test_comm_progress_np3.sh tests/test_comm_abort_np2.sh tests/test_launch \
	tests/test_launch_singleton.sh
tests_test_comm_SOURCES = tests/test_comm.c
tests_test_comm_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_comm_LDADD = libmpitrain_all.la $(CHECK_LIBS)
tests_test_comm_progress_SOURCES = tests/test_comm_progress.c
tests_test_comm_progress_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_comm_progress_LDADD = libmpitrain_all.la $(CHECK_LIBS)
tests_test_launch_SOURCES = tests/test_launch.c
tests_test_launch_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_launch_LDADD = libmpitrain_all.la $(CHECK_LIBS)
endif
