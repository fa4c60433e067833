# Fuzzing (fuzz/): libFuzzer targets for the IDX reader, the checkpoint loader and the
# command-line parser, built by fuzz/build.sh with clang (independently of this build's
# compiler) and run by tests/test_fuzz.sh for MPT_FUZZ_SECONDS each (default 60; e.g.
# `make check TESTS=tests/test_fuzz.sh MPT_FUZZ_SECONDS=600` for a long run). Skipped (77)
# without clang + libFuzzer.
TESTS += tests/test_fuzz.sh
EXTRA_DIST += tests/test_fuzz.sh tests/lsan.supp fuzz/build.sh fuzz/run.sh fuzz/fuzz_common.h fuzz/fuzz_idx.c \
	fuzz/fuzz_ckpt.c fuzz/fuzz_cli.c fuzz/fuzz_llmc.c fuzz/fuzz_safetensors.c fuzz/make_seeds.c fuzz/README.md fuzz/corpus

# The fuzz build directory of tests/test_fuzz.sh.
clean-local: clean-fuzz
clean-fuzz:
	-rm -rf fuzz-build
.PHONY: clean-fuzz

# Sanitizer runs (configure --enable-sanitizers): LeakSanitizer stays on for every test, with
# Open MPI's and OpenBLAS's own never-freed memory suppressed (tests/lsan.supp). The slow
# unwinder (fast_unwind_on_malloc=0) is needed for that: those libraries have no frame
# pointers, and with the fast one a leak's stack stops inside them, unmatched. Values already
# in the environment win. Harmless for a build without sanitizers (nothing reads them).
AM_TESTS_ENVIRONMENT = \
	ASAN_OPTIONS="$${ASAN_OPTIONS-fast_unwind_on_malloc=0}"; export ASAN_OPTIONS; \
	LSAN_OPTIONS="$${LSAN_OPTIONS-suppressions=$(abs_top_srcdir)/tests/lsan.supp:print_suppressions=0}"; \
	export LSAN_OPTIONS; \
	UBSAN_OPTIONS="$${UBSAN_OPTIONS-print_stacktrace=1:halt_on_error=1}"; export UBSAN_OPTIONS;
