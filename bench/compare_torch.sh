#!/bin/sh
# bench/compare_torch.sh: mpitrain against PyTorch (bench/torch_ref.py): Debian's python3-torch
# (1.13), the newest PyTorch from PyPI (--torch pypi: installed with pip into a virtual
# environment, bench/.venv, on first use), or both one after the other, on the same model, batch per rank, ranks and threads, side by side on this
# machine: the two alternate (mpitrain first on odd repeats, torch first on even ones), each
# configuration runs --repeats times, and the medians and their ratio are printed.
#
# Counting, the same on both sides: N warm-up steps, then N timed steps; samples/s = timed
# samples of all ranks / timed seconds.
#   mpitrain: `mpitrain train --epochs 2 --max-steps N`: epoch 1 is the warm-up, epoch 2's
#             training samples/s is taken (evaluation is outside it);
#   torch:    `torch_ref.py --warmup N --steps N` (barrier, N steps, barrier).
# Threads: one BLAS / intra-op thread per rank on both sides (mpitrain --threads 1 and
# OPENBLAS_NUM_THREADS=1; torch.set_num_threads(1), OMP_NUM_THREADS=1); DDP over ranks on both
# sides (mpirun + mpitrain's MPI comm; torch.multiprocessing.spawn + gloo). DataParallel is
# GPU-only in PyTorch, so DP is not compared here.
#
#   bench/compare_torch.sh --model mlp,cnn --np 2 --batch-size 64 --repeats 5 --json cmp.json
#   bench/compare_torch.sh --torch both --json cmp.json   # cmp_debian.json and cmp_pypi.json
set -u
. "$(dirname "$0")/bench_lib.sh"

usage() {
  cat <<'EOF'
usage: bench/compare_torch.sh [options]
  --build DIR            build folder with mpitrain (default: $MPT_BUILD, ., build, build-*)
  --model LIST           mlp, cnn or mlp,cnn (default mlp,cnn)
  --np W                 ranks on both sides (default 2; 1 = one process, no DDP)
  --batch-size N         samples per step per rank (default 64)
  --steps N              warm-up steps and timed steps (default 300)
  --threads N            BLAS / intra-op threads per rank, both sides (default 1)
  --repeats R            alternating pairs of runs; medians reported (default 3)
  --data synthetic|real  (default synthetic)
  --out DIR              keep every run's output here (default: a temporary folder)
  --json FILE            write the summary as JSON
  --wait-idle S          before each run, wait up to S seconds for the CPUs to be 90% idle
                         (shared machines; the idle fraction is recorded either way)
  --torch debian|pypi|both   which PyTorch (default debian: python3-torch 1.13; pypi: the
                         newest from PyPI in the virtual environment $MPT_TORCH_VENV, default
                         bench/.venv, made with pip on first use; both: debian, then pypi, each
                         with its own mpitrain runs, summary and JSON FILE_debian / FILE_pypi)
  -h, --help
EOF
}

models=mlp,cnn np=2 batch=64 steps=300 threads=1 repeats=3 data=synthetic out="" json=""
flavors=debian
wd=5e-4 # SGD weight decay on both sides (mpitrain's default), momentum 0.9, lr 0.05
while [ $# -gt 0 ]; do
  case $1 in
    -h|--help) usage; exit 0 ;;
    *) [ $# -ge 2 ] || bench_die "$1 needs a value (see --help)" ;;
  esac
  case $1 in
    --build) MPT_BUILD=$2 ;;
    --model) models=$2 ;;
    --np) np=$2 ;;
    --batch-size) batch=$2 ;;
    --steps) steps=$2 ;;
    --threads) threads=$2 ;;
    --repeats) repeats=$2 ;;
    --data) data=$2 ;;
    --out) out=$2 ;;
    --json) json=$2 ;;
    --wait-idle) MPT_BENCH_WAIT_IDLE_S=$2; export MPT_BENCH_WAIT_IDLE_S ;;
    --torch)
      case $2 in debian|pypi) flavors=$2 ;; both) flavors="debian pypi" ;;
        *) bench_die "--torch: '$2' is not debian, pypi or both" ;; esac ;;
    *) usage >&2; bench_die "unknown option '$1'" ;;
  esac
  shift 2
done
for v in "$np" "$batch" "$steps" "$threads" "$repeats"; do
  case $v in ''|*[!0-9]*) bench_die "'$v' is not a positive integer" ;; esac
  [ "$v" -ge 1 ] || bench_die "'$v' is not a positive integer"
done
case $data in synthetic|real) ;; *) bench_die "--data: '$data' is not synthetic or real" ;; esac
for m in $(bench_words "$models"); do
  case $m in mlp|cnn) ;; *) bench_die "--model: '$m' is not mlp or cnn" ;; esac
