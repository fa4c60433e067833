#!/bin/sh
# bench/compare_gpt.sh: GPT and Llama training throughput, mpitrain against PyTorch
# (bench/torch_gpt_ref.py: the test oracles' GPT and Llama modules) on the same model, batch B and sequence length T per rank, ranks,
# threads per rank, optimizer (AdamW betas 0.9/0.95, weight decay 0.1 on >= 2-D weights,
# gradient clipping at norm 1) and token shards; Debian's PyTorch 1.13, the newest from PyPI (a
# virtual environment, bench/.venv, made with pip on first use), both or none. Also the DDP
# figures of mpitrain (all-reduce per step, share hidden behind backward, exposed wait, buckets,
# peak resident memory per rank) over bucket caps and overlap on/off.
#
# Every configuration (model x ranks x precision x bucket cap x overlap) runs --repeats times;
# within a repeat the implementations run back to back, in an order that rotates from repeat to
# repeat; the summary gives medians, ratios of medians and the median of the ratios of runs made
# back to back.
#
# Counting, the same on both sides: W warm-up steps, then S timed steps.
#   mpitrain: `mpitrain train --max-steps W+S --log-every 1`: each step's logged tokens/s gives
#             its time; timed tokens/s = S * tokens per step / the S steps' time;
#   torch:    `torch_gpt_ref.py --warmup W --steps S` (barrier, S steps, barrier).
# FLOPs per token as llm.c counts them, 6 N + 6 L C T; the fraction of the SGEMM peak that the
# trainer measures at the end of each run (1024^3 SGEMMs on all ranks at once, the same threads),
# the median over the mpitrain runs of the same ranks and threads, is used for both sides.
# mpitrain runs with --profile (no cost on the CPU but two clock reads per op): after the
# summary, each configuration's first run's table of where its steps went, op by op.
#
#   bench/compare_gpt.sh --model gpt-mini,gpt2 --np 1,2 --torch both --json gpt.json
#   bench/compare_gpt.sh --model gpt2 --np 2 --torch none --bucket-cap-mb 5,25,100 --overlap both
#   bench/compare_gpt.sh --model gpt-mini --precision fp32,bf16 --torch pypi
#   bench/compare_gpt.sh --model gpt-mini,llama-mini --np 1,2
set -u
. "$(dirname "$0")/bench_lib.sh"

usage() {
  cat <<'EOF'
usage: bench/compare_gpt.sh [options]
  --build DIR            build folder with mpitrain (default: $MPT_BUILD, ., build, build-*)
  --model LIST           gpt-mini, gpt2 and/or llama-mini (default gpt-mini; llama-mini
                         runs at its T, 256)
  --np LIST              ranks, e.g. 1,2 (default 1,2; 1 = one process, no DDP)
  --batch-size N         B per rank (default: gpt-mini 8, gpt2 4)
  --seq-len T            T (default: gpt-mini 256, gpt2 512; gpt2 with T != 1024 runs as
                         --model gpt with gpt2's sizes and T rows of wpe)
  --steps N              timed steps (default: gpt-mini 10, gpt2 3)
  --warmup N             untimed steps before them (default: gpt-mini 2, gpt2 1)
  --threads N            BLAS / intra-op threads per rank, both sides (default: CPUs / ranks)
  --repeats R            rounds of back-to-back runs; medians reported (default 2)
  --torch WHICH          debian, pypi, both or none (default both; pypi = the newest PyTorch
                         from PyPI in $MPT_TORCH_VENV, default bench/.venv, made with pip once)
  --precision LIST       fp32 and/or bf16 (default fp32): bf16 passes --precision bf16 to
                         mpitrain (a trainer without it is reported as skipped) and runs
                         PyTorch's forward under torch.autocast("cpu", dtype=torch.bfloat16)
  --bucket-cap-mb LIST   DDP bucket caps in MiB, both sides (default 25)
  --overlap WHICH        on, off or both (default on; off: mpitrain --no-overlap, and no
                         PyTorch run: its DDP always overlaps)
  --shards GLOB          token shards (default: gpt-mini: data/fortunes/train_*.bin, made with
                         `mpitrain tokenize` from /usr/share/games/fortunes when missing; gpt2:
                         a shard of random tokens written into --out)
  --out DIR              keep every run's output here (default: a temporary folder)
  --json FILE            write the summary as JSON
  --wait-idle S          before each run, wait up to S seconds for the CPUs to be 90% idle
  -h, --help
EOF
}

models=gpt-mini nps=1,2 batch="" seqlen="" steps="" warmup="" threads="" repeats=2
torch=both precisions=fp32 caps=25 overlaps=on shards="" out="" json=""
while [ $# -gt 0 ]; do
  case $1 in
    -h|--help) usage; exit 0 ;;
    *) [ $# -ge 2 ] || bench_die "$1 needs a value (see --help)" ;;
  esac
  case $1 in
    --build) MPT_BUILD=$2 ;;
    --model) models=$2 ;;
    --np) nps=$2 ;;
    --batch-size) batch=$2 ;;
    --seq-len) seqlen=$2 ;;
    --steps) steps=$2 ;;
    --warmup) warmup=$2 ;;
    --threads) threads=$2 ;;
    --repeats) repeats=$2 ;;
    --torch) torch=$2 ;;
    --precision) precisions=$2 ;;
    --bucket-cap-mb) caps=$2 ;;
    --overlap) overlaps=$2 ;;
    --shards) shards=$2 ;;
    --out) out=$2 ;;
    --json) json=$2 ;;
    --wait-idle) MPT_BENCH_WAIT_IDLE_S=$2; export MPT_BENCH_WAIT_IDLE_S ;;
    *) usage >&2; bench_die "unknown option '$1'" ;;
  esac
  shift 2
