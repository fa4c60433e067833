#!/bin/sh
# Stragglers (docs/hangs.md): 2 DDP ranks, 32 steps, a step line every 8 (4 intervals). One rank
# is slowed by fault injection (MPT_TEST_SLOW_RANK / MPT_TEST_SLOW_PCT: it sleeps as long again
# as each forward took, which counts as compute):
#   1. slowing rank 1: within the first 2 intervals rank 0 warns with a line naming rank 1 (and
#      its host, as the rank's start line names it) as the slowest; the metrics JSON has the 4
#      intervals, at least one warning, and rank 1 as the slowest at the largest ratio (> 1.2);
#   2. slowing rank 0 instead: the line follows the fault and names rank 0;
#   3. --straggler-warn 1000 with rank 1 slowed: the line is logged as info, no warning, and the
#      JSON counts 0 warnings;
#   4. one process: no interval, "last" and "max" are null; --straggler-warn below 1: status 2.
# Sleeping a whole forward per step is a large margin: ratios of 1.9-3.7 were measured here
# (1.2-2.3 when sleeping half of it).
# Needs --enable-fault-injection and python3. Prints "N passed, N failed".
set -u
dir=$(dirname "$0")
. "$dir/fault_injection.sh"
require_fault_injection
command -v "${MPIRUN:-mpirun}" > /dev/null 2>&1 || { echo "$0: no mpirun; skipping"; exit 77; }
command -v python3 > /dev/null 2>&1 || { echo "$0: no python3; skipping"; exit 77; }
prog=$(pwd)/mpitrain
[ -x "$prog" ] || { echo "$0: $prog not found (run from the build directory)"; exit 1; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mpt_straggler.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
train="train --synthetic --train-limit 2048 --test-limit 64 --epochs 1 --batch-size 32
  --hidden 512 --no-progress --threads 1 --log-every 8"

# run NAME SLOW_RANK [ARGS...]: the 2-rank job with that rank slowed; output in $tmp/NAME.out,
# metrics in $tmp/NAME.json.
run() {
  name=$1 slow=$2
  shift 2
  # shellcheck disable=SC2086 # $train is a list of words
  MPT_MPIRUN_ARGS="-x MPT_TEST_SLOW_RANK=$slow -x MPT_TEST_SLOW_PCT=100" "$dir/mpirun.sh" 2 180 \
    "$prog" $train --metrics-json "$tmp/$name.json" "$@" > "$tmp/$name.out" 2>&1
  rc=$?
  grep "stragglers" "$tmp/$name.out"
  [ $rc -eq 0 ] && ok || { bad "$name: status $rc"; tail -n 5 "$tmp/$name.out"; }
}
# json NAME SLOW WANT_WARNINGS(any|0): the metrics' stragglers object.
json() {
  python3 - "$tmp/$1.json" "$2" "$3" "$4" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))["stragglers"]
slow, warnings, host = int(sys.argv[2]), sys.argv[3], sys.argv[4]
m = s["max"]
errs = []
if s["intervals"] != 4: errs.append("intervals %r, want 4" % s["intervals"])
if s["warn_above"] != (1000 if warnings == "0" else 1.2): errs.append("warn_above %r" % s["warn_above"])
if warnings == "0" and s["warnings"] != 0: errs.append("warnings %r, want 0" % s["warnings"])
if warnings == "any" and s["warnings"] < 1: errs.append("warnings %r, want >= 1" % s["warnings"])
if (m["slowest_rank"], m["fastest_rank"]) != (slow, 1 - slow):
    errs.append("max: slowest %r fastest %r, want %d and %d" % (m["slowest_rank"], m["fastest_rank"], slow, 1 - slow))
if not m["ratio"] > 1.2: errs.append("max ratio %r, want > 1.2" % m["ratio"])
if abs(m["ratio"] - m["slowest_compute_ms"] / m["fastest_compute_ms"]) > 1e-3 * m["ratio"]:
    errs.append("max ratio %r is not slowest / fastest" % m["ratio"])
if m["slowest_host"] != host: errs.append("slowest host %r, want %r" % (m["slowest_host"], host))
if errs:
    print("FAIL: metrics stragglers: " + "; ".join(errs) + ": " + json.dumps(s))
    sys.exit(1)
PY
}
# host_of NAME RANK: the host the rank's start line names.
host_of() { sed -n "s/^mpitrain: rank $2\/2 .* host \([^ ]*\) .*/\1/p" "$tmp/$1.out" | head -n 1; }
# named NAME RANK: one of the first two straggler lines is a warning naming RANK the slowest.
named() {
  h=$(host_of "$1" "$2")
  grep "stragglers: slowest rank" "$tmp/$1.out" | head -n 2 |
    grep -q "warning: stragglers: slowest rank $2 (host $h) [0-9.]* ms/step of compute, fastest rank $((1 - $2)) (host [^)]*) [0-9.]* ms/step, ratio [0-9.]*: above --straggler-warn (steps [0-9]*-[0-9]*)$"
}

# 1. rank 1 slowed
run slow1 1
named slow1 1 && ok || bad "slow1: no warning naming rank 1 the slowest in the first 2 intervals"
[ "$(grep -c "stragglers: slowest rank" "$tmp/slow1.out")" -eq 4 ] && ok ||
  bad "slow1: want 4 straggler lines (32 steps, --log-every 8)"
json slow1 1 any "$(host_of slow1 1)" && ok || bad "slow1: metrics JSON"

# 2. rank 0 slowed: the line follows
run slow0 0
named slow0 0 && ok || bad "slow0: no warning naming rank 0 the slowest in the first 2 intervals"
json slow0 0 any "$(host_of slow0 0)" && ok || bad "slow0: metrics JSON"

# 3. a threshold above any ratio: info lines, no warning
run quiet 1 --straggler-warn 1000
[ "$(grep -c "info: stragglers: slowest rank .* ratio [0-9.]* (steps" "$tmp/quiet.out")" -eq 4 ] &&
  ! grep -q "warning: stragglers" "$tmp/quiet.out" && ok ||
  bad "quiet: want 4 info lines and no warning with --straggler-warn 1000"
json quiet 1 0 "$(host_of quiet 1)" && ok || bad "quiet: metrics JSON"

# 4. one process; a threshold below 1
# shellcheck disable=SC2086
OPENBLAS_NUM_THREADS=1 timeout 120 "$prog" $train --metrics-json "$tmp/one.json" > "$tmp/one.out" 2>&1
rc=$?
[ $rc -eq 0 ] && ! grep -q "stragglers" "$tmp/one.out" &&
  python3 -c 'import json, sys
s = json.load(open(sys.argv[1]))["stragglers"]
sys.exit(0 if (s["intervals"], s["warnings"], s["last"], s["max"]) == (0, 0, None, None) else 1)' "$tmp/one.json" &&
  ok || bad "one process: status $rc, want no straggler line and an empty stragglers object"
out=$("$prog" train --synthetic --straggler-warn 0.5 2>&1)
rc=$?
[ $rc -eq 2 ] && printf '%s' "$out" | grep -q -- "--straggler-warn: 0.5 is outside \[1, " && ok ||
  bad "--straggler-warn 0.5: status $rc: $out"

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
