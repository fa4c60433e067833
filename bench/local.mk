# bench: the benchmark harness (bench/README.md). mpt_allreduce_bench is installed with the
# trainer; the scripts run from the source tree and find the programs in a build folder.
bin_PROGRAMS += mpt_allreduce_bench
mpt_allreduce_bench_SOURCES = bench/allreduce.c bench/allreduce_opts.c bench/allreduce_opts.h \
	bench/bench_util.c bench/bench_util.h
mpt_allreduce_bench_LDADD = libmpitrain_all.la
if HAVE_NCCL
# The raw NCCL baseline (--backend nccl).
mpt_allreduce_bench_SOURCES += bench/raw_nccl.c bench/raw_nccl.h
endif

# The benchmark's own correctness checks at small sizes under mpirun (no timing).
TESTS += bench/test_allreduce_bench.sh
# compare_gpt.sh at a tiny size: the same model on both sides, the summary's arithmetic (against
# Debian's PyTorch when installed, else mpitrain alone).
TESTS += bench/test_compare_gpt.sh
# mpt_gemm_bench's backends and mpt_fused_bench compute what they time (no timing checked).
TESTS += tests/test_bench_backends.sh
EXTRA_DIST += tests/test_bench_backends.sh

EXTRA_DIST += bench/README.md bench/bench_lib.sh bench/train_bench.sh bench/compare_torch.sh bench/zero_stages.sh \
	bench/plot.sh bench/summarize.py bench/scaling_model.py bench/torch_ref.py bench/run_all.sh \
	bench/test_allreduce_bench.sh bench/compare_gpt.sh bench/torch_gpt_ref.py \
	bench/summarize_gpt.py bench/make_token_shard.py bench/test_compare_gpt.sh bench/gpt_fortunes.sh \
	bench/raw_nccl.c bench/raw_nccl.h bench/results/README.md bench/gpu-check.sh \
	bench/gpu_gpt_torch.py bench/torch_gemm.py bench/gemm_blis.c bench/gemm_xsmm.c bench/comm_yield.sh bench/gemm_tune.sh \
	bench/ckpt_stall.sh bench/flight_recorder_cost.sh bench/results_readme.py

if HAVE_ONEDNN
# The fp32 GEMMs of a GPT step on OpenBLAS against oneDNN (not installed: a measuring tool).
noinst_PROGRAMS += mpt_gemm_bench
mpt_gemm_bench_SOURCES = bench/gemm_bench.c
mpt_gemm_bench_LDADD = libmpitrain_all.la
# Set outside the conditional: a per-target CPPFLAGS replaces AM_CPPFLAGS, so a value set only
# when BLIS is found left the include paths out of builds without it.
mpt_gemm_bench_CPPFLAGS = $(AM_CPPFLAGS)
if HAVE_BLIS
# BLIS defines cblas_sgemm too: OpenBLAS must come first on the link line, so that the openblas
# column and mpt_op_gemm call OpenBLAS's (the bench prints which one it got). libtool moves a
# plain -lopenblas to the last of its places on the line; a -Wl, flag in LDFLAGS it leaves at
# the start, so OpenBLAS is the first library the program needs, and the first one searched.
mpt_gemm_bench_SOURCES += bench/gemm_blis.c
mpt_gemm_bench_CPPFLAGS += -DMPT_BENCH_BLIS
mpt_gemm_bench_LDFLAGS = -Wl,--no-as-needed,-lopenblas
mpt_gemm_bench_LDADD += $(BLIS_LIBS)
endif
if HAVE_XSMM
mpt_gemm_bench_SOURCES += bench/gemm_xsmm.c
mpt_gemm_bench_CPPFLAGS += -DMPT_BENCH_XSMM
mpt_gemm_bench_LDADD += $(XSMM_LIBS)
endif
endif

# The fused GPT ops (ops_gpt.h) against the unfused ops they replace (not installed).
noinst_PROGRAMS += mpt_fused_bench
mpt_fused_bench_SOURCES = bench/fused_bench.c
mpt_fused_bench_LDADD = libmpitrain_all.la

# The fp32 causal attention: the reference against the fused op (not installed: a measuring tool).
noinst_PROGRAMS += mpt_attn_bench
mpt_attn_bench_SOURCES = bench/attn_bench.c
mpt_attn_bench_LDADD = libmpitrain_all.la

# The logits of a safetensors model (GPT-2 or Llama) for bench/hf_interop.sh (not installed).
noinst_PROGRAMS += mpt_st_logits
mpt_st_logits_SOURCES = bench/st_logits.c
mpt_st_logits_LDADD = libmpitrain_all.la
EXTRA_DIST += bench/hf_interop.sh bench/hf_interop.py