done
posint() {
  case $1 in ''|*[!0-9]*) bench_die "$2: '$1' is not a positive integer" ;; esac
  [ "$1" -ge 1 ] || bench_die "$2: '$1' is not a positive integer"
}
for m in $(bench_words "$models"); do
  case $m in
    gpt-mini|gpt2) ;;
    llama-mini) [ -z "$seqlen" ] || [ "$seqlen" -eq 256 ] ||
                  bench_die "--model llama-mini: --seq-len $seqlen (the preset's T is 256)" ;;
    *) bench_die "--model: '$m' is not gpt-mini, gpt2 or llama-mini" ;;
  esac
done
for n in $(bench_words "$nps"); do posint "$n" --np; done
for v in batch:--batch-size seqlen:--seq-len steps:--steps threads:--threads; do
  eval "_v=\$${v%%:*}"
  [ -z "$_v" ] || posint "$_v" "${v#*:}"
done
[ -z "$warmup" ] || case $warmup in *[!0-9]*) bench_die "--warmup: '$warmup' is not a count" ;; esac
posint "$repeats" --repeats
case $torch in
  debian) flavors=debian ;; pypi) flavors=pypi ;; both) flavors="debian pypi" ;; none) flavors="" ;;
  *) bench_die "--torch: '$torch' is not debian, pypi, both or none" ;;
esac
for p in $(bench_words "$precisions"); do
  case $p in fp32|bf16) ;; *) bench_die "--precision: '$p' is not fp32 or bf16" ;; esac
done
for c in $(bench_words "$caps"); do
  awk -v c="$c" 'BEGIN { exit !(c + 0 > 0 && c ~ /^[0-9.]+$/) }' ||
    bench_die "--bucket-cap-mb: '$c' is not a positive size in MiB"
done
case $overlaps in on|off) ;; both) overlaps="on off" ;;
  *) bench_die "--overlap: '$overlaps' is not on, off or both" ;; esac
