#!/bin/bash
# The GPU check: on a bare machine with one GPU (an H200 lent for a short
# lease: about 15 minutes of device time in all, at most 10 per command), with PyTorch and a
# CUDA toolkit but no MPI, no OpenBLAS, no Check, maybe no autotools and no package mirror, in
# under 8 minutes (GPU_CHECK_BUDGET_S, default 470 s: every step's limit is cut to what is left),
# in stages that each report as they finish (a "STAGE name: ok|FAIL|skip after N s" line in
# summary.txt at once, so a run cut short still yields its figures; a table of the stages at the
# end, also on an early exit):
#   glibc        the image's glibc against what the carried packages need (Debian 12's libevent,
#                which Open MPI links, needs 2.36): older, the image's own Open MPI is used when
#                there is one, else the check stops here saying so;
#   prefix       unpack the carried Open MPI / OpenBLAS / Check / zlib .deb files into a private
#                prefix (dpkg -x, never into /); PATH, LD_LIBRARY_PATH, OPAL_PREFIX, PMIx;
#                OMPI_MCA_btl_vader_single_copy_mechanism=none (a sandbox may refuse
#                process_vm_readv between ranks of one machine);
#   cuda         the toolkit, cuBLAS and NCCL (toolkit, /usr, or PyTorch's nvidia wheels);
#   configure    the carried, pre-generated configure (no autotools needed), with CUDA;
#   build-tests  only the CUDA test programs and mpitrain (and the library);
#   cuda-tests   FIRST, the CUDA tests, which must PASS there (a SKIP is a failure, except in a
#                dry run): test_backend_ops_cuda.sh (the op table: every op against the CPU,
#                tests/test_backend_ops.c), test_cuda_ops (convolutions through cuDNN against
#                im2col, bad labels), test_cuda_stream (streams, events, the allocator),
#                test_comm_cuda (NCCL world of 1, DDP on CUDA), test_dp_cuda (DataParallel on CUDA against one
#                CPU process), test_comm_cuda_np2.mpi (2 ranks on the GPU, staged MPI backend),
#                test_cuda_gpt_ops and test_cuda_gpt (the transformer layers and a tiny GPT on the
#                GPU against the CPU), test_train_gpt_cuda.sh (`mpitrain train --model gpt
#                --device cuda` against --device cpu: SGD, AdamW, --accumulate, resume),
#                test_cuda_bf16 (the bf16 GEMM through cublasGemmEx);
#   build        the trainer and the all-reduce benchmark;
#   train        `cnn` on the GPU (mpirun -np 1, --device cuda), GPU_CHECK_EPOCH_STEPS steps
#                (default 300) of batch 64; samples/s;
#   allreduce-mpi  mpt_allreduce_bench, staged MPI backend, 2 ranks on one GPU (no 1-rank NCCL
#                figure: with one rank its bus bandwidth is 0 by definition);
#   torch        the same model, batch and number of steps in PyTorch on the GPU
#                (bench/torch_ref.py --device cuda --warmup 0 --sync-every-step: like the
#                trainer, every step counted and the loss read back every step); both samples/s;
#   gpt-data     byte-level token shards of a generated text (awk, 200 kB; mpitrain tokenize);
#   gpt-mini, gpt2  `mpitrain train --model gpt-mini|gpt2 --device cuda` (mpirun -np 1): gpt-mini
#                B 8 x T 256 for 30 steps, gpt2 (124M) B 4 x T 1024 (4096 tokens per step) for
#                10 steps, unshuffled, constant lr, AdamW + clipping; tokens/s over all steps
#                and after the first one (from the per-step log), the per-step breakdown and the
#                fraction of cuBLAS's SGEMM rate reached;
#   torch-gpt-mini, torch-gpt2  the same models, shards, batches and steps in PyTorch on the GPU
#                (bench/gpu_gpt_torch.py: the oracle's GPT module of tests/gpt_torch.py, its
#                attention materialised as mpitrain's), then torch-gpt2-sdpa with PyTorch's
#                fused attention; tokens/s of each and the ratio mpitrain / PyTorch.
#
# Usage:
#   bench/gpu-check.sh prepare [BUILD_DIR]   HERE (a Debian 12 machine with apt and autotools):
#       downloads the .deb files (apt-get download) into .gpu-carry/debs and writes the newest
#       glibc symbol version their libraries need into .gpu-carry/glibc-needed, copies the
#       generated autotools files (configure, Makefile.in, aclocal.m4, config.h.in,
#       build-aux/) into .gpu-carry/gen (refreshing them first with `make -C BUILD_DIR
#       Makefile` or autoreconf when a source is newer), copies the Fashion-MNIST .gz files
#       into .gpu-carry/data when they fit, and adds /.gpu-carry/ to .git/info/exclude. Prints
#       the size that will travel.
#   bench/gpu-check.sh run                   ON THE GPU MACHINE, from the repository root, with
#       .gpu-carry carried along (device tool: carry [".gpu-carry"], command
#       "bash bench/gpu-check.sh run", timeout_s 540). Writes under $OUT when set (else
#       .gpu-check-out/): gpu-check.log (everything), summary.txt (the stages and figures),
#       tests.log, train.json, allreduce_mpi.txt, torch.json.
#   bench/gpu-check.sh gpt BUILD_DIR         only the GPT stages, with BUILD_DIR's mpitrain and
#       the environment as it is (tests/test_gpu_check.sh runs them on the CPU with a tiny
#       GPT: GPU_CHECK_GPT_DEVICE=cpu GPU_CHECK_GPT_TINY=1).
# Environment (run): GPU_CHECK_BUDGET_S (default 470); GPU_CHECK_EPOCH_STEPS=N training steps
#   on each side (default 300); GPU_CHECK_ALLOW_NO_GPU=1 turns the GPU requirement off (a dry
#   run of the whole script on a machine without a GPU: the CUDA tests SKIP, the GPU stages are
#   skipped, the stage summary is printed); GPU_CHECK_JOBS (make -j, default: all cores);
#   GPU_CHECK_PYTHON (default python3) runs the PyTorch references; GPU_CHECK_GPT_DEVICE
#   (default cuda) and GPU_CHECK_GPT_TINY=1 (a 2-layer GPT of 32 channels, T 32, bytes, in
#   place of the presets) are for testing the GPT stages.
# Exit status: 0 when every stage passed, 1 when one failed (the summary names it), 2 on usage.
set -u
set -o pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CARRY=$ROOT/.gpu-carry
MODE=${1:-}

