#!/bin/sh
# The op tests on the CPU's avx2 path (tests/isa_paths.sh; SKIP where the CPU lacks
# it or takes it by itself).
exec "$(dirname "$0")/isa_paths.sh" avx2
