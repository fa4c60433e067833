# src/core: status, logging, devices, streams and events, tensors, RNG, ops (include/mpitrain/core.h, ops.h)
mpitraininclude_HEADERS += include/mpitrain/core.h include/mpitrain/ops.h include/mpitrain/ops_gpt.h \
	include/mpitrain/ops_bf16.h include/mpitrain/ops_llama.h
libmpitrain_all_la_SOURCES += \
	src/core/error.h src/core/backend.h src/core/kernel_math.h src/core/fault.h src/core/fault.c \
	src/core/keeper.h \
	src/core/status.c src/core/log.c src/core/rng.c src/core/device.c src/core/tensor.c \
	src/core/ops.c src/core/trace.c src/core/bf16.c src/core/threads.h src/core/threads.c \
	src/core/cpu/cpu.h src/core/cpu/vec.h src/core/cpu/vmath.h src/core/cpu/cpu_backend.c \
	src/core/cpu/isa.h src/core/cpu/isa.c \
	src/core/cpu/stream_cpu.c \
	src/core/cpu/ops_cpu.c src/core/cpu/cpu_threads.c src/core/cpu/gemm_choice.c src/core/cpu/gemm_tune.c \
	src/core/cpu/conv_cpu.c \
	src/core/cpu/norm_cpu.c src/core/cpu/optim_cpu.c src/core/ops_gpt.c src/core/cpu/gpt_cpu.c \
	src/core/ops_llama.c src/core/cpu/llama_cpu.c
# The fused attention (src/core/cpu/attn_cpu.c) runs its (b, h) pairs on OpenMP's team, the
# threads of oneDNN's GEMMs: with oneDNN it is built with -fopenmp (its own convenience library,
# for the flag), without oneDNN it is plain C on the calling thread.
if HAVE_ONEDNN
noinst_LTLIBRARIES += libmpt_attn.la
libmpt_attn_la_SOURCES = src/core/cpu/attn_cpu.c
libmpt_attn_la_CFLAGS = $(AM_CFLAGS) -fopenmp
libmpitrain_all_la_LIBADD += libmpt_attn.la
else
libmpitrain_all_la_SOURCES += src/core/cpu/attn_cpu.c
endif
if HAVE_ONEDNN
libmpitrain_all_la_SOURCES += src/core/cpu/conv_dnnl.c src/core/cpu/gemm_dnnl.c src/core/cpu/dnnl_check.h \
	src/core/cpu/sgemm_dnnl.c
endif