# Packages from Debian 12 (bookworm) that a bare Ubuntu/Debian image with CUDA lacks: Open MPI
# 4.1 and its run-time libraries (libc, libgcc, libstdc++ and zlib's run time are assumed),
# OpenBLAS (pthread flavour) with its Fortran run time, Check and subunit, zlib's headers.
DEBS="openmpi-bin openmpi-common libopenmpi3 libopenmpi-dev libpmix2 libevent-core-2.1-7
libevent-pthreads-2.1-7 libhwloc15 libfabric1 libibverbs1 libnl-3-200 libnl-route-3-200
librdmacm1 libpsm-infinipath1 libpsm2-2 libucx0 libnuma1 libmunge2 libatomic1 libudev1
libopenblas0-pthread libopenblas-pthread-dev libgfortran5 libquadmath0 check libsubunit0
libsubunit-dev zlib1g-dev zlib1g"
GEN_FILES="configure Makefile.in aclocal.m4 config.h.in"
DATA_FILES="train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz
t10k-labels-idx1-ubyte.gz"
MAX_TRAVEL_MIB=60 # the device tool takes 64 MiB of working tree and carried files

usage() { # STATUS: 0 for --help (to stdout), 2 for bad usage (to stderr)
  if [ "${1:-2}" -eq 0 ]; then
    sed -n '2,/^set -u/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
  else
    sed -n '2,/^set -u/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
  fi
  exit "${1:-2}"
}

# ---------------------------------------------------------------------------------------------
# prepare (here)

