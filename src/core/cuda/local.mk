# src/core/cuda: the CUDA device backend of core (a private part of include/mpitrain/core.h and
# ops.h; other layers reach it through src/core/cuda/cuda.h). Built when configure found CUDA.
#
# The .cu files hold kernels and their extern "C" launchers; they are compiled by nvcc through
# libtool into the same convenience library as the C files. libtool would add -fPIC, which
# nvcc rejects: -prefer-non-pic keeps libtool from adding it and -Xcompiler=-fPIC (one word, so
# that libtool does not take -Xcompiler for its own option) gives the host compiler position
# independent code. nvcc writes no dependency files here: the .lo files depend on the kernel
# headers explicitly below.
SUFFIXES = .cu

AM_V_NVCC = $(am__v_NVCC_@AM_V@)
am__v_NVCC_ = $(am__v_NVCC_@AM_DEFAULT_V@)
am__v_NVCC_0 = @echo "  NVCC    " $@;
am__v_NVCC_1 =
NVCC_CPPFLAGS = -I$(top_srcdir)/include -I$(top_srcdir)/src $(CUDA_CFLAGS)

.cu.lo:
	$(AM_V_NVCC)$(LIBTOOL) $(AM_V_lt) --tag=CC --mode=compile $(NVCC) $(NVCCFLAGS) \
	  $(NVCC_CPPFLAGS) -Xcompiler=-fPIC -Xcompiler=-fvisibility=hidden -prefer-non-pic -c -o $@ $<

# The caching allocator's logic is plain C (tested on the CPU with a fake backend): every build.
libmpitrain_all_la_SOURCES += src/core/cuda/alloc_cache.h src/core/cuda/alloc_cache.c
if HAVE_CHECK
check_PROGRAMS += tests/test_alloc_cache
TESTS += tests/test_alloc_cache
tests_test_alloc_cache_SOURCES = tests/test_alloc_cache.c
tests_test_alloc_cache_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_alloc_cache_LDADD = libmpitrain_all.la $(CHECK_LIBS)
endif

if HAVE_CUDA
# device.c registers the backend under MPT_HAVE_CUDA (config.h); every file sees the CUDA headers.
AM_CPPFLAGS += $(CUDA_CFLAGS)
libmpitrain_all_la_SOURCES += \
	src/core/cuda/cuda.h src/core/cuda/cuda_internal.h src/core/cuda/cuda_check.h \
	src/core/cuda/kernels.h src/core/cuda/kernels_common.cuh \
	src/core/cuda/cuda_backend.c src/core/cuda/cuda_alloc.c src/core/cuda/cuda_stream.c \
	src/core/cuda/ops_cuda.c src/core/cuda/ops_cuda_nn.c src/core/cuda/conv_cudnn.c \
	src/core/cuda/ops_cuda_gpt.c src/core/cuda/kernels_gpt.cu \
	src/core/cuda/kernels_elementwise.cu src/core/cuda/kernels_conv.cu \
	src/core/cuda/kernels_norm.cu src/core/cuda/kernels_loss.cu src/core/cuda/kernels_optim.cu \
	src/core/cuda/kernels_bf16.cu
# nvcc's host stubs use C++ function-local statics (__cxa_guard_*): link the C++ runtime.
libmpitrain_all_la_LIBADD += $(CUDA_LIBS) -lstdc++

NVCC_KERNEL_DEPS = $(top_srcdir)/src/core/cuda/kernels_common.cuh \
	$(top_srcdir)/src/core/kernel_math.h \
	$(top_srcdir)/src/core/cuda/kernels.h $(top_srcdir)/include/mpitrain/ops.h \
	$(top_srcdir)/include/mpitrain/core.h $(top_srcdir)/include/mpitrain/ops_gpt.h
src/core/cuda/kernels_elementwise.lo src/core/cuda/kernels_conv.lo: $(NVCC_KERNEL_DEPS)
src/core/cuda/kernels_norm.lo src/core/cuda/kernels_loss.lo: $(NVCC_KERNEL_DEPS)
src/core/cuda/kernels_optim.lo src/core/cuda/kernels_gpt.lo: $(NVCC_KERNEL_DEPS)
src/core/cuda/kernels_bf16.lo: $(NVCC_KERNEL_DEPS)

if HAVE_CHECK
check_PROGRAMS += tests/test_cuda_ops tests/test_cuda_stream
TESTS += tests/test_cuda_ops tests/test_cuda_stream
tests_test_cuda_ops_SOURCES = tests/test_cuda_ops.c
tests_test_cuda_ops_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_cuda_ops_LDADD = libmpitrain_all.la $(CHECK_LIBS)
tests_test_cuda_stream_SOURCES = tests/test_cuda_stream.c
tests_test_cuda_stream_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_cuda_stream_LDADD = libmpitrain_all.la $(CHECK_LIBS)
check_PROGRAMS += tests/test_cuda_gpt_ops
TESTS += tests/test_cuda_gpt_ops
tests_test_cuda_gpt_ops_SOURCES = tests/test_cuda_gpt_ops.c
tests_test_cuda_gpt_ops_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_cuda_gpt_ops_LDADD = libmpitrain_all.la $(CHECK_LIBS) -lm
# the bf16 GEMM on the GPU (cublasGemmEx) against bf16-rounded products
check_PROGRAMS += tests/test_cuda_bf16
TESTS += tests/test_cuda_bf16
tests_test_cuda_bf16_SOURCES = tests/test_cuda_bf16.c
tests_test_cuda_bf16_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_cuda_bf16_LDADD = libmpitrain_all.la $(CHECK_LIBS) -lm
endif
endif