done
bench_find_build
venv=${MPT_TORCH_VENV:-$BENCH_SRCDIR/bench/.venv}
# torch_python FLAVOR: the python3 that has that PyTorch (the PyPI one is installed once).
torch_python() {
  if [ "$1" = debian ]; then
    _tp=$(bench_python)
    "$_tp" -c 'import torch' 2>/dev/null || bench_die "$_tp cannot import torch: install" \
      "Debian's python3-torch (./setup.sh bench, or apt-get install python3-torch)"
  else
    _tp=$venv/bin/python
    if ! "$_tp" -c 'import torch, numpy' 2>/dev/null; then
      echo "making $venv: pip install torch numpy from PyPI (once; remove the folder to update)" >&2
      "$(bench_python)" -m venv "$venv" ||
        bench_die "cannot make the virtual environment $venv (apt-get install python3-venv)"
      "$venv/bin/pip" install --quiet torch numpy >&2 || bench_die "pip install torch numpy failed"
    fi
  fi
  echo "$_tp"
}
for f in $flavors; do torch_python "$f" >/dev/null || exit 2; done
if [ -z "$out" ]; then
  out=$(mktemp -d "${TMPDIR:-/tmp}/mpt_compare_torch.XXXXXX")
  echo "runs in $out"
fi
mkdir -p "$out" || bench_die "cannot create $out"
all_out=$out all_json=$json
OPENBLAS_NUM_THREADS=$threads OMP_NUM_THREADS=$threads
export OPENBLAS_NUM_THREADS OMP_NUM_THREADS

record() { # impl model repeat rc result command
  printf '{"impl": "%s", "model": "%s", "np": %s, "batch_size": %s, "threads": %s, "steps": %s, "data": "%s", "repeat": %s, "rc": %s, "result": "%s", "idle_before": %s, "command": "%s"}\n' \
    "$1" "$2" "$np" "$batch" "$threads" "$steps" "$data" "$3" "$4" "$5" "$_idle" "$6" >>"$manifest"
}

run_mpitrain() { # model repeat
  _res=$out/mpitrain_$1_r$2.json
  set -- "$1" "$2" train --model "$1" --epochs 2 --max-steps "$steps" --batch-size "$batch" \
    --threads "$threads" --test-limit 1000 --no-progress --metrics-json "$_res" \
    --weight-decay "$wd"
  [ "$data" = synthetic ] && set -- "$@" --synthetic
  _m=$1 _r=$2
  shift 2
  rm -f "$_res"
  _idle=$(bench_wait_idle)
  _launch=$np
  [ "$np" -eq 1 ] && _launch=0
  bench_launch "$_launch" "$MPT_BUILD/mpitrain" "$@" </dev/null >"$out/mpitrain_${_m}_r$_r.log" 2>&1
  _rc=$?
  [ "$_rc" -eq 0 ] || { echo "  mpitrain FAILED (exit $_rc):" >&2; tail -3 "$out/mpitrain_${_m}_r$_r.log" >&2; }
  _cmd="mpitrain $*"
  [ "$_launch" -gt 0 ] && _cmd="mpirun -np $np $_cmd"
  record mpitrain "$_m" "$_r" "$_rc" "$_res" "$_cmd"
  grep -h "epoch   2" "$out/mpitrain_${_m}_r$_r.log" | sed 's/.*acc [0-9.]* *//; s/^/  mpitrain: /' >&2
}

run_torch() { # model repeat
  _m=$1 _r=$2
  _res=$out/torch_${_m}_r$_r.json _log=$out/torch_${_m}_r$_r.log
  set -- --model "$_m" --np "$np" --batch-size "$batch" --steps "$steps" --warmup "$steps" \
    --threads "$threads" --weight-decay "$wd" --json "$_res" --port $((29500 + (_r * 7 + ${#_m}) % 400))
  [ "$data" = synthetic ] && set -- "$@" --synthetic
  rm -f "$_res"
  _idle=$(bench_wait_idle)
  bench_launch 0 "$PY" "$BENCH_SRCDIR/bench/torch_ref.py" "$@" </dev/null >"$_log" 2>&1
  _rc=$?
  [ "$_rc" -eq 0 ] || { echo "  torch FAILED (exit $_rc):" >&2; tail -3 "$_log" >&2; }
  record torch "$_m" "$_r" "$_rc" "$_res" "torch_ref.py $*"
  grep -h "samples_per_sec" "$_log" | sed 's/ model=.*//; s/^/  /' >&2
}

for flavor in $flavors; do
PY=$(torch_python "$flavor")
out=$all_out json=$all_json
if [ "$flavors" != "$flavor" ]; then # both: one folder and one summary per PyTorch
  out=$all_out/$flavor
  [ -n "$all_json" ] && json=${all_json%.json}_$flavor.json
  mkdir -p "$out" || bench_die "cannot create $out"
fi
echo "PyTorch: $flavor ($("$PY" -c 'import torch; print(torch.__version__)'), $PY)"
manifest=$out/manifest.jsonl
: >"$manifest"
rep=1
while [ "$rep" -le "$repeats" ]; do
  for m in $(bench_words "$models"); do
    echo "repeat $rep/$repeats: $m, $np rank(s), batch $batch per rank, $threads thread(s)" >&2
    if [ $((rep % 2)) -eq 1 ]; then
      run_mpitrain "$m" "$rep"
      run_torch "$m" "$rep"
    else
      run_torch "$m" "$rep"
      run_mpitrain "$m" "$rep"
    fi
  done
  rep=$((rep + 1))
done

set -- compare --manifest "$manifest" --build "$MPT_BUILD"
[ -n "$json" ] && set -- "$@" --json "$json"
"$(bench_python)" "$BENCH_SRCDIR/bench/summarize.py" "$@" || exit $?
done