prepare() {
  local build=${1:-}
  mkdir -p "$CARRY/debs" "$CARRY/gen" "$CARRY/data" || exit 1
  if [ -d "$ROOT/.git/info" ] && ! grep -qx '/.gpu-carry/' "$ROOT/.git/info/exclude" 2>/dev/null
  then
    echo '/.gpu-carry/' >>"$ROOT/.git/info/exclude"
  fi

  echo "== .deb files -> $CARRY/debs"
  rm -f "$CARRY"/debs/*.deb
  # shellcheck disable=SC2086 # DEBS is a list of words
  if ! (cd "$CARRY/debs" && apt-get download $DEBS >/dev/null 2>&1); then
    echo "apt-get download failed; running apt-get update once"
    apt-get update -qq >/dev/null || { echo "apt-get update failed" >&2; exit 1; }
    (cd "$CARRY/debs" && apt-get download $DEBS) || { echo "apt-get download failed" >&2; exit 1; }
  fi
  ls "$CARRY/debs"
  # The newest glibc symbol version the carried libraries and programs need (run checks it
  # against the image's first).
  local tmpx need
  tmpx=$(mktemp -d)
  for f in "$CARRY"/debs/*.deb; do dpkg -x "$f" "$tmpx" 2>/dev/null; done
  need=$(find "$tmpx" -type f \( -name '*.so*' -o -path '*/bin/*' \) -exec objdump -T {} + 2>/dev/null |
         grep -oE 'GLIBC_[0-9]+\.[0-9]+' | sed 's/GLIBC_//' | sort -t. -k1,1n -k2,2n | tail -1)
  rm -rf "$tmpx"
  echo "${need:-2.36}" >"$CARRY/glibc-needed"
  echo "the carried packages need glibc >= ${need:-2.36} (.gpu-carry/glibc-needed)"

  echo "== generated autotools files -> $CARRY/gen"
  local stale=0 f src
  for f in $GEN_FILES; do
    [ -e "$ROOT/$f" ] && [ ! "$ROOT/configure.ac" -nt "$ROOT/$f" ] || stale=1
  done
  for src in "$ROOT/Makefile.am" "$ROOT"/src/*/local.mk "$ROOT"/src/core/cuda/local.mk \
             "$ROOT"/tests/*.mk "$ROOT"/bench/local.mk; do
    [ "$src" -nt "$ROOT/Makefile.in" ] && stale=1
  done
  if [ "$stale" = 1 ]; then
    if [ -n "$build" ] && [ -f "$build/Makefile" ]; then
      echo "refreshing through $build (make Makefile)"
      make -C "$build" Makefile >/dev/null || exit 1
    else
      echo "refreshing with autoreconf -fi"
      (cd "$ROOT" && autoreconf -fi >/dev/null) || exit 1
    fi
  fi
  rm -rf "$CARRY/gen" && mkdir -p "$CARRY/gen"
  for f in $GEN_FILES; do cp -p "$ROOT/$f" "$CARRY/gen/$f" || exit 1; done
  cp -pr "$ROOT/build-aux" "$CARRY/gen/build-aux" || exit 1
  mkdir -p "$CARRY/gen/m4" && cp -p "$ROOT"/m4/*.m4 "$CARRY/gen/m4/" 2>/dev/null

  echo "== Fashion-MNIST -> $CARRY/data"
  rm -f "$CARRY"/data/*.gz
  local ddir=/usr/share/datasets/fashion-mnist tree_kib carry_kib
  tree_kib=$(cd "$ROOT" && { git ls-files -z; git ls-files -z -o --exclude-standard; } |
             xargs -0 du -ck 2>/dev/null | awk 'END {print $1}')
  carry_kib=$(du -sk "$CARRY" | awk '{print $1}')
  local data_kib=0
  for f in $DATA_FILES; do [ -f "$ddir/$f" ] && data_kib=$((data_kib + $(du -k "$ddir/$f" | awk '{print $1}'))); done
  if [ "$data_kib" -gt 0 ] && [ $(( (tree_kib + carry_kib + data_kib) / 1024 )) -lt "$MAX_TRAVEL_MIB" ]; then
    for f in $DATA_FILES; do cp -p "$ddir/$f" "$CARRY/data/" || exit 1; done
  else
    echo "(not copied: not installed or too large to travel; the check trains on --synthetic data)"
  fi
  carry_kib=$(du -sk "$CARRY" | awk '{print $1}')
  echo "== travels: working tree $((tree_kib / 1024)) MiB + .gpu-carry $((carry_kib / 1024)) MiB" \
       "(limit 64 MiB)"
  echo "device tool: run(carry=[\".gpu-carry\"], command=\"bash bench/gpu-check.sh run\", timeout_s=540)"
}

# ---------------------------------------------------------------------------------------------
# run (on the GPU machine)

OUTDIR=${OUT:-$ROOT/.gpu-check-out}
LOG=$OUTDIR/gpu-check.log
SUMMARY=$OUTDIR/summary.txt
FAILED=""
T_START=$(date +%s.%N)
BUDGET_S=${GPU_CHECK_BUDGET_S:-470} # the whole check: under 8 minutes of a 10-minute command
STAGES=""                           # "name status seconds note" lines, in order

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN {printf "%.1f", b - a}'; }
# Seconds left of the budget (integer, may be negative).
left_s() { awk -v a="$T_START" -v b="$(now)" -v t="$BUDGET_S" 'BEGIN {printf "%d", t - (b - a)}'; }
say() { echo "$*" | tee -a "$SUMMARY"; }
fail() {
  FAILED="$FAILED $1"
  say "FAIL $1: $2"
}

# stage NAME STATUS T0 [NOTE]: one finished stage, reported at once (summary.txt is complete
# up to the last finished stage even when the lease ends mid-check).
stage() {
  local secs
  secs=$(elapsed "$3")
  STAGES="$STAGES$1 $2 $secs ${4:-}
"
  say "STAGE $1: $2 after ${secs} s${4:+ ($4)} [$(left_s) s of ${BUDGET_S} s left]"
}

stage_summary() {
  [ -n "$STAGES" ] || return 0
  say "---- stages (budget ${BUDGET_S} s, total $(elapsed "$T_START") s)"
  printf '%s' "$STAGES" | while read -r name status secs note; do
    say "$(printf '  %-16s %-5s %7s s  %s' "$name" "$status" "$secs" "$note")"
  done
}

# step NAME TIMEOUT_S COMMAND...: runs COMMAND with a timeout, cut to what is left of the
# budget (a step that would start with under 10 s left is not started: status 124), prints
# its start, status and time on fd 3 (the log); returns its status.
step() {
  local name=$1 limit=$2 t0 rc left
  shift 2
  left=$(( $(left_s) - 5 ))
  if [ "$left" -lt 10 ]; then
    echo "===== $name: not started, the budget of ${BUDGET_S} s is spent" >&3
    return 124
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  t0=$(now)
  echo "===== $name ($(date -u +%H:%M:%S), limit ${limit}s): $*" >&3
  timeout -k 5 "$limit" "$@"
  rc=$?
  echo "===== $name: exit $rc after $(elapsed "$t0") s" >&3
  [ $rc -eq 124 ] && echo "===== $name: TIMED OUT" >&3
  return $rc
}

have_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q GPU; }

# "2.36" -> 236 (minor < 100).
glibc_num() { echo "$1" | awk -F. '{printf "%d", $1 * 100 + $2}'; }

# The image's glibc against what the carried packages need (prepare wrote it; Debian 12's
# libevent, which Open MPI links, needs 2.36 for arc4random). Too old: a system Open MPI (HPC
# images carry one) is used instead of the carried one, else the check stops here, saying so.
check_glibc() {
  local have need
  have=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')
  [ -n "$have" ] || have=$(ldd --version 2>/dev/null | head -1 | grep -oE '[0-9]+\.[0-9]+$')
  need=$(cat "$CARRY/glibc-needed" 2>/dev/null)
  [ -n "$need" ] || need=2.36
  SYSTEM_MPI=""
  if [ -n "$have" ] && [ "$(glibc_num "$have")" -ge "$(glibc_num "$need")" ]; then
    say "glibc $have: the carried Debian 12 packages (need glibc >= $need) can run"
    return 0
  fi
  local d
  for d in "$(dirname "$(command -v mpicc 2>/dev/null || echo /none/x)")" /opt/hpcx/ompi/bin \
           /usr/local/mpi/bin /opt/openmpi/bin /usr/mpi/gcc/openmpi*/bin; do
    if [ -x "$d/mpicc" ] && [ -x "$d/mpirun" ]; then SYSTEM_MPI=$d; break; fi
  done
  if [ -n "$SYSTEM_MPI" ]; then
    say "glibc ${have:-unknown} < $need: the carried Open MPI cannot run here; using the image's ($SYSTEM_MPI)"
    return 0
  fi
  say "glibc ${have:-unknown} < $need, which the carried Debian 12 packages need (libevent for Open MPI), and the image has no Open MPI of its own"
  return 1
}

