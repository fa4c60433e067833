#!/bin/sh
# bench/run_all.sh: every benchmark of the harness at small scale, into one folder (default
# bench/results), with each tool's text output next to its JSON, then the plots. This is the
# command behind the checked-in results (bench/results/README.md). A few minutes on 2 CPUs.
#
#   bench/run_all.sh [--build DIR] [--out DIR] [--runs DIR] [--np W] [--repeats R] [--wait-idle S]
#                    [--torch F] [--gpt small|full|off]
#
# --runs DIR keeps every run's metrics, logs and the manifests (default: a temporary folder);
# the traces the scaling model reads are kept in --out.
# --wait-idle S: on a shared machine, each run first waits up to S seconds for the CPUs to be
# 90% idle (the idle fraction before each run is recorded in the manifests either way).
set -u
. "$(dirname "$0")/bench_lib.sh"

usage() {
  cat <<'EOF'
usage: bench/run_all.sh [options]
  --build DIR        build folder with mpitrain (default: $MPT_BUILD, ., build, build-*)
  --out DIR          results: JSON, text and PNG plots (default bench/results)
  --runs DIR         keep every run's metrics, logs and manifests (default: a temporary folder)
  --np W             ranks (default 2)
  --repeats R        runs of each configuration; medians reported (default 3)
  --wait-idle S      before each run, wait up to S seconds for the CPUs to be 90% idle
  --torch F          PyTorch for the comparison: debian (default), pypi or both
                     (see bench/compare_torch.sh --help)
  --gpt WHAT         the GPT benchmarks: small (default: gpt-mini against PyTorch at 1 and W
                     ranks, its DDP bucket-cap / overlap sweep, 100 steps on the fortunes:
                     files gpt_small_*), full (the commands behind results/README.md's GPT
                     figures: gpt-mini and gpt2 against both PyTorch versions, the gpt2 DDP
                     sweep, 150 steps on the fortunes; an hour or more on 2 shared CPUs) or off
  -h, --help
Needs gnuplot and Debian's python3-torch besides the build: ./setup.sh bench installs them.
EOF
}

out=$BENCH_SRCDIR/bench/results runs="" np=2 repeats=3 torch=debian gpt=small
while [ $# -gt 0 ]; do
  case $1 in -h|--help) usage; exit 0 ;; esac
  [ $# -ge 2 ] || bench_die "$1 needs a value (see --help)"
  case $1 in
    --build) MPT_BUILD=$2 ;;
    --out) out=$2 ;;
    --runs) runs=$2 ;;
    --np) np=$2 ;;
    --repeats) repeats=$2 ;;
    --torch) torch=$2 ;;
    --gpt) gpt=$2 ;;
    --wait-idle) MPT_BENCH_WAIT_IDLE_S=$2; export MPT_BENCH_WAIT_IDLE_S ;;
    *) usage >&2; bench_die "unknown option '$1'" ;;
  esac
  shift 2
done
case $gpt in small|full|off) ;; *) bench_die "--gpt: '$gpt' is not small, full or off" ;; esac
bench_find_build
export MPT_BUILD
# The prerequisites first, not after minutes of benchmarks.
command -v gnuplot >/dev/null 2>&1 ||
  bench_die "gnuplot not found: run ./setup.sh bench (or apt-get install gnuplot-nox)"
"$(bench_python)" -c 'import torch' 2>/dev/null ||
  [ "$torch" = pypi ] ||
  bench_die "$(bench_python) cannot import torch: run ./setup.sh bench (or apt-get install python3-torch)"
[ -n "$runs" ] || runs=$(mktemp -d "${TMPDIR:-/tmp}/mpt_run_all.XXXXXX")
mkdir -p "$out" "$runs" || bench_die "cannot create $out or $runs"
echo "results in $out, runs in $runs" >&2
B=$BENCH_SRCDIR/bench
PY=$(bench_python)
step() { echo "== $*" >&2; }

