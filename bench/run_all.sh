#!/bin/sh
# bench/run_all.sh: the whole set of bench/results, regenerated on the machine at hand in one
# run: every file of the set, the plots, machine.txt (the machine, its libraries, the commit),
# manifest.tsv (each file's command, start, duration and the load before it) and README.md
# (made from those and the files by bench/results_readme.py). About an hour on 2 CPUs.
set -u
. "$(dirname "$0")/bench_lib.sh"

sections_all="comm train torch gemm avx2 gpt zero ckpt hf"
usage() {
  cat <<EOF
usage: bench/run_all.sh [options]
  --build DIR        build folder with mpitrain (default: \$MPT_BUILD, ., build, build-*)
  --out DIR          the set: text, JSON, PNG, machine.txt, manifest.tsv, README.md
                     (default bench/results)
  --runs DIR         keep every run's metrics, logs and manifests (default: a temporary folder)
  --np W             ranks (default 2)
  --repeats R        runs of each configuration; medians reported (default 3)
  --wait-idle S      before each run, wait up to S seconds for the CPUs to be 90% idle
  --only LIST        these sections only (comma-separated; default all:
                     $(echo $sections_all | tr ' ' ',')); their files replace
                     the same files of the set, whose manifest keeps the others' lines
  -h, --help
Sections: comm (all-reduce against raw MPI, bf16, polling), train (the mlp's modes, ranks,
buckets; the scaling model), torch (mlp and cnn against PyTorch 1.13 and PyPI's; the comm
thread's yield), gemm (the GEMM libraries, --gemm tune, the fused attention, PyTorch's GEMMs),
avx2 (AVX2 forced on both sides: mlp, cnn and gpt-mini against PyTorch, the GEMMs), gpt (gpt-mini, llama-mini and gpt2 against both
PyTorch versions, DDP buckets, bf16, the flight recorder's cost, the fortunes), zero (memory
and step time of ZeRO 0-3, gpt2-large), ckpt (the checkpoint stall), hf (Hugging Face interop).
A whole run (no --only) first removes the files the previous manifest.tsv names, so that the
set holds one run's files only.
Needs gnuplot, Debian's python3-torch and python3-venv (./setup.sh bench installs them) and,
for PyPI's PyTorch and transformers, a virtual environment: \$MPT_TORCH_VENV (default
bench/.venv, made with pip on first use).
EOF
}

out=$BENCH_SRCDIR/bench/results runs="" np=2 repeats=3 only="" only_given=0
while [ $# -gt 0 ]; do
  case $1 in -h|--help) usage; exit 0 ;; esac
  case $1 in --*) ;; *) usage >&2; bench_die "unknown option '$1'" ;; esac
  bench_option_value "$@"
  case $1 in
    --build) MPT_BUILD=$2 ;;
    --out) out=$2 ;;
    --runs) runs=$2 ;;
    --np) np=$2 ;;
    --repeats) repeats=$2 ;;
    --only) only=$(echo "$2" | tr ',' ' ') only_given=1 ;;
    --wait-idle) MPT_BENCH_WAIT_IDLE_S=$2; export MPT_BENCH_WAIT_IDLE_S ;;
    *) usage >&2; bench_die "unknown option '$1'" ;;
  esac
  shift 2
done
case $only in *[!a-z0-9\ ]*) bench_die "--only: '$only' is not a comma-separated list of sections" ;; esac
for s in $only; do
  case " $sections_all " in *" $s "*) ;; *) bench_die "--only: '$s' is not a section (see --help)" ;; esac
done
# shellcheck disable=SC2086,SC2116 # the words alone (letters only): "," names no section
only=$(echo $only)
[ $only_given -eq 0 ] || [ -n "$only" ] || bench_die "--only names no section (see --help)"
bench_count --np "$np"
bench_count --repeats "$repeats"
case ${MPT_BENCH_WAIT_IDLE_S:-0} in '' | *[!0-9]* | ??????*)
  bench_die "--wait-idle (MPT_BENCH_WAIT_IDLE_S): '${MPT_BENCH_WAIT_IDLE_S:-}' is not a number of seconds (0 to 99999)" ;;
esac
for d in "$out" "$runs"; do
  [ -z "$d" ] || [ ! -e "$d" ] || [ -d "$d" ] || bench_die "'$d' exists and is not a folder"