# Unpacks the .deb files into $PFX and sets up the environment for Open MPI, OpenBLAS, Check.
setup_prefix() {
  PFX=/tmp/mpt-gpu-prefix
  rm -rf "$PFX" && mkdir -p "$PFX/bin" || return 1
  local f n=0
  for f in "$CARRY"/debs/*.deb; do
    [ -f "$f" ] || continue
    # With the image's Open MPI, the carried one stays packed (it could not run anyway).
    if [ -n "${SYSTEM_MPI:-}" ]; then
      case $(basename "$f") in openmpi* | libopenmpi* | libpmix* | libevent* | libhwloc* | \
        libfabric* | libucx* | libpsm* | libibverbs* | librdmacm*) continue ;; esac
    fi
    dpkg -x "$f" "$PFX" || { echo "dpkg -x $f failed"; return 1; }
    n=$((n + 1))
  done
  [ "$n" -gt 0 ] || { echo "no .deb files in $CARRY/debs: run 'bench/gpu-check.sh prepare' first"; return 1; }
  # Absolute links inside the packages (libz.so -> /lib/...) point into the prefix instead.
  local link target
  while IFS= read -r link; do
    target=$(readlink "$link")
    case $target in /*) [ -e "$PFX$target" ] && ln -sfn "$PFX$target" "$link" ;; esac
  done < <(find "$PFX" -type l)
  local L=$PFX/usr/lib/x86_64-linux-gnu
  # Base libraries the system has too (zlib, libudev, libgfortran...): keep the system's (as
  # new or newer, and loaded by the system's own tools, which run with this LD_LIBRARY_PATH).
  local lib so real
  for lib in "$L"/lib*.so.* "$PFX"/lib/x86_64-linux-gnu/lib*.so.*; do
    [ -L "$lib" ] || continue
    so=$(basename "$lib")
    case $so in *.so.*.*) continue ;; esac # the soname links only (libz.so.1, not .so.1.2.13)
    case ${so%%.so.*} in
      libz | libudev | libatomic | libgfortran | libquadmath | libnuma | libnl-3 | libnl-route-3 | \
      libibverbs | librdmacm) ;;
      *) continue ;;
    esac
    real=$(ldconfig -p 2>/dev/null | awk -v n="$so" '$1 == n && /x86-64/ {print $NF; exit}')
    if [ -z "$real" ] || [ ! -e "$real" ]; then continue; fi
    rm -f "$lib"
    [ -L "$L/${so%%.so.*}.so" ] && ln -sfn "$real" "$L/${so%%.so.*}.so"
    echo "using the system's $so ($real)"
  done
  if [ -n "${SYSTEM_MPI:-}" ]; then
    for n in mpicc mpirun mpiexec; do ln -sfn "$SYSTEM_MPI/$n" "$PFX/bin/$n"; done
  else
    # Debian names the programs *.openmpi (alternatives make /usr/bin/mpicc at install time).
    for n in mpicc mpirun mpiexec; do
      printf '#!/bin/sh\nexec %s "$@"\n' "$PFX/usr/bin/$n.openmpi" >"$PFX/bin/$n"
      chmod +x "$PFX/bin/$n"
    done
    export OPAL_PREFIX=$PFX/usr OPAL_SYSCONFDIR=$PFX/etc/openmpi
    export PMIX_PREFIX=$L/pmix2 PMIX_MCA_mca_base_component_path=$L/pmix2/lib/pmix
  fi
  export PATH=$PFX/bin:$PFX/usr/bin:$PATH
  export LD_LIBRARY_PATH=$L:$L/openmpi/lib:$L/pmix2/lib:$L/openblas-pthread:$PFX/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  # One host, no ssh: the rsh launcher only needs an agent to exist.
  export OMPI_MCA_plm_rsh_agent=/bin/false
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  # Ranks of one machine: a sandbox may refuse process_vm_readv (CMA); copy through shared memory.
  export OMPI_MCA_btl_vader_single_copy_mechanism=none
  export CHECK_CFLAGS="-I$PFX/usr/include" CHECK_LIBS="-L$L -pthread -lcheck_pic -lrt -lm -lsubunit"
  export OPENBLAS_CFLAGS="-I$PFX/usr/include/x86_64-linux-gnu/openblas-pthread"
  export OPENBLAS_LIBS="-L$L/openblas-pthread -lopenblas"
  export ZLIB_CFLAGS="-I$PFX/usr/include" ZLIB_LIBS="-L$L -lz"
  mpicc -showme && mpirun --version | head -1
}
# CUDA_HOME, and NCCL / cuBLAS wherever they are (toolkit, /usr, or PyTorch's nvidia wheels).
setup_cuda() {
  local nvcc
  nvcc=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null) || { echo "no nvcc"; return 1; }
  CUDA_HOME=$(cd "$(dirname "$nvcc")/.." && pwd)
  export PATH=$CUDA_HOME/bin:$PATH
  "$nvcc" --version | tail -2
  EXTRA_CPPFLAGS="" EXTRA_LDFLAGS=""
  local site
  site=$(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null)
  # find_lib NAME HEADER: makes -lNAME and HEADER usable: from the toolkit, /usr, or PyTorch's
  # nvidia-* wheels; a library found only as libNAME.so.N gets a libNAME.so link in the prefix.
  find_lib() {
    local name=$1 header=$2 inc="" so="" d s
    local incs="$CUDA_HOME/include $CUDA_HOME/targets/x86_64-linux/include /usr/include"
    local libs="$CUDA_HOME/lib64 $CUDA_HOME/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu"
    for s in $site; do [ -d "$s/nvidia" ] && incs="$incs $s/nvidia" && libs="$libs $s/nvidia"; done
    for d in $incs; do
      inc=$(find "$d/" -maxdepth 4 -name "$header" 2>/dev/null | head -1)
      [ -n "$inc" ] && inc=$(dirname "$inc") && break
    done
    for d in $libs; do
      so=$(find "$d/" -maxdepth 4 -name "lib$name.so*" 2>/dev/null | sort | head -1)
      [ -n "$so" ] && break
    done
    if [ -z "$inc" ] || [ -z "$so" ]; then
      echo "$name: not found (header '${inc:-none}', library '${so:-none}')"
      return 1
    fi
    case " $incs " in *" $inc "*) ;; *) EXTRA_CPPFLAGS="$EXTRA_CPPFLAGS -I$inc" ;; esac
    if [ "$(basename "$so")" != "lib$name.so" ] || ! case " $libs " in *" $(dirname "$so") "*) true ;; *) false ;; esac; then
      mkdir -p "$PFX/cudalibs"
      ln -sfn "$so" "$PFX/cudalibs/lib$name.so"
      case " $EXTRA_LDFLAGS " in *" -L$PFX/cudalibs "*) ;; *) EXTRA_LDFLAGS="$EXTRA_LDFLAGS -L$PFX/cudalibs" ;; esac
    fi
    LD_LIBRARY_PATH=$(dirname "$so"):$LD_LIBRARY_PATH
    export LD_LIBRARY_PATH
    echo "$name: $inc/$header, $so"
  }
  find_lib cublas cublas_v2.h || return 1
  find_lib nccl nccl.h || return 1
  find_lib cudnn cudnn.h || echo "no cuDNN: convolutions on CUDA through im2col + cuBLAS" 
}

# The CUDA tests, first of all (they need only the library): the op table against the CPU, the
# convolutions through cuDNN against im2col, streams and the allocator, NCCL and DDP on CUDA
# against one process (1 and 2 ranks), DataParallel on CUDA. They must PASS on a GPU; in a dry
# run without one they SKIP (exit 77), visibly.
CUDA_TESTS="tests/test_backend_ops_cuda.sh tests/test_cuda_ops tests/test_cuda_stream
tests/test_comm_cuda tests/test_dp_cuda tests/test_comm_cuda_np2.mpi tests/test_cuda_gpt_ops
tests/test_cuda_gpt tests/test_train_gpt_cuda.sh tests/test_cuda_bf16"
CUDA_TEST_PROGRAMS="tests/test_backend_ops tests/test_cuda_ops tests/test_cuda_stream
tests/test_comm_cuda tests/test_dp_cuda tests/test_cuda_gpt_ops tests/test_cuda_gpt mpitrain
tests/test_cuda_bf16"

run_tests() {
  local t rc=0 res
  # shellcheck disable=SC2086
  step cuda-tests 240 make -C "$BUILD" check TESTS="$(echo $CUDA_TESTS)" VERBOSE=1 \
    >"$OUTDIR/tests.log" 2>&1
  tail -n 40 "$OUTDIR/tests.log"
  for t in $CUDA_TESTS; do
    res=$(sed -n 's/^:test-result: //p' "$BUILD/$t.trs" 2>/dev/null | head -1)
    say "test $t: ${res:-NOT RUN}"
    if [ "$res" != PASS ]; then
      if [ "$res" = SKIP ] && [ "${GPU_CHECK_ALLOW_NO_GPU:-0}" = 1 ] && ! have_gpu; then continue; fi
      rc=1
    fi
  done
  for t in $CUDA_TESTS; do cat "$BUILD/$t.log" >>"$OUTDIR/tests.log" 2>/dev/null; done
  return $rc
}

# samples/s of the last epoch in a metrics JSON ("samples_per_sec": N).
json_sps() { sed -n 's/.*"samples_per_sec"[^0-9]*\([0-9.]*\).*/\1/p' "$1" 2>/dev/null | tail -1; }

PY=${GPU_CHECK_PYTHON:-python3}
GPT_DEV=${GPU_CHECK_GPT_DEVICE:-cuda}

# A trainer log's tokens/s over all steps (its "done: N steps, X tokens/s overall" line) and
# after the first step (from the per-step lines of --log-every 1: "... X tokens/s" each, one step
# of equal tokens: (n - 1) / sum of 1 / X over steps 2..n).
gpt_tps() { sed -n 's/.*done: [0-9]* steps, \([0-9.]*\) tokens\/s overall.*/\1/p' "$1" | tail -1; }
gpt_tps_after_first() {
  awk '/ step +[0-9]+\/[0-9]+  loss / { for (i = 2; i <= NF; i++) if ($i == "tokens/s") x = $(i - 1);
         n++; if (n > 1 && x > 0) s += 1 / x }
       END { if (n > 1 && s > 0) printf "%.0f", (n - 1) / s }' "$1"
}
torch_tps() { sed -n "s/^torch .*$2=\([0-9.]*\).*/\1/p" "$1" | tail -1; }
ratio() { awk -v a="${1:-0}" -v b="${2:-0}" 'BEGIN { if (a > 0 && b > 0) printf "%.2f", a / b; else printf "?" }'; }