ar() { # name args...: mpt_allreduce_bench with np ranks, text + JSON
  _name=$1
  shift
  bench_wait_idle >/dev/null
  bench_launch "$np" "$MPT_BUILD/mpt_allreduce_bench" "$@" --json "$out/$_name.json" \
    </dev/null | tee "$out/$_name.txt"
}

step "all-reduce, $np ranks: comm layer defaults (confirm_collectives on)"
ar "allreduce_np$np" -b 8 -e 64M -f 2 -n 5 -w 2 -R $((5 * repeats))
step "all-reduce, $np ranks: confirm_collectives off"
ar "allreduce_np${np}_noconfirm" -b 8 -e 64M -f 4 -n 5 -w 2 -R $((3 * repeats)) --confirm 0
step "all-reduce, $np ranks: polling progress (MPI_Iallreduce + MPI_Test on the worker)"
ar "allreduce_np${np}_polling" -b 8 -e 64M -f 4 -n 5 -w 2 -R $((3 * repeats)) --progress polling

step "training: ranks 1, $np, $((2 * np)) (mlp, batch 64 per rank)"
"$B/train_bench.sh" --sweep-ranks "1,$np,$((2 * np))" --steps 200 --repeats "$repeats" \
  --out "$runs/ranks" --json "$out/train_ranks.json" | tee "$out/train_ranks.txt"
step "training: bucket caps (mlp 784-1024x4-10, 16 MiB of gradients), overlap on and off"
"$B/train_bench.sh" --sweep-buckets 0.25,1,4,8,25,100 --overlap both --np "$np" --steps 50 \
  --repeats "$repeats" --extra "--hidden 1024,1024,1024,1024" --out "$runs/buckets" \
  --json "$out/train_buckets.json" | tee "$out/train_buckets.txt"
step "training: DP inside one process (--mode dp --devices cpu:$np)"
"$B/train_bench.sh" --mode dp --devices "cpu:$np" --steps 200 --repeats "$repeats" \
  --out "$runs/dp" --json "$out/train_dp.json" | tee "$out/train_dp.txt"

step "mpitrain against PyTorch DDP (gloo), $np ranks"
"$B/compare_torch.sh" --torch "$torch" --model mlp --np "$np" --steps 300 --repeats "$repeats" \
  --out "$runs/torch_mlp" --json "$out/compare_torch_mlp.json" | tee "$out/compare_torch_mlp.txt"
"$B/compare_torch.sh" --torch "$torch" --model cnn --np "$np" --steps 60 --repeats "$repeats" \
  --out "$runs/torch_cnn" --json "$out/compare_torch_cnn.json" | tee "$out/compare_torch_cnn.txt"

step "scaling model: traces of 1 and $np ranks"
for m in mlp cnn; do
  s=200
  [ "$m" = cnn ] && s=40
  set -- train --model "$m" --synthetic --epochs 2 --max-steps "$s" --test-limit 1000 \
    --threads 1 --no-progress
  bench_wait_idle >/dev/null
  bench_launch 0 "$MPT_BUILD/mpitrain" "$@" --trace "$out/trace_${m}_np1.json" </dev/null \
    >/dev/null 2>&1 || bench_die "the 1-rank trace run of $m failed"
  bench_wait_idle >/dev/null
  bench_launch "$np" "$MPT_BUILD/mpitrain" "$@" --trace "$out/trace_${m}_np$np.json" \
    </dev/null >/dev/null 2>&1 || bench_die "the $np-rank trace run of $m failed"
  "$PY" "$B/scaling_model.py" --model "$m" --trace1 "$out/trace_${m}_np1.json" \
    --trace2 "$out/trace_${m}_np$np.json" --allreduce "$out/allreduce_np$np.json" \
    --json "$out/scaling_$m.json" | tee "$out/scaling_$m.txt"
  # The same with compute 100x faster (an accelerator): what the network alone allows.
  "$PY" "$B/scaling_model.py" --model "$m" --trace1 "$out/trace_${m}_np1.json" \
    --compute-scale 0.01 --json "$out/scaling_${m}_x0.01.json" | tee "$out/scaling_${m}_x0.01.txt"
