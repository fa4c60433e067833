# src/dp: DataParallel, one process driving several devices (include/mpitrain/dp.h)
mpitraininclude_HEADERS += include/mpitrain/dp.h
libmpitrain_all_la_SOURCES += src/dp/dp.c src/dp/devices.c src/dp/dp_impl.h

# tests/test_dp: DP over 1-4 CPU devices against one device. tests/test_dp_hybrid: an MPI
# program (DP inside each of 2 ranks, DDP across them) run with 2 ranks (tests/run_np.sh), never
# bare.
if HAVE_CHECK
check_PROGRAMS += tests/test_dp tests/test_dp_hybrid
TESTS += tests/test_dp tests/test_dp_hybrid_np2.mpi
tests_test_dp_SOURCES = tests/test_dp.c
tests_test_dp_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_dp_LDADD = libmpitrain_all.la $(CHECK_LIBS)
tests_test_dp_hybrid_SOURCES = tests/test_dp_hybrid.c
tests_test_dp_hybrid_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_dp_hybrid_LDADD = libmpitrain_all.la $(CHECK_LIBS)
endif
if HAVE_CUDA
if HAVE_CHECK
# DP on CUDA against one CPU process (exit 77 = SKIP without a GPU; run first by
# bench/gpu-check.sh).
check_PROGRAMS += tests/test_dp_cuda
TESTS += tests/test_dp_cuda
tests_test_dp_cuda_SOURCES = tests/test_dp_cuda.c
tests_test_dp_cuda_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_dp_cuda_LDADD = libmpitrain_all.la $(CHECK_LIBS)
endif
endif