# The GPT stages: byte-level shards of a generated text, then per model mpitrain on the device
# (one rank) and PyTorch (bench/gpu_gpt_torch.py, attention materialised as mpitrain's; for
# gpt2 also PyTorch's fused attention) on the same shards, batch, steps and optimizer.
run_gpt_stages() {
  local dir=${TMPDIR:-/tmp}/mpt-gpu-gpt t0 spec model b steps limit msizes tsizes mt mt1 tt tt1 rc attn tname
  local tiny="--n-layer 2 --n-head 2 --n-embd 32 --seq-len 32 --vocab-size 256"
  rm -rf "$dir" && mkdir -p "$dir" || return 1
  t0=$(now)
  awk 'BEGIN { srand(7); split("the a cat dog sat on mat ran fast slow red blue big small " \
       "house tree and of to in", w, " ");
       for (i = 0; i < 6000; i++) { n = 5 + int(rand() * 6); s = "";
         for (j = 0; j < n; j++) s = s w[1 + int(rand() * 20)] " "; print s "." } }' >"$dir/text.txt"
  if ! step gpt-data 60 "$BUILD/mpitrain" tokenize --bytes --val-fraction 0 -o "$dir/shards" \
      "$dir/text.txt" >"$dir/tokenize.txt" 2>&1; then
    cat "$dir/tokenize.txt"; stage gpt-data FAIL "$t0"; fail gpt-data "mpitrain tokenize"; return 1
  fi
  stage gpt-data ok "$t0" "$(tail -1 "$dir/tokenize.txt")"
  for spec in "gpt-mini 8 30 90" "gpt2 4 10 150"; do
    # shellcheck disable=SC2086 # spec is a list of words
    set -- $spec
    model=$1 b=$2 steps=$3 limit=$4 msizes="--model $1" tsizes="--model $1"
    if [ "${GPU_CHECK_GPT_TINY:-0}" = 1 ]; then
      msizes="--model gpt $tiny" tsizes="--model $model $tiny"
    fi
    mt="" mt1="" tt="" tt1=""
    t0=$(now)
    # shellcheck disable=SC2086
    step "$model" "$limit" mpirun -np 1 --bind-to none "$BUILD/mpitrain" train $msizes \
      --shards "$dir/shards/train_*.bin" --device "$GPT_DEV" --batch-size "$b" \
      --max-steps "$steps" --no-shuffle --schedule constant --lr 1e-3 --log-every 1 \
      >"$dir/$model.log" 2>&1
    rc=$?
    grep -E "parameters;|step +$steps/$steps|done:|SGEMM|error" "$dir/$model.log"
    mt=$(gpt_tps "$dir/$model.log")
    mt1=$(gpt_tps_after_first "$dir/$model.log")
    if [ $rc -eq 0 ] && [ -n "$mt" ]; then
      stage "$model" ok "$t0" "${mt} tokens/s, ${mt1:-?} after the first step"
    else
      tail -20 "$dir/$model.log"; stage "$model" FAIL "$t0"; fail "$model" "mpitrain train --model $model --device $GPT_DEV"
    fi
    for attn in manual sdpa; do
      [ $attn = sdpa ] && [ "$model" != gpt2 ] && continue
      tname=torch-$model
      [ $attn = sdpa ] && tname=torch-$model-sdpa
      t0=$(now)
      # shellcheck disable=SC2086
      step "$tname" "$limit" env -u LD_LIBRARY_PATH "$PY" \
        "$ROOT/bench/gpu_gpt_torch.py" $tsizes --attn $attn --device "$GPT_DEV" --batch-size "$b" --steps "$steps" --lr 1e-3 \
        --shards "$dir/shards/train_*.bin" >"$dir/$tname.txt" 2>&1
      rc=$?
      tail -n 5 "$dir/$tname.txt"
      tt=$(torch_tps "$dir/$tname.txt" tokens_per_sec)
      tt1=$(torch_tps "$dir/$tname.txt" tokens_per_sec_after_first)
      if [ $rc -eq 3 ]; then
        stage "$tname" skip "$t0" "this PyTorch has no fused attention"
        continue
      elif [ $rc -eq 0 ] && [ -n "$tt" ]; then
        stage "$tname" ok "$t0" "${tt} tokens/s, ${tt1:-?} after the first step"
      else
        stage "$tname" FAIL "$t0"; fail "$tname" "bench/gpu_gpt_torch.py --model $model --attn $attn"
      fi
      say "$model on $GPT_DEV, B $b, $steps steps: mpitrain ${mt:-?} tokens/s (${mt1:-?} after the first step), pytorch ($attn attention) ${tt:-?} (${tt1:-?}); mpitrain / pytorch: $(ratio "$mt" "$tt") ($(ratio "$mt1" "$tt1") after the first step)"
    done
  done
}