bench_find_build
venv=${MPT_TORCH_VENV:-$BENCH_SRCDIR/bench/.venv}
torch_python() { # FLAVOR: the python3 that has that PyTorch (the PyPI one is installed once)
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
PY_debian="" PY_pypi=""
for f in $flavors; do
  _p=$(torch_python "$f") || exit 2
  if [ "$f" = debian ]; then PY_debian=$_p; else PY_pypi=$_p; fi
done
if [ -z "$out" ]; then
  out=$(mktemp -d "${TMPDIR:-/tmp}/mpt_compare_gpt.XXXXXX")
  echo "runs in $out"
fi
mkdir -p "$out" || bench_die "cannot create $out"
PY=$(bench_python)
ncpus=$(bench_ncpus)
# OpenMP threads that wait passively: with active spinning (libgomp's default) a PyTorch run of
# 2 threads on 2 CPUs shared with anything else ran 8x slower than with 1 thread here. Both
# sides get it (mpitrain's GEMMs are OpenBLAS pthreads; oneDNN, when used, is OpenMP).
OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
export OMP_WAIT_POLICY
manifest=$out/manifest.jsonl
: >"$manifest"

# The model's defaults and data: sets B T S W shard_glob and mpt_model (mpitrain's size options).
model_setup() {
  case $1 in
    gpt-mini|llama-mini) B=${batch:-8} T=${seqlen:-256} S=${steps:-10} W=${warmup:-2} V=256
              sizes="--n-layer 6 --n-head 6 --n-embd 384" pre_T=256 ;;
    gpt2) B=${batch:-4} T=${seqlen:-512} S=${steps:-3} W=${warmup:-1} V=50257
          sizes="--n-layer 12 --n-head 12 --n-embd 768" pre_T=1024 ;;
  esac
  if [ "$T" -eq "$pre_T" ]; then mpt_model="--model $1"
  else mpt_model="--model gpt $sizes --seq-len $T --vocab-size $V"; fi
  if [ -n "$shards" ]; then
    shard_glob=$shards
  elif [ "$1" = gpt-mini ] || [ "$1" = llama-mini ]; then
    shard_glob=$BENCH_SRCDIR/data/fortunes/'train_*.bin'
    # shellcheck disable=SC2086 # the glob on purpose
    if ! ls $shard_glob >/dev/null 2>&1; then
      echo "making data/fortunes: mpitrain tokenize --bytes --val-fraction 0.1" >&2
      # shellcheck disable=SC2046 # file list
      "$MPT_BUILD/mpitrain" tokenize --bytes --val-fraction 0.1 -o "$BENCH_SRCDIR/data/fortunes" \
        $(find /usr/share/games/fortunes -type f ! -name '*.dat' 2>/dev/null | sort) >&2 ||
        bench_die "cannot tokenize the fortunes (apt-get install fortunes, or give --shards)"
    fi
  else
    shard_glob=$out/gpt2_random_B${B}_T$T.bin
    maxnp=1
    for n in $(bench_words "$nps"); do [ "$n" -gt "$maxnp" ] && maxnp=$n; done
    [ -f "$shard_glob" ] || "$PY" "$BENCH_SRCDIR/bench/make_token_shard.py" "$shard_glob" \
      --tokens $(((W + S) * maxnp * B * T * 2 + 1)) --vocab-size 50257 ||
      bench_die "cannot write $shard_glob"
  fi
}

record() { # impl flavor repeat rc result log command
  printf '{"impl": "%s", "flavor": "%s", "model": "%s", "np": %s, "batch_size": %s, "seq_len": %s, "threads": %s, "precision": "%s", "bucket_cap_mb": %s, "overlap": "%s", "warmup": %s, "steps": %s, "repeat": %s, "rc": %s, "result": "%s", "log": "%s", "idle_before": %s, "command": "%s"}\n' \
    "$1" "$2" "$m" "$np" "$B" "$T" "$thr" "$prec" "$cap" "$ov" "$W" "$S" "$3" "$4" "$5" "$6" \
    "$_idle" "$7" >>"$manifest"
}

run_mpitrain() { # repeat
  _log=$out/mpitrain_${cfg}_r$1.log
  # shellcheck disable=SC2086 # word lists on purpose
  set -- "$1" train $mpt_model --shards "$shard_glob" --batch-size "$B" --threads "$thr" \
    --max-steps $((W + S)) --epochs 1 --log-every 1 --bucket-cap-mb "$cap" --profile
  [ "$ov" = off ] && set -- "$@" --no-overlap
  [ "$prec" = bf16 ] && set -- "$@" --precision bf16
  _r=$1
  shift
  _idle=$(bench_wait_idle)
  _launch=$np
  [ "$np" -eq 1 ] && _launch=0
  OPENBLAS_NUM_THREADS=$thr OMP_NUM_THREADS=$thr
  export OPENBLAS_NUM_THREADS OMP_NUM_THREADS
  bench_launch "$_launch" "$MPT_BUILD/mpitrain" "$@" </dev/null >"$_log" 2>&1
  _rc=$?
  _cmd="mpitrain $*"
  [ "$_launch" -gt 0 ] && _cmd="mpirun -np $np $_cmd"
  if [ "$_rc" -ne 0 ] && [ "$prec" = bf16 ] && grep -q "precision" "$_log" &&
     ! grep -q "step .*tokens/s" "$_log"; then
    echo "  mpitrain: --precision bf16 rejected by this build: skipped" >&2
    _rc=77
  elif [ "$_rc" -ne 0 ]; then
    echo "  mpitrain FAILED (exit $_rc):" >&2
    tail -3 "$_log" >&2
  fi
  record mpitrain - "$_r" "$_rc" "" "$_log" "$_cmd"
  grep -h "done:" "$_log" | sed 's/.*done: //; s/ (.*//; s/^/  mpitrain: /' >&2
}

