# Fuzzing (fuzz/): libFuzzer targets for the IDX reader, the checkpoint loader and the
# command-line parser, built by fuzz/build.sh with clang (independently of this build's
# compiler) and run by tests/test_fuzz.sh for MPT_FUZZ_SECONDS each (default 60; e.g.
# `make check TESTS=tests/test_fuzz.sh MPT_FUZZ_SECONDS=600` for a long run). Skipped (77)
# without clang + libFuzzer.
TESTS += tests/test_fuzz.sh
EXTRA_DIST += tests/test_fuzz.sh fuzz/build.sh fuzz/run.sh fuzz/fuzz_common.h fuzz/fuzz_idx.c \
	fuzz/fuzz_ckpt.c fuzz/fuzz_cli.c fuzz/make_seeds.c fuzz/README.md fuzz/corpus

# The fuzz build directory of tests/test_fuzz.sh.
clean-local: clean-fuzz
clean-fuzz:
	-rm -rf fuzz-build
.PHONY: clean-fuzz