# `gpt BUILD_DIR`: the GPT stages alone, in this environment (no prefix, no build).
run_gpt_only() {
  BUILD=$(cd "${1:-.}" && pwd) || exit 2
  [ -x "$BUILD/mpitrain" ] || { echo "no mpitrain in $BUILD" >&2; exit 2; }
  mkdir -p "$OUTDIR" || exit 1
  : >"$SUMMARY"
  exec 3>&1
  trap 'stage_summary' EXIT
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  run_gpt_stages
  if [ -n "$FAILED" ]; then
    say "GPT STAGES FAILED:$FAILED"
    exit 1
  fi
  say "GPT STAGES PASSED"
  exit 0
}

run_check() {
  mkdir -p "$OUTDIR" || exit 1
  : >"$SUMMARY"
  exec > >(tee -a "$LOG") 2>&1
  exec 3>&1 # the step lines, even when a step's output goes to a file
  trap 'stage_summary' EXIT
  echo "mpitrain GPU check, $(date -u), root $ROOT, output $OUTDIR, budget ${BUDGET_S} s"
  local gpu=1 t0
  if ! have_gpu; then
    gpu=0
    if [ "${GPU_CHECK_ALLOW_NO_GPU:-0}" != 1 ]; then
      fail gpu "nvidia-smi shows no GPU (GPU_CHECK_ALLOW_NO_GPU=1 for a dry run)"
      exit 1
    fi
    say "no GPU: dry run (GPU steps skipped, CUDA tests SKIP)"
  fi
  nvidia-smi -L 2>/dev/null | tee -a "$SUMMARY"
  nproc
  JOBS=${GPU_CHECK_JOBS:-$(nproc)}

  t0=$(now)
  if ! check_glibc; then stage glibc FAIL "$t0" "glibc too old"; fail glibc "see above"; exit 1; fi
  stage glibc ok "$t0" "${SYSTEM_MPI:+older than the carried packages need: the Open MPI of the image}"

  t0=$(now)
  echo "===== prefix: unpacking $CARRY/debs"
  setup_prefix || { stage prefix FAIL "$t0"; fail prefix "could not unpack the carried .deb files"; exit 1; }
  stage prefix ok "$t0"
  t0=$(now)
  echo "===== cuda: toolkit, cuBLAS, NCCL"
  setup_cuda || { stage cuda FAIL "$t0"; fail cuda "no CUDA toolkit with cuBLAS and NCCL"; exit 1; }
  stage cuda ok "$t0"

  # The generated build system: carried (no autotools there), newer than every source.
  t0=$(now)
  if [ -f "$CARRY/gen/configure" ]; then
    local f
    for f in $GEN_FILES; do cp "$CARRY/gen/$f" "$ROOT/$f"; done
    rm -rf "$ROOT/build-aux" && cp -r "$CARRY/gen/build-aux" "$ROOT/build-aux"
    mkdir -p "$ROOT/m4" && cp "$CARRY"/gen/m4/*.m4 "$ROOT/m4/" 2>/dev/null
    touch "$ROOT/aclocal.m4"; sleep 1
    touch "$ROOT/configure" "$ROOT/config.h.in"; sleep 1
    touch "$ROOT/Makefile.in"
  elif [ ! -f "$ROOT/configure" ]; then
    step autoreconf 120 sh -c "cd '$ROOT' && autoreconf -fi" ||
      { stage configure FAIL "$t0"; fail configure "no carried configure and no autotools"; exit 1; }
  fi
  BUILD=$ROOT/build-gpu
  mkdir -p "$BUILD"
  # shellcheck disable=SC2086
  step configure 120 sh -c "cd '$BUILD' && '$ROOT/configure' -q --with-cuda='$CUDA_HOME' \
      CC='$PFX/bin/mpicc' MPICC='$PFX/bin/mpicc' CPPFLAGS='$EXTRA_CPPFLAGS' \
      LDFLAGS='$EXTRA_LDFLAGS'" ||
    { stage configure FAIL "$t0"; fail configure "see config.log"; tail -30 "$BUILD/config.log"; exit 1; }
  grep -E 'MPT_HAVE_(CUDA|NCCL|CUDNN)' "$BUILD/config.h"
  grep -q 'define MPT_HAVE_NCCL 1' "$BUILD/config.h" || fail configure "NCCL was not found"
  stage configure ok "$t0" "$(grep -oE 'MPT_HAVE_(CUDA|NCCL|CUDNN) 1' "$BUILD/config.h" | awk '{print $1}' | sed 's/MPT_HAVE_//' | tr '\n' ' ')"

  # The CUDA tests first: build only what they need, run them, report.
  t0=$(now)
  # shellcheck disable=SC2086
  if ! step build-tests 200 make -C "$BUILD" -j"$JOBS" $CUDA_TEST_PROGRAMS >"$OUTDIR/build.txt" 2>&1; then
    tail -40 "$OUTDIR/build.txt"; stage build-tests FAIL "$t0"; fail build "the CUDA test programs"; exit 1
  fi
  stage build-tests ok "$t0" "$(grep -c 'warning:' "$OUTDIR/build.txt") compiler warnings"
  t0=$(now)
  if run_tests; then
    stage cuda-tests ok "$t0" "$(sed -n 's/^# \(PASS\|SKIP\|FAIL\): *\([0-9]*\)/\1 \2/p' "$OUTDIR/tests.log" | tr '\n' ' ')"
  else
    stage cuda-tests FAIL "$t0" "tests.log"; fail tests "a CUDA test did not pass (tests.log)"
  fi

  t0=$(now)
  if ! step build 150 make -C "$BUILD" -j"$JOBS" mpitrain mpt_allreduce_bench >>"$OUTDIR/build.txt" 2>&1; then
    tail -40 "$OUTDIR/build.txt"; stage build FAIL "$t0"; fail build "make failed"; exit 1
  fi
  stage build ok "$t0"
  rm -f "$OUTDIR/build.txt" # in the log's place: the 8-file limit of the device tool

  # Training: the cnn on the GPU, one rank, a bounded number of steps (the budget).
  local data="--synthetic" steps="--max-steps ${GPU_CHECK_EPOCH_STEPS:-300}"
  [ -f "$CARRY/data/train-images-idx3-ubyte.gz" ] && data="--data $CARRY/data"
  local sps="" tsps=""
  t0=$(now)
  if [ $gpu = 1 ]; then
    # shellcheck disable=SC2086
    if step train 75 mpirun -np 1 --bind-to none "$BUILD/mpitrain" train --model cnn --epochs 1 \
        --batch-size 64 --device cuda --no-progress $data $steps \
        --metrics-json "$OUTDIR/train.json"; then
      sps=$(json_sps "$OUTDIR/train.json")
      say "mpitrain cnn on the GPU, batch 64: ${sps:-?} samples/s"
      stage train ok "$t0" "${sps:-?} samples/s"
    else
      stage train FAIL "$t0"; fail train "mpitrain train --device cuda failed"
    fi
  else
    stage train skip "$t0" "no GPU"
  fi

  # All-reduce through the staged MPI backend, 2 ranks on one GPU. (A 1-rank NCCL figure says
  # nothing: bus bandwidth is 0 by definition with one rank; the NCCL path is covered by the
  # tests and by training.)
  t0=$(now)
  if [ $gpu = 1 ]; then
    # shellcheck disable=SC2086
    if step allreduce-mpi 60 mpirun -np 2 --oversubscribe --bind-to none --mca pml ob1 \
        --mca btl self,vader --mca btl_vader_single_copy_mechanism none \
        "$BUILD/mpt_allreduce_bench" --backend mpi --device cuda:0 \
        -b 64K -e 64M -f 4 -n 10 -w 2 >"$OUTDIR/allreduce_mpi.txt" 2>&1; then
      stage allreduce-mpi ok "$t0" "$(grep -h 'Avg bus bandwidth' "$OUTDIR/allreduce_mpi.txt" | tail -1)"
    else
      stage allreduce-mpi FAIL "$t0"; fail allreduce-mpi "mpt_allreduce_bench --backend mpi --device cuda:0 (2 ranks)"
    fi
    cat "$OUTDIR/allreduce_mpi.txt"
  else
    stage allreduce-mpi skip "$t0" "no GPU"
  fi

  # PyTorch on the same model, batch and number of steps, synchronised every step as the
  # trainer is (its own interpreter and libraries: no prefix paths).
  t0=$(now)
  if [ $gpu = 1 ]; then
    local tdata="--synthetic"
    [ -f "$CARRY/data/train-images-idx3-ubyte.gz" ] && tdata="--data $CARRY/data"
    # shellcheck disable=SC2086
    if step torch 75 env -u LD_LIBRARY_PATH python3 "$ROOT/bench/torch_ref.py" --model cnn \
        --device cuda --batch-size 64 --steps "${GPU_CHECK_EPOCH_STEPS:-300}" --warmup 0 \
        --sync-every-step $tdata --json "$OUTDIR/torch.json"; then
      tsps=$(json_sps "$OUTDIR/torch.json")
      stage torch ok "$t0" "${tsps:-?} samples/s"
    else
      stage torch FAIL "$t0"; fail torch "bench/torch_ref.py --device cuda"
    fi
    say "pytorch cnn on the GPU, batch 64: ${tsps:-?} samples/s"
    if [ -n "$sps" ] && [ -n "$tsps" ]; then
      say "mpitrain / pytorch samples/s: $(awk -v a="$sps" -v b="$tsps" 'BEGIN {printf "%.2f", a / b}')"
    fi
  else
    stage torch skip "$t0" "no GPU"
  fi

  # The GPT models on the GPU, mpitrain and PyTorch.
  if [ $gpu = 1 ]; then
    run_gpt_stages
  else
    t0=$(now)
    stage gpt skip "$t0" "no GPU"
  fi

  say "total time: $(elapsed "$T_START") s"
  if [ -n "$FAILED" ]; then
    say "GPU CHECK FAILED:$FAILED"
    exit 1
  fi
  say "GPU CHECK PASSED"
  exit 0
}

case $MODE in
  prepare) shift; prepare "$@" ;;
  run) run_check ;;
  gpt) shift; run_gpt_only "$@" ;;
  -h|--help) usage 0 ;;
  *) usage ;;
esac