done

# GPT: tokens/s against PyTorch, fraction of the SGEMM peak, DDP overlap and bucket
# caps, peak memory per rank, the fortunes curve and a sample.
gpt_step() { # name command...: stdout to NAME.txt (and the terminal); the summary's JSON too
  _name=$1
  shift
  "$@" --json "$out/$_name.json" | tee "$out/$_name.txt"
}
if [ "$gpt" = small ]; then
  step "GPT (small): gpt-mini against PyTorch ($torch), 1 and $np ranks"
  gpt_step gpt_small_compare "$B/compare_gpt.sh" --model gpt-mini --np "1,$np" --torch "$torch" \
    --steps 4 --warmup 1 --repeats "$repeats" --out "$runs/gpt_compare"
  step "GPT (small): gpt-mini DDP, $np ranks, bucket caps 1,5,25 MiB, overlap on and off"
  gpt_step gpt_small_ddp "$B/compare_gpt.sh" --model gpt-mini --np "$np" --torch none \
    --steps 4 --warmup 1 --repeats 1 --bucket-cap-mb 1,5,25 --overlap both --out "$runs/gpt_ddp"
  step "GPT (small): gpt-mini on the fortunes, 100 steps, $np ranks"
  gpt_step gpt_small_fortunes "$B/gpt_fortunes.sh" --np "$np" --steps 100 --val-every 25 \
    --out "$runs/gpt_fortunes"
elif [ "$gpt" = full ]; then
  step "GPT: gpt-mini (B 8, T 256) against both PyTorch versions, 1 and $np ranks"
  gpt_step compare_gpt_mini "$B/compare_gpt.sh" --model gpt-mini --np "1,$np" --torch both \
    --repeats 2 --out "$runs/gpt_mini"
  # gpt2 at B 4 x T 512 takes 6-7 GB per process on both sides: one process at B 4, the ranks
  # at B 2 (2048 tokens per step over 2 ranks), so that 2 ranks of PyTorch fit in 24 GB.
  step "GPT: gpt2 (B 4, T 512) against both PyTorch versions, 1 process"
  gpt_step compare_gpt_gpt2 "$B/compare_gpt.sh" --model gpt2 --np 1 --torch both \
    --repeats 1 --steps 2 --warmup 1 --out "$runs/gpt2"
  step "GPT: gpt2 (B 2, T 512 per rank) against both PyTorch versions, $np ranks"
  gpt_step compare_gpt_gpt2_np2 "$B/compare_gpt.sh" --model gpt2 --np "$np" --batch-size 2 \
    --torch both --repeats 1 --steps 2 --warmup 1 --out "$runs/gpt2_np$np"
  step "GPT: gpt2 DDP, $np ranks, B 2, bucket caps 5,25,100 MiB; overlap off at 25"
  gpt_step gpt2_ddp "$B/compare_gpt.sh" --model gpt2 --np "$np" --batch-size 2 --torch none \
    --repeats 1 --steps 2 --warmup 1 --bucket-cap-mb 5,25,100 --overlap on --out "$runs/gpt2_ddp"
  gpt_step gpt2_ddp_nooverlap "$B/compare_gpt.sh" --model gpt2 --np "$np" --batch-size 2 \
    --torch none --repeats 1 --steps 2 --warmup 1 --bucket-cap-mb 25 --overlap off \
    --out "$runs/gpt2_ddp_off"
  step "GPT: gpt-mini on the fortunes, 150 steps, $np ranks"
  gpt_step gpt_fortunes "$B/gpt_fortunes.sh" --np "$np" --steps 150 --val-every 25 \
    --out "$runs/gpt_fortunes"
fi

step "plots"
"$B/plot.sh" --in "$out" --out "$out"
