# bench: the benchmark harness (bench/README.md). mpt_allreduce_bench is installed with the
# trainer; the scripts run from the source tree (they find the programs in a build folder).
bin_PROGRAMS += mpt_allreduce_bench
mpt_allreduce_bench_SOURCES = bench/allreduce.c bench/bench_util.c bench/bench_util.h
mpt_allreduce_bench_LDADD = libmpitrain_all.la

EXTRA_DIST += bench/README.md bench/torch_ref.py bench/train_bench.sh bench/compare_torch.sh \
	bench/plot.sh bench/scaling_model.py bench/bench_lib.sh bench/results/README.md