done
bench_find_build
export MPT_BUILD
# The prerequisites first, not after minutes of benchmarks.
command -v gnuplot >/dev/null 2>&1 ||
  bench_die "gnuplot not found: run ./setup.sh bench (or apt-get install gnuplot-nox)"
"$(bench_python)" -c 'import torch' 2>/dev/null ||
  bench_die "$(bench_python) cannot import torch: run ./setup.sh bench (or apt-get install python3-torch)"
venv=${MPT_TORCH_VENV:-$BENCH_SRCDIR/bench/.venv}
MPT_TORCH_VENV=$venv
export MPT_TORCH_VENV
writable() { # DIR: made if missing, and a file can be written there (root passes test -w anywhere)
  mkdir -p "$1" || bench_die "cannot create $1"
  { (: >"$1/.run_all.$$") 2>/dev/null && rm -f "$1/.run_all.$$"; } || bench_die "cannot write in $1"
}
writable "$out"
[ -n "$runs" ] || runs=$(mktemp -d "${TMPDIR:-/tmp}/mpt_run_all.XXXXXX") ||
  bench_die "cannot make a folder for the runs in ${TMPDIR:-/tmp}"
writable "$runs"
echo "results in $out, runs in $runs" >&2
B=$BENCH_SRCDIR/bench
PY=$(bench_python)
want() { [ -z "$only" ] || case " $only " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
step() { echo "== $*" >&2; }

# The manifest: one line per file of the set, "file<TAB>start (UTC)<TAB>seconds<TAB>load
# average before<TAB>commit<TAB>command". A whole run starts it afresh (and removes the files
# of the previous one); --only replaces the lines of the files it remakes.
manifest=$out/manifest.tsv
tree_commit() { # the commit of the source tree; "+changes" when src/ or include/ differ from it
  _c=$(git -C "$BENCH_SRCDIR" rev-parse --short HEAD 2>/dev/null || echo unknown)
  [ -z "$(git -C "$BENCH_SRCDIR" status --porcelain --untracked-files=no -- src include 2>/dev/null)" ] ||
    _c="$_c+changes"
  echo "$_c"
}
commit=$(tree_commit)
if [ -z "$only" ]; then
  if [ -f "$manifest" ]; then
    cut -f1 "$manifest" | while read -r f; do
      case $f in */* | .* | '') ;; *) rm -f "$out/$f" ;; esac
    done
  fi
  : >"$manifest"
fi
touch "$manifest"
shown() { # the command as a reader types it: bench/..., ./mpitrain (from the build folder)
  echo "$*" | sed -e "s|$B/|bench/|g" -e "s|$MPT_BUILD/|./|g" -e "s|$out/|RESULTS/|g" \
    -e "s|$runs/|RUNS/|g" -e "s|$venv|\$MPT_TORCH_VENV|g"
}
note() { # file command...: record FILE in the manifest (after the command that made it)
  _f=$1
  shift
  _end=$(date +%s)
  _tab=$(printf '\t')
  grep -v "^$_f$_tab" "$manifest" >"$manifest.tmp" 2>/dev/null
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$_f" "$(date -u -d "@$_t0" +%FT%H:%MZ)" "$((_end - _t0))" \
    "$_load" "$commit" "$(shown "$*")" >>"$manifest.tmp"
  mv "$manifest.tmp" "$manifest"
}
begin() { _t0=$(date +%s); _load=$(cut -d' ' -f1 /proc/loadavg); commit=$(tree_commit); }
run() { # NAME command...: stdout to NAME.txt (and the terminal), recorded in the manifest
  _name=$1
  shift
  begin
  "$@" </dev/null | tee "$out/$_name.txt"
  note "$_name.txt" "$@"
}
avx2="MPT_CPU_ISA=avx2 OPENBLAS_CORETYPE=Haswell ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2"

# The machine, its libraries, the commit.
{
  echo "date: $(date -u +%FT%H:%MZ)"
  echo "commit: $commit"
  echo "cpu: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1), $(bench_ncpus) CPUs"
  echo "isa: $(grep -o -w -E 'avx2|avx512f|avx512_bf16|amx_bf16|amx_tile' /proc/cpuinfo | sort -u | tr '\n' ' ')"
  echo "memory: $(awk '/^MemTotal/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo)"
  echo "system: Debian $(cat /etc/debian_version 2>/dev/null), kernel $(uname -r)"
  echo "compiler: $(${CC:-gcc} --version 2>/dev/null | head -1)"
  "$MPT_BUILD/mpitrain" --version 2>/dev/null | sed 's/^/mpitrain --version: /'
  echo "pytorch (Debian): $("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null)"
  [ -x "$venv/bin/python" ] &&
    echo "pytorch (PyPI): $("$venv/bin/python" -c 'import torch, transformers; print(torch.__version__, "transformers", transformers.__version__)' 2>/dev/null)"
  echo "gnuplot: $(gnuplot --version 2>/dev/null)"
  echo "mpirun arguments: ${MPT_BENCH_MPIRUN_ARGS:---bind-to none}"
} >"$out/machine.$$" && mv "$out/machine.$$" "$out/machine.txt"

ar() { # name args...: mpt_allreduce_bench with np ranks, text + JSON
  _name=$1
  shift
  bench_wait_idle >/dev/null
  begin
  bench_launch "$np" "$MPT_BUILD/mpt_allreduce_bench" "$@" --json "$out/$_name.json" \
    </dev/null | tee "$out/$_name.txt"
  note "$_name.txt" mpirun -np "$np" ./mpt_allreduce_bench "$@" --json "$_name.json"
  note "$_name.json" "(with $_name.txt)"
}

if want comm; then
  step "all-reduce, $np ranks: comm layer defaults (confirm_collectives on)"
  ar "allreduce_np$np" -b 8 -e 64M -f 2 -n 5 -w 2 -R $((5 * repeats))
  step "all-reduce, $np ranks: confirm_collectives off"
  ar "allreduce_np${np}_noconfirm" -b 8 -e 64M -f 4 -n 5 -w 2 -R $((3 * repeats)) --confirm 0
  step "all-reduce, $np ranks: polling progress (MPI_Iallreduce + MPI_Test on the worker)"
  ar "allreduce_np${np}_polling" -b 8 -e 64M -f 4 -n 5 -w 2 -R $((3 * repeats)) --progress polling
  step "all-reduce, $np ranks: bfloat16 on the wire, against float at the same sizes"
  ar "allreduce_np${np}_float" -b 1M -e 64M -f 4 -n 10 -w 3 -R "$repeats" -d float
  ar "allreduce_np${np}_bfloat16" -b 1M -e 64M -f 4 -n 10 -w 3 -R "$repeats" -d bfloat16
  step "all-reduce, $np ranks: reduce-scatter + all-gather (rs-ag, ZeRO's collectives), average"
  ar "allreduce_np${np}_rsag" -o avg -b 1M -e 64M -f 4 -n 10 -w 3 -R "$repeats" --coll rsag
fi

if want train; then
  step "training: ranks 1, $np, $((2 * np)) (mlp, batch 64 per rank)"
  run train_ranks "$B/train_bench.sh" --sweep-ranks "1,$np,$((2 * np))" --steps 200 \
    --repeats "$repeats" --out "$runs/ranks" --json "$out/train_ranks.json"
  note train_ranks.json "(with train_ranks.txt)"
  step "training: bucket caps (mlp 784-1024x4-10, 16 MiB of gradients), overlap on and off"
  run train_buckets "$B/train_bench.sh" --sweep-buckets 0.25,1,4,8,25,100 --overlap both \
    --np "$np" --steps 50 --repeats "$repeats" --extra "--hidden 1024,1024,1024,1024" \
    --out "$runs/buckets" --json "$out/train_buckets.json"
  note train_buckets.json "(with train_buckets.txt)"
  step "training: DP inside one process (--mode dp --devices cpu:$np)"
  run train_dp "$B/train_bench.sh" --mode dp --devices "cpu:$np" --steps 200 --repeats "$repeats" \
    --out "$runs/dp" --json "$out/train_dp.json"
  note train_dp.json "(with train_dp.txt)"
  step "scaling model: traces of 1 and $np ranks"
  for m in mlp cnn; do
    s=200
    [ "$m" = cnn ] && s=40
    set -- train --model "$m" --synthetic --epochs 2 --max-steps "$s" --test-limit 1000 \
      --threads 1 --no-progress
    bench_wait_idle >/dev/null
    begin
    bench_launch 0 "$MPT_BUILD/mpitrain" "$@" --trace "$out/trace_${m}_np1.json" </dev/null \
      >/dev/null 2>&1 || bench_die "the 1-rank trace run of $m failed"
    note "trace_${m}_np1.json" ./mpitrain "$@" --trace "trace_${m}_np1.json"
    bench_wait_idle >/dev/null
    begin
    bench_launch "$np" "$MPT_BUILD/mpitrain" "$@" --trace "$out/trace_${m}_np$np.json" \
      </dev/null >/dev/null 2>&1 || bench_die "the $np-rank trace run of $m failed"
    note "trace_${m}_np$np.json" mpirun -np "$np" ./mpitrain "$@" --trace "trace_${m}_np$np.json"
    run "scaling_$m" "$PY" "$B/scaling_model.py" --model "$m" --trace1 "$out/trace_${m}_np1.json" \
      --trace2 "$out/trace_${m}_np$np.json" --allreduce "$out/allreduce_np$np.json" \
      --json "$out/scaling_$m.json"
    note "scaling_$m.json" "(with scaling_$m.txt)"
    # The same with compute 100x faster (an accelerator): what the network alone allows.
    run "scaling_${m}_x0.01" "$PY" "$B/scaling_model.py" --model "$m" \
      --trace1 "$out/trace_${m}_np1.json" --compute-scale 0.01 --json "$out/scaling_${m}_x0.01.json"
    note "scaling_${m}_x0.01.json" "(with scaling_${m}_x0.01.txt)"
  done
fi

if want torch; then
  step "mpitrain against PyTorch DDP (gloo), 1.13 and PyPI's, $np ranks"
  run compare_torch_mlp "$B/compare_torch.sh" --torch both --model mlp --np "$np" --steps 300 \
    --repeats "$repeats" --out "$runs/torch_mlp" --json "$out/compare_torch_mlp.json"
  note compare_torch_mlp_debian.json "(with compare_torch_mlp.txt)"
  note compare_torch_mlp_pypi.json "(with compare_torch_mlp.txt)"
  run compare_torch_cnn "$B/compare_torch.sh" --torch both --model cnn --np "$np" --steps 60 \
    --repeats "$repeats" --out "$runs/torch_cnn" --json "$out/compare_torch_cnn.json"
  note compare_torch_cnn_debian.json "(with compare_torch_cnn.txt)"
  note compare_torch_cnn_pypi.json "(with compare_torch_cnn.txt)"
  step "the comm thread spinning against yielding"
  run comm_yield_mlp "$B/comm_yield.sh" --model mlp --pairs $((2 * repeats + 1)) --np "$np"
  run comm_yield_cnn "$B/comm_yield.sh" --model cnn --pairs $((2 * repeats - 1)) \
    --train-limit 4096 --np "$np"
fi

if want gemm; then
  step "GEMM libraries on the mlp's and gpt-mini's products, one thread"
  run gemm_mlp "$MPT_BUILD/mpt_gemm_bench" --model mlp --threads 1 --reps 21
  run gemm_gpt_mini "$MPT_BUILD/mpt_gemm_bench" --model gpt-mini --threads 1 --reps 5
  if [ -x "$venv/bin/python" ]; then
    run gemm_gpt_mini_torch "$venv/bin/python" "$B/torch_gemm.py" --model gpt-mini --threads 1 --reps 5
  fi
  step "--gemm auto against --gemm tune"
  run gemm_tune "$B/gemm_tune.sh" --pairs "$repeats" --np "$np"
  step "the fused causal attention against the reference, 1 and 2 threads"
  run attn_fused sh -c "for t in 1 2; do '$MPT_BUILD/mpt_attn_bench' 8 256 384 6 \$t 20; done"
  step "the fused GPT ops and AdamW against the memory bandwidth, one thread"
  run fused_ops "$MPT_BUILD/mpt_fused_bench" --model gpt-mini --reps 15
  run fused_ops_avx2 env $avx2 "$MPT_BUILD/mpt_fused_bench" --model gpt-mini --reps 15
  # The candidate libraries the build found (./setup.sh bench installs BLIS and libxsmm) and
  # MKL from PyPI (the library links none of them): their columns beside OpenBLAS and oneDNN
  # on the mlp's small products and the attention's blocks.
  cand=""
  for b in blis xsmm; do
    "$MPT_BUILD/mpt_gemm_bench" --backends "openblas,$b" --only none --reps 1 >/dev/null 2>&1 &&
      cand="$cand,$b"
  done
  # MKL: PyPI's mkl package, in the PyTorch virtual environment when there is one
  if [ -x "$venv/bin/pip" ]; then
    mkl_rt() { ls "$venv"/lib/libmkl_rt.so.* 2>/dev/null | head -n 1; }
    [ -n "$(mkl_rt)" ] || "$venv/bin/pip" install --quiet mkl >&2 || true
    if [ -n "$(mkl_rt)" ]; then
      MPT_BENCH_MKL=$(mkl_rt)
      export MPT_BENCH_MKL
      "$MPT_BUILD/mpt_gemm_bench" --backends openblas,mkl --only none --reps 1 >/dev/null 2>&1 &&
        cand="$cand,mkl"
    fi
  fi
  if [ -n "$cand" ]; then
    step "candidate GEMM libraries ($cand) on the mlp's and the attention's products"
    run gemm_candidates "$MPT_BUILD/mpt_gemm_bench" --model mlp --threads 1 --reps 21 \
      --backends "openblas,sgemm,mpt$cand"
    run gemm_candidates_avx2 env $avx2 LIBXSMM_TARGET=hsw "$MPT_BUILD/mpt_gemm_bench" \
      --model mlp --threads 1 --reps 21 --backends "openblas,sgemm,mpt$cand"
    run gemm_candidates_attn_avx2 env $avx2 LIBXSMM_TARGET=hsw "$MPT_BUILD/mpt_gemm_bench" \
      --model gpt-mini --only attn --threads 1 --reps 9 --backends "openblas,sgemm,mpt$cand"
  fi
fi

if want avx2; then
  # The CPU's own kernels run above; here AVX2 is forced on both sides (mpitrain's kernels,
  # OpenBLAS's Haswell kernels, oneDNN capped at AVX2, PyTorch's ATen and MKL at AVX2).
  step "AVX2 forced: mlp and cnn against PyTorch DDP, $np ranks"
  run compare_torch_avx2 env $avx2 "$B/compare_torch.sh" --torch both --model mlp,cnn \
    --np "$np" --steps 150 --repeats "$repeats" --out "$runs/torch_avx2" \
    --json "$out/compare_torch_avx2.json"
  note compare_torch_avx2_debian.json "(with compare_torch_avx2.txt)"
  note compare_torch_avx2_pypi.json "(with compare_torch_avx2.txt)"
  step "AVX2 forced: the GEMM libraries on the mlp's and gpt-mini's products, one thread"
  run gemm_mlp_avx2 env $avx2 "$MPT_BUILD/mpt_gemm_bench" --model mlp --threads 1 --reps 21
  run gemm_gpt_mini_avx2 env $avx2 "$MPT_BUILD/mpt_gemm_bench" --model gpt-mini --threads 1 --reps 5
  step "AVX2 forced: gpt-mini against both PyTorch versions, 1 and $np ranks"
  run compare_gpt_mini_avx2 env $avx2 "$B/compare_gpt.sh" --model gpt-mini --np "1,$np" \
    --torch both --repeats 2 --steps 5 --warmup 1 --out "$runs/gpt_mini_avx2" \
    --json "$out/compare_gpt_mini_avx2.json"
  note compare_gpt_mini_avx2.json "(with compare_gpt_mini_avx2.txt)"
fi

if want gpt; then
  step "GPT: gpt-mini (B 8, T 256) and llama-mini against both PyTorch versions, 1 and $np ranks"
  run compare_gpt_mini "$B/compare_gpt.sh" --model gpt-mini --np "1,$np" --torch both \
    --repeats 2 --steps 5 --warmup 1 --out "$runs/gpt_mini" --json "$out/compare_gpt_mini.json"
  note compare_gpt_mini.json "(with compare_gpt_mini.txt)"
  run compare_llama_mini "$B/compare_gpt.sh" --model llama-mini --np "1,$np" --torch both \
    --repeats 2 --steps 5 --warmup 1 --out "$runs/llama_mini" --json "$out/compare_llama_mini.json"
  note compare_llama_mini.json "(with compare_llama_mini.txt)"
  step "GPT: gpt-mini DDP, $np ranks, bucket caps 1,5,25 MiB, overlap on and off"
  run gpt_mini_ddp "$B/compare_gpt.sh" --model gpt-mini --np "$np" --torch none --steps 4 \
    --warmup 1 --repeats 1 --bucket-cap-mb 1,5,25 --overlap both --out "$runs/gpt_ddp" \
    --json "$out/gpt_mini_ddp.json"
  note gpt_mini_ddp.json "(with gpt_mini_ddp.txt)"
  if "$MPT_BUILD/mpitrain" --version 2>/dev/null | grep -q 'bf16 compute (CPU): yes'; then
    step "GPT: gpt-mini, bf16 against fp32, $np ranks"
    run compare_gpt_mini_bf16 "$B/compare_gpt.sh" --model gpt-mini --np "$np" --torch both \
      --precision fp32,bf16 --steps 4 --warmup 1 --repeats 1 --out "$runs/gpt_bf16" \
      --json "$out/compare_gpt_mini_bf16.json"
    note compare_gpt_mini_bf16.json "(with compare_gpt_mini_bf16.txt)"
  fi
  step "GPT: gpt2 (B 4, T 512) against both PyTorch versions, 1 process"
  run compare_gpt_gpt2 "$B/compare_gpt.sh" --model gpt2 --np 1 --torch both --repeats 1 \
    --steps 2 --warmup 1 --out "$runs/gpt2" --json "$out/compare_gpt_gpt2.json"
  note compare_gpt_gpt2.json "(with compare_gpt_gpt2.txt)"
  step "the flight recorder's cost: gpt-mini, $np ranks, default against --flight-recorder 0"
  run flight_recorder_cost "$B/flight_recorder_cost.sh" --np "$np" --pairs $((repeats + 2))
  step "GPT: gpt-mini on the fortunes, 150 steps, $np ranks"
  run gpt_fortunes "$B/gpt_fortunes.sh" --np "$np" --steps 150 --val-every 25 \
    --out "$runs/gpt_fortunes" --json "$out/gpt_fortunes.json"
  note gpt_fortunes.json "(with gpt_fortunes.txt)"
fi

if want zero; then
  step "ZeRO 0-3 +- --recompute: memory per rank and step time; gpt2-large at 2 ranks"
  begin
  (cd "$MPT_BUILD" && STEPS=4 sh "$B/zero_stages.sh" "$out/zero_memory.txt")
  cat "$out/zero_memory.txt"
  note zero_memory.txt "STEPS=4 bench/zero_stages.sh zero_memory.txt (from the build folder)"
  begin
  (cd "$MPT_BUILD" && PAIRS=$repeats STEPS=4 ROWS=0 sh "$B/zero_stages.sh" "$out/zero_step_time.txt")
  cat "$out/zero_step_time.txt"
  note zero_step_time.txt "PAIRS=$repeats STEPS=4 ROWS=0 bench/zero_stages.sh zero_step_time.txt"
  begin
  (cd "$MPT_BUILD" && ROWS=0 HEADLINE=1 STEPS=3 sh "$B/zero_stages.sh" "$out/zero_gpt2_large.txt")
  cat "$out/zero_gpt2_large.txt"
  note zero_gpt2_large.txt "ROWS=0 HEADLINE=1 STEPS=3 bench/zero_stages.sh zero_gpt2_large.txt"
fi

if want ckpt; then
  step "the checkpoint stall, --checkpoint-async off and on"
  begin
  (cd "$MPT_BUILD" && sh "$B/ckpt_stall.sh" "$out/ckpt_stall.txt")
  cat "$out/ckpt_stall.txt"
  note ckpt_stall.txt "bench/ckpt_stall.sh ckpt_stall.txt (from the build folder)"
fi

if want hf; then
  step "Hugging Face interop against transformers (PyPI)"
  run hf_interop "$B/hf_interop.sh" --steps 10 --out "$runs/hf"
fi

step "plots"
"$B/plot.sh" --in "$out" --out "$out"
for p in "$out"/*.png; do
  [ -f "$p" ] && begin && note "$(basename "$p")" bench/plot.sh --in RESULTS --out RESULTS
done
step "README.md"
"$PY" "$B/results_readme.py" --dir "$out" >"$out/README.md.$$" && mv "$out/README.md.$$" "$out/README.md"
echo "done: $out/README.md" >&2
