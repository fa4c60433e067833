# tests of the Llama model (src/nn/llama.c, src/nn/llama_ops.c)

# The PyTorch oracle (skipped without Debian's python3-torch): a helper program writes the
# parameters and mpitrain's results, tests/llama_torch.py compares.
EXTRA_DIST += tests/test_llama_torch.sh tests/llama_torch.py
check_PROGRAMS += tests/llama_torch_helper
TESTS += tests/test_llama_torch.sh
tests_llama_torch_helper_SOURCES = tests/llama_torch_helper.c
tests_llama_torch_helper_LDADD = libmpitrain_all.la -lm