if HAVE_CHECK
check_PROGRAMS += tests/test_ops tests/test_ops_conv tests/test_ops_train tests/test_stream
TESTS += tests/test_ops tests/test_ops_conv tests/test_ops_train tests/test_stream
tests_test_ops_SOURCES = tests/test_ops.c tests/ops_util.h
tests_test_ops_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_ops_LDADD = libmpitrain_all.la $(CHECK_LIBS)
tests_test_ops_conv_SOURCES = tests/test_ops_conv.c tests/ops_util.h
tests_test_ops_conv_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_ops_conv_LDADD = libmpitrain_all.la $(CHECK_LIBS)
tests_test_ops_train_SOURCES = tests/test_ops_train.c tests/ops_util.h
tests_test_ops_train_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_ops_train_LDADD = libmpitrain_all.la $(CHECK_LIBS)
tests_test_stream_SOURCES = tests/test_stream.c
tests_test_stream_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_stream_LDADD = libmpitrain_all.la $(CHECK_LIBS)
check_PROGRAMS += tests/test_trace
TESTS += tests/test_trace
tests_test_trace_SOURCES = tests/test_trace.c
tests_test_trace_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_trace_LDADD = libmpitrain_all.la $(CHECK_LIBS)
check_PROGRAMS += tests/test_rng
TESTS += tests/test_rng
tests_test_rng_SOURCES = tests/test_rng.c
tests_test_rng_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_rng_LDADD = libmpitrain_all.la $(CHECK_LIBS)
endif
# atomic whole-file writes (token shards, llm.c model files)
libmpitrain_all_la_SOURCES += src/core/atomic_file.h src/core/atomic_file.c
# the CPU ops' thread pool (the non-GEMM kernels on every CPU thread)
libmpitrain_all_la_SOURCES += src/core/cpu/pool.h src/core/cpu/cpu_pool.c
if HAVE_CHECK
check_PROGRAMS += tests/test_cpu_threads
TESTS += tests/test_cpu_threads
tests_test_cpu_threads_SOURCES = tests/test_cpu_threads.c
tests_test_cpu_threads_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_cpu_threads_LDADD = libmpitrain_all.la $(CHECK_LIBS)
endif
# bf16 compute (include/mpitrain/ops_bf16.h): GEMM, convolutions, the tape's precision
if HAVE_CHECK
check_PROGRAMS += tests/test_bf16
TESTS += tests/test_bf16
tests_test_bf16_SOURCES = tests/test_bf16.c
tests_test_bf16_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_bf16_LDADD = libmpitrain_all.la $(CHECK_LIBS) -lm
endif
# The fp32 CPU GEMM through oneDNN (src/core/cpu/sgemm_dnnl.c) against OpenBLAS, and its routing
if HAVE_ONEDNN
if HAVE_CHECK
check_PROGRAMS += tests/test_sgemm_dnnl
TESTS += tests/test_sgemm_dnnl
tests_test_sgemm_dnnl_SOURCES = tests/test_sgemm_dnnl.c
tests_test_sgemm_dnnl_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS) -fopenmp
tests_test_sgemm_dnnl_LDADD = libmpitrain_all.la $(CHECK_LIBS) -lm
endif
endif
# --gemm tune's table, recording, timing and cache file (src/core/cpu/gemm_tune.c)
if HAVE_CHECK
check_PROGRAMS += tests/test_gemm_tune
TESTS += tests/test_gemm_tune
tests_test_gemm_tune_SOURCES = tests/test_gemm_tune.c
tests_test_gemm_tune_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_gemm_tune_LDADD = libmpitrain_all.la $(CHECK_LIBS)
endif
# one table of op cases run on every CPU instruction-set path and every device
# backend against the CPU reference (the CUDA half: tests/test_backend_ops_cuda.sh)
if HAVE_CHECK
check_PROGRAMS += tests/test_backend_ops
TESTS += tests/test_backend_ops tests/test_backend_ops_cuda.sh
EXTRA_DIST += tests/test_backend_ops_cuda.sh
tests_test_backend_ops_SOURCES = tests/test_backend_ops.c tests/backend_op_cases.c \
	tests/backend_ops.h
tests_test_backend_ops_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_backend_ops_LDADD = libmpitrain_all.la $(CHECK_LIBS) -lm
endif
# the op tests rerun on each CPU instruction-set path (MPT_CPU_ISA) the CPU offers
TESTS += tests/test_isa_avx512.sh tests/test_isa_avx2.sh tests/test_isa_baseline.sh
EXTRA_DIST += tests/isa_paths.sh tests/test_isa_avx512.sh tests/test_isa_avx2.sh \
	tests/test_isa_baseline.sh
# The library's threads and signals (src/core/threads.c): the CPU GEMMs under a signal storm
# (oneDNN's fp32 kernels move the stack pointer into the heap), and every thread the library
# starts blocks the signals meant for the process
if HAVE_CHECK
check_PROGRAMS += tests/test_signals
TESTS += tests/test_signals
tests_test_signals_SOURCES = tests/test_signals.c
tests_test_signals_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_signals_LDADD = libmpitrain_all.la $(CHECK_LIBS)
endif
check_PROGRAMS += tests/test_llama_ops
TESTS += tests/test_llama_ops
tests_test_llama_ops_SOURCES = tests/test_llama_ops.c
tests_test_llama_ops_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_llama_ops_LDADD = libmpitrain_all.la $(CHECK_LIBS) -lm
