#!/bin/sh
# bench/gpt_fortunes.sh: gpt-mini trained on Debian's fortunes with DDP (docs/gpt.md), the
# validation loss (nats per byte: the vocabulary is bytes) against steps, and a generated sample.
#
#   bench/gpt_fortunes.sh [--np 2] [--steps 500] [--val-every 50] --json gpt_fortunes.json
#
# The shards are data/fortunes (made with `mpitrain tokenize --bytes --val-fraction 0.1`, as in
# docs/gpt.md, when missing). The run: `mpirun -np W mpitrain train --model gpt-mini --shards ...
# --val-shards ... --max-steps N --warmup-steps 20 --val-every K --log-every K --val-steps 5 --save-model
# OUT/gpt-mini.bin`; then `mpitrain generate --model-file OUT/gpt-mini.bin --prompt 'Q: '
# --tokens 200 --temperature 0.8 --top-k 40 --seed 1`. Prints the curve and the sample; --json
# writes both with the commands.
set -u
. "$(dirname "$0")/bench_lib.sh"

usage() {
  cat <<'EOF'
usage: bench/gpt_fortunes.sh [options]
  --build DIR       build folder with mpitrain (default: $MPT_BUILD, ., build, build-*)
  --np W            ranks (default 2; 1 = one process)
  --steps N         training steps (default 500)
  --val-every K     validation every K steps (default 50)
  --threads N       BLAS threads per rank (default: CPUs / ranks)
  --out DIR         keep the log and the model file here (default: a temporary folder)
  --json FILE       write the curve and the sample as JSON
  -h, --help
EOF
}
np=2 steps=500 every=50 threads="" out="" json=""
while [ $# -gt 0 ]; do
  case $1 in -h|--help) usage; exit 0 ;; esac
  [ $# -ge 2 ] || bench_die "$1 needs a value (see --help)"
  case $1 in
    --build) MPT_BUILD=$2 ;;
    --np) np=$2 ;;
    --steps) steps=$2 ;;
    --val-every) every=$2 ;;
    --threads) threads=$2 ;;
    --out) out=$2 ;;
    --json) json=$2 ;;
    *) usage >&2; bench_die "unknown option '$1'" ;;
  esac
  shift 2
done
for v in "$np" "$steps" "$every" ${threads:+"$threads"}; do
  case $v in ''|*[!0-9]*) bench_die "'$v' is not a positive integer" ;; esac
  [ "$v" -ge 1 ] || bench_die "'$v' is not a positive integer"
done
bench_find_build
[ -n "$threads" ] || threads=$(($(bench_ncpus) / np))
[ "$threads" -ge 1 ] || threads=1
if [ -z "$out" ]; then
  out=$(mktemp -d "${TMPDIR:-/tmp}/mpt_gpt_fortunes.XXXXXX")
  echo "runs in $out" >&2
fi
mkdir -p "$out" || bench_die "cannot create $out"
data=$BENCH_SRCDIR/data/fortunes
if ! [ -f "$data/train_000000.bin" ]; then
  echo "making $data: mpitrain tokenize --bytes --val-fraction 0.1" >&2
  # shellcheck disable=SC2046 # file list
  "$MPT_BUILD/mpitrain" tokenize --bytes --val-fraction 0.1 -o "$data" \
    $(find /usr/share/games/fortunes -type f ! -name '*.dat' 2>/dev/null | sort) >&2 ||
    bench_die "cannot tokenize the fortunes (apt-get install fortunes)"
fi
OPENBLAS_NUM_THREADS=$threads OMP_NUM_THREADS=$threads
export OPENBLAS_NUM_THREADS OMP_NUM_THREADS
set -- train --model gpt-mini --shards "$data/train_*.bin" --val-shards "$data/val_*.bin" \
  --max-steps "$steps" --warmup-steps 20 --val-every "$every" --log-every "$every" --val-steps 5 \
  --threads "$threads" \
  --save-model "$out/gpt-mini.bin"
launch=$np
[ "$np" -eq 1 ] && launch=0
train_cmd="mpitrain $*"
[ "$launch" -gt 0 ] && train_cmd="mpirun -np $np $train_cmd"
echo "$train_cmd" >&2
bench_launch "$launch" "$MPT_BUILD/mpitrain" "$@" </dev/null >"$out/train.log" 2>&1 ||
  { tail -5 "$out/train.log" >&2; bench_die "the training run failed (log: $out/train.log)"; }
set -- generate --model-file "$out/gpt-mini.bin" --prompt 'Q: ' --tokens 200 \
  --temperature 0.8 --top-k 40 --seed 1
gen_cmd="mpitrain $*"
bench_launch 0 "$MPT_BUILD/mpitrain" "$@" </dev/null >"$out/sample.txt" 2>"$out/generate.log" ||
  { cat "$out/generate.log" >&2; bench_die "generate failed"; }

BENCH_SRCDIR=$BENCH_SRCDIR "$(bench_python)" - "$out/train.log" "$out/sample.txt" "$train_cmd" "$gen_cmd" "$json" \
  "$MPT_BUILD" <<'EOF'
import json, os, re, sys
sys.path.insert(0, os.path.join(os.environ.get("BENCH_SRCDIR", "."), "bench"))
log, sample_path, train_cmd, gen_cmd, out_json, build = sys.argv[1:7]
text = open(log).read()
val = [(int(s), float(v)) for s, v in re.findall(r"step +(\d+)  val loss ([0-9.]+) nats/token",
                                                 text)]
train = [(int(s), float(v)) for s, v in re.findall(r"step +(\d+)/\d+  loss ([0-9.]+)", text)]
done = re.search(r"done: .*", text)
rss = re.search(r"peak resident memory per rank .*", text) or \
    re.search(r"memory at the end, rank 0: .*", text)
sample = open(sample_path, encoding="utf-8", errors="replace").read()
print("# gpt-mini on the fortunes: validation loss (nats per byte) against steps")
print("# " + train_cmd)
print("%6s %10s %12s" % ("step", "val loss", "train loss"))
tl = dict(train)
for s, v in val:
    print("%6d %10.4f %12s" % (s, v, "%.4f" % tl[s] if s in tl else "-"))
if done:
    print("# " + done.group(0))
if rss:
    print("# " + rss.group(0))
print("\n# sample: " + gen_cmd)
print(sample.rstrip("\n"))
if out_json:
    from summarize import machine_info
    machine, versions = machine_info(build)
    with open(out_json, "w") as f:
        json.dump({"benchmark": "gpt_fortunes", "machine": machine, "versions": versions,
                   "command": train_cmd, "generate_command": gen_cmd,
                   "val_loss_nats_per_byte": [{"step": s, "loss": v} for s, v in val],
                   "train_loss": [{"step": s, "loss": v} for s, v in train],
                   "summary": done.group(0) if done else None,
                   "peak_rss": rss.group(0) if rss else None, "sample": sample}, f, indent=1)
        f.write("\n")
sys.exit(0 if val else 1)
EOF
