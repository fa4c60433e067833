#!/bin/sh
# Builds the libFuzzer targets fuzz_idx, fuzz_ckpt, fuzz_cli, fuzz_llmc, fuzz_safetensors (and the seed generator
# make_seeds) with clang, AddressSanitizer and UndefinedBehaviorSanitizer, straight from the
# sources: no configure run is needed.
#
#   fuzz/build.sh [OUTDIR]        (default OUTDIR: ./fuzz-build under the current directory)
#
# The library's sources (all of src/ but the CUDA backend and the program) are compiled once
# into OUTDIR/obj; only the parsers under test (src/data/idx.c, src/data/dataset.c, src/ckpt/*.c,
# src/cli/options.c) carry libFuzzer's coverage instrumentation, so the fuzzer's feedback is
# about them. Every object has ASan and UBSan (UBSan without recovery: undefined behaviour
# aborts, which libFuzzer reports as a crash). A generated OUTDIR/config.h stands in for the
# one configure writes (options.c needs PACKAGE_VERSION). Objects are rebuilt only when their
# source, or any header of include/ or src/, is newer.
#
# Needs clang with libFuzzer (Debian: apt-get install clang libclang-rt-14-dev, or the
# libclang-rt-N-dev of the installed clang), mpicc (Open MPI or MPICH: for mpi.h and -lmpi),
# OpenBLAS and zlib. Exits 77 when clang or libFuzzer is missing, so tests can skip.
# Environment: FUZZ_CC (default clang), FUZZ_JOBS (parallel compiles, default 2), MPICC.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
top=$(dirname "$here")
out=${1:-$PWD/fuzz-build}
cc=${FUZZ_CC:-clang}
jobs=${FUZZ_JOBS:-2}
mpicc=${MPICC:-mpicc}

mkdir -p "$out/obj"
out=$(cd "$out" && pwd)

# ---- toolchain probe ----
if ! command -v "$cc" >/dev/null 2>&1; then
  echo "fuzz/build.sh: $cc not found (apt-get install clang libclang-rt-14-dev)" >&2
  exit 77
fi
probe="$out/probe"
printf 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { (void)d; (void)n; return 0; }\n' \
  > "$probe.c"
if ! "$cc" -fsanitize=fuzzer,address,undefined "$probe.c" -o "$probe" >"$probe.log" 2>&1; then
  echo "fuzz/build.sh: $cc cannot link -fsanitize=fuzzer,address,undefined (libFuzzer missing:" \
    "apt-get install libclang-rt-14-dev, matching the clang version):" >&2
  cat "$probe.log" >&2
  exit 77
fi
rm -f "$probe" "$probe.c" "$probe.log"

# ---- dependencies: MPI through the wrapper's own flags, OpenBLAS, zlib ----
if ! command -v "$mpicc" >/dev/null 2>&1; then
  echo "fuzz/build.sh: $mpicc not found (apt-get install libopenmpi-dev)" >&2
  exit 1
fi
if mpi_cflags=$("$mpicc" --showme:compile 2>/dev/null) &&
  mpi_libs=$("$mpicc" --showme:link 2>/dev/null); then
  : # Open MPI
elif mpi_cflags=$("$mpicc" -compile_info 2>/dev/null | cut -d' ' -f2- | sed 's/ -c / /') &&
  mpi_libs=$("$mpicc" -link_info 2>/dev/null | cut -d' ' -f2-); then
  : # MPICH (approximate: its flags with the compiler name cut off)
else
  echo "fuzz/build.sh: cannot get the compile and link flags of $mpicc" >&2
  exit 1
fi
blas_cflags=$(pkg-config --cflags openblas 2>/dev/null || true)
blas_libs=$(pkg-config --libs openblas 2>/dev/null || echo -lopenblas)
zlib_libs=$(pkg-config --libs zlib 2>/dev/null || echo -lz)

version=$(sed -n 's/^AC_INIT(\[mpitrain\], *\[\([^]]*\)\].*/\1/p' "$top/configure.ac")
cat >"$out/config.h.new" <<EOF
/* Written by fuzz/build.sh in place of configure's config.h. */
#define PACKAGE "mpitrain"
#define PACKAGE_NAME "mpitrain"
#define PACKAGE_VERSION "${version:-unknown}"
#define VERSION PACKAGE_VERSION
EOF
if cmp -s "$out/config.h.new" "$out/config.h"; then rm -f "$out/config.h.new"; else mv "$out/config.h.new" "$out/config.h"; fi