run_torch() { # flavor repeat
  _f=$1 _r=$2
  _py=$PY_pypi
  [ "$_f" = debian ] && _py=$PY_debian
  _res=$out/torch_${_f}_${cfg}_r$_r.json _log=$out/torch_${_f}_${cfg}_r$_r.log
  set -- --model "$m" --seq-len "$T" --np "$np" --batch-size "$B" --steps "$S" --warmup "$W" \
    --threads "$thr" --bucket-cap-mb "$cap" --shards "$shard_glob" --json "$_res" \
    --port $((29600 + (_r * 13 + np * 5 + ${#cfg}) % 300))
  [ "$prec" = bf16 ] && set -- "$@" --autocast bf16
  rm -f "$_res"
  _idle=$(bench_wait_idle)
  OPENBLAS_NUM_THREADS=$thr OMP_NUM_THREADS=$thr
  export OPENBLAS_NUM_THREADS OMP_NUM_THREADS
  bench_launch 0 "$_py" "$BENCH_SRCDIR/bench/torch_gpt_ref.py" "$@" </dev/null >"$_log" 2>&1
  _rc=$?
  [ "$_rc" -eq 0 ] || { echo "  torch ($_f) FAILED (exit $_rc):" >&2; tail -3 "$_log" >&2; }
  record torch "$_f" "$_r" "$_rc" "$_res" "$_log" "torch_gpt_ref.py $*"
  grep -h "tokens_per_sec" "$_log" | sed 's/ model=.*//; s/^/  '"$_f"' /' >&2
}

rep=1
while [ "$rep" -le "$repeats" ]; do
  for m in $(bench_words "$models"); do
    model_setup "$m"
    for np in $(bench_words "$nps"); do
      thr=${threads:-$((ncpus / np))}
      [ "$thr" -ge 1 ] || thr=1
      for prec in $(bench_words "$precisions"); do
        for cap in $(bench_words "$caps"); do
          for ov in $overlaps; do
            cfg=${m}_np${np}_${prec}_cap${cap}_ov$ov
            [ "$ov" = off ] && [ "$np" -eq 1 ] && continue # no DDP: nothing to turn off
            impls=mpitrain
            if [ "$ov" = on ]; then for f in $flavors; do impls="$impls $f"; done; fi
            # rotate the order: repeat r starts with the ((r - 1) mod n)-th implementation
            # shellcheck disable=SC2086 # word list on purpose
            set -- $impls
            k=$(((rep - 1) % $#))
            while [ "$k" -gt 0 ]; do _first=$1; shift; set -- "$@" "$_first"; k=$((k - 1)); done
            echo "repeat $rep/$repeats: $m, $np rank(s), B $B T $T, $thr thread(s), $prec," \
              "bucket cap $cap MiB, overlap $ov: $*" >&2
            for impl in "$@"; do
              if [ "$impl" = mpitrain ]; then run_mpitrain "$rep"; else run_torch "$impl" "$rep"; fi
            done
          done
        done
      done
    done
  done
  rep=$((rep + 1))
done

set -- --manifest "$manifest" --build "$MPT_BUILD"
[ -n "$json" ] && set -- "$@" --json "$json"
"$PY" "$BENCH_SRCDIR/bench/summarize_gpt.py" "$@"
_st=$?
# Where mpitrain's steps went: the --profile table of each configuration's first run (rank 0).
for _log in "$out"/mpitrain_*_r1.log; do
  [ -f "$_log" ] || continue
  grep -q "op times on this rank" "$_log" || continue
  echo
  echo "# mpitrain --profile, $(basename "$_log" _r1.log | sed 's/^mpitrain_//'), repeat 1:"
  { sed -n '/op times on this rank/,/rest of the step/p' "$_log"
    grep -h "GEMMs inside the ops" "$_log"; } | sed 's/^mpitrain[^:]*: //'
done
exit $_st
