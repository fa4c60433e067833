# src/comm: the process group and collectives (include/mpitrain/comm.h). Backends: MPI (always),
# MPI with device buffers staged through pinned memory (CUDA builds), NCCL (NCCL builds); the
# registry in comm.c picks one. devmap.c binds ranks to devices (docs/faults.md F11, F12).
mpitraininclude_HEADERS += include/mpitrain/comm.h
libmpitrain_all_la_SOURCES += \
	src/comm/comm_impl.h src/comm/comm_mpi_impl.h src/comm/launch.h \
	src/comm/comm.c src/comm/comm_boot.c src/comm/comm_mpi.c src/comm/comm_wait.c \
	src/comm/comm_mpi_call.c src/comm/flight.c \
	src/comm/comm_progress.c src/comm/init_watchdog.c \
	src/comm/launch.c src/comm/devmap.c src/comm/host_stage.c
if HAVE_CUDA
libmpitrain_all_la_SOURCES += src/comm/comm_stage.c
endif
if HAVE_NCCL
libmpitrain_all_la_SOURCES += src/comm/comm_nccl.h src/comm/comm_nccl_impl.h \
	src/comm/comm_nccl.c src/comm/comm_nccl_coll.c
endif
EXTRA_DIST += src/comm/comm_nccl.h src/comm/comm_nccl_impl.h src/comm/comm_nccl.c \
	src/comm/comm_nccl_coll.c src/comm/comm_stage.c

# MPI test programs run under tests/mpirun.sh (root, oversubscribed, with a timeout): the
# names PROGRAM_npN.mpi through tests/run_np.sh (Makefile.am).
EXTRA_DIST += tests/test_comm_abort.sh tests/test_launch_singleton.sh

if HAVE_CHECK
check_PROGRAMS += tests/test_comm tests/test_comm_progress tests/test_launch
TESTS += tests/test_comm_np2.mpi tests/test_comm_np3.mpi tests/test_comm_progress_np2.mpi \
	tests/test_comm_progress_np3.mpi tests/test_comm_abort.sh tests/test_launch \
	tests/test_launch_singleton.sh
tests_test_comm_SOURCES = tests/test_comm.c
tests_test_comm_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_comm_LDADD = libmpitrain_all.la $(CHECK_LIBS)
tests_test_comm_progress_SOURCES = tests/test_comm_progress.c
tests_test_comm_progress_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_comm_progress_LDADD = libmpitrain_all.la $(CHECK_LIBS)
check_PROGRAMS += tests/test_devmap tests/test_comm_devices tests/test_host_stage
TESTS += tests/test_devmap tests/test_host_stage tests/test_comm_devices_np2.mpi tests/test_comm_devices_np3.mpi
tests_test_devmap_SOURCES = tests/test_devmap.c
tests_test_devmap_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_devmap_LDADD = libmpitrain_all.la $(CHECK_LIBS)
tests_test_host_stage_SOURCES = tests/test_host_stage.c
tests_test_host_stage_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_host_stage_LDADD = libmpitrain_all.la $(CHECK_LIBS)
tests_test_comm_devices_SOURCES = tests/test_comm_devices.c
tests_test_comm_devices_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_comm_devices_LDADD = libmpitrain_all.la $(CHECK_LIBS)
if HAVE_CUDA
# Needs a GPU (exit 77 = SKIP without one): bare = one rank (NCCL world of 1), np2 = two ranks.
check_PROGRAMS += tests/test_comm_cuda
TESTS += tests/test_comm_cuda tests/test_comm_cuda_np2.mpi
tests_test_comm_cuda_SOURCES = tests/test_comm_cuda.c
tests_test_comm_cuda_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_comm_cuda_LDADD = libmpitrain_all.la $(CHECK_LIBS)
endif
tests_test_launch_SOURCES = tests/test_launch.c
tests_test_launch_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_launch_LDADD = libmpitrain_all.la $(CHECK_LIBS)
endif
# NaN in MIN / MAX at 4 ranks (the Check case "nan" of tests/test_comm.c)
if HAVE_CHECK
TESTS += tests/test_comm_np4.mpi
endif
# reduce-scatter, all-gather of shards, bfloat16 reductions (2, 3 and 4 ranks)
if HAVE_CHECK
check_PROGRAMS += tests/test_comm_shard
TESTS += tests/test_comm_shard_np2.mpi tests/test_comm_shard_np3.mpi tests/test_comm_shard_np4.mpi
tests_test_comm_shard_SOURCES = tests/test_comm_shard.c
tests_test_comm_shard_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_comm_shard_LDADD = libmpitrain_all.la $(CHECK_LIBS)
endif

# bfloat16 reductions rounded once: exact small cases at 2, 3, 4 and 8 ranks
if HAVE_CHECK
check_PROGRAMS += tests/test_comm_bf16
TESTS += tests/test_comm_bf16_np2.mpi tests/test_comm_bf16_np3.mpi tests/test_comm_bf16_np4.mpi \
	tests/test_comm_bf16_np8.mpi
tests_test_comm_bf16_SOURCES = tests/test_comm_bf16.c
tests_test_comm_bf16_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_comm_bf16_LDADD = libmpitrain_all.la $(CHECK_LIBS)
endif
