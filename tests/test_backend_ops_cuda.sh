#!/bin/sh
# The op table (tests/test_backend_ops.c) on the CUDA backend against the CPU: every op of the
# table on the first GPU. Exits 77 (automake's SKIP) where no GPU is present.
exec ./tests/test_backend_ops cuda