san="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
cflags="-std=c11 -D_GNU_SOURCE -g -O1 -pthread -Wall -Wextra -Wno-unused-command-line-argument"
cppflags="-I$out -I$top/include -I$top/src -I$top/fuzz $mpi_cflags $blas_cflags"
# The parsers under test: coverage feedback for libFuzzer.
covered="src/data/idx.c src/data/dataset.c src/ckpt/read.c src/ckpt/write.c src/ckpt/dir.c src/cli/options.c src/data/tokens.c src/data/token_data.c src/ckpt/gpt_file.c src/ckpt/json.c src/ckpt/safetensors.c src/ckpt/gpt_safetensors.c"

# ---- compile (in parallel, only what is out of date) ----
stamp="$out/obj/.headers"
if [ ! -f "$stamp" ] || [ -n "$(find "$top/include" "$top/src" "$out/config.h" -name '*.h' \
  -newer "$stamp" 2>/dev/null | head -n 1)" ]; then
  rm -f "$out"/obj/*.o
fi
touch "$stamp"
# The library's C sources as the automake build lists them (libmpitrain_all_la_SOURCES in the
# fragments Makefile.am includes), leaving out what is under "if HAVE_CUDA" / "if HAVE_NCCL" /
# "if HAVE_ONEDNN" (this config.h defines none of them):
# a file present in src/ but not yet in the build is not compiled here either.
# shellcheck disable=SC2013 # the include lines hold one path each
sources=$(cd "$top" && for mk in $(sed -n 's/^include  *//p' Makefile.am); do
  [ -f "$mk" ] || continue
  awk '
    /^if / { depth++; cond[depth] = $2; skip[depth] = ($2 ~ /^(HAVE_CUDA|HAVE_NCCL|HAVE_ONEDNN)$/); next }
    /^else/ { if (depth) skip[depth] = (cond[depth] ~ /^!(HAVE_CUDA|HAVE_NCCL|HAVE_ONEDNN)$/); next }
    /^endif/ { if (depth) depth--; next }
    {
      off = 0
      for (i = 1; i <= depth; i++) if (skip[i]) off = 1
      if ($0 ~ /^libmpitrain_all_la_SOURCES[ \t]*\+?=/) collecting = 1
      if (collecting && !off)
        for (i = 1; i <= NF; i++) if ($i ~ /\.c$/) print $i
      if ($0 !~ /\\$/) collecting = 0
    }' "$mk"
done)
sources="$sources src/cli/options.c"
list="$out/compile.list"
: >"$list"
objs=""
for src in $sources; do
  obj="$out/obj/$(echo "$src" | tr '/' '_' | sed 's/\.c$/.o/')"
  objs="$objs $obj"
  flags="$san"
  case " $covered " in *" $src "*) flags="$san -fsanitize=fuzzer-no-link" ;; esac
  if [ ! -f "$obj" ] || [ -n "$(find "$top/$src" -newer "$obj")" ]; then
    printf '%s\t%s\t%s\n' "$top/$src" "$obj" "$flags" >>"$list"
  fi
done
export cc cflags cppflags
if [ -s "$list" ]; then
  echo "fuzz/build.sh: compiling $(wc -l <"$list") library sources into $out/obj"
  # shellcheck disable=SC2016
  tr '\n' '\0' <"$list" | xargs -0 -n 1 -P "$jobs" sh -c '
    IFS="$(printf "\t")"; set -- $1; IFS=" "
    # shellcheck disable=SC2086
    $cc $cflags $3 $cppflags -c "$1" -o "$2.tmp" && mv "$2.tmp" "$2"' sh
fi
libs="$blas_libs $zlib_libs $mpi_libs -lm -lpthread"

# ---- link ----
for t in fuzz_idx fuzz_ckpt fuzz_cli fuzz_llmc fuzz_safetensors; do
  # shellcheck disable=SC2086
  $cc $cflags $san -fsanitize=fuzzer $cppflags "$here/$t.c" $objs $libs -o "$out/$t"
done
# shellcheck disable=SC2086
$cc $cflags $san $cppflags "$here/make_seeds.c" $objs $libs -o "$out/make_seeds"
echo "fuzz/build.sh: built $out/fuzz_idx $out/fuzz_ckpt $out/fuzz_cli $out/fuzz_llmc $out/fuzz_safetensors $out/make_seeds"
