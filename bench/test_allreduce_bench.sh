#!/bin/sh
# shellcheck disable=SC2086 # $sizes is a list of words
# mpt_allreduce_bench (bench/allreduce.c) at small sizes: every reduction and datatype it
# supports comes out right over 2 and 3 ranks (its own check compares each element with the
# exact result: the run exits 0 only with 0 wrong values), the table has one row per size, the
# JSON mirrors it, a corrupted value is caught (exit 1, "WRONG"), and bad usage exits 2 with a
# message naming the problem. No timing is checked. Also --coll reducescatter and allgather and
# -d bfloat16: exact at 2, 3 and 4 ranks (shards not divisible by the world size),
# the bus-bandwidth factor in the JSON ((n - 1) / n for both, 2 (n - 1) / n for all-reduce), the
# per-rank count column, and a corrupted value caught. --coll rsag (an all-reduce as
# reduce-scatter + all-gather, DDP's rs-ag): exact at 3 and 4 ranks, the all-reduce's bus factor,
# a corrupted value caught, -o max refused. Prints "N passed, N failed".
set -u
case ${1:-} in
  -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d' | grep -v shellcheck | sed 's/^# \{0,1\}//'; exit 0 ;;
esac
here=$(dirname "$0")
prog=${MPT_ALLREDUCE_BENCH:-./mpt_allreduce_bench}
mpirun_sh=$here/../tests/mpirun.sh
PY=python3
[ -x /usr/bin/python3 ] && PY=/usr/bin/python3
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mpt_test_arbench.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }

# np status pattern args...: runs under mpirun, wants the status and the pattern in the output
run() {
  np=$1 want=$2 pattern=$3
  shift 3
  out=$("$mpirun_sh" "$np" 60 "$prog" "$@" 2>&1)
  got=$?
  [ "$got" -eq 77 ] && { echo "SKIP: no mpirun"; exit 77; }
  if [ "$got" -eq "$want" ] && printf '%s\n' "$out" | grep -q -- "$pattern"; then
    ok
  else
    bad "-np $np $* -> status $got (want $want), output lacks '$pattern':"
    printf '%s\n' "$out" | tail -n 8
  fi
}

# Sizes 4 B .. 1 MiB by 4: 10 rows (a word list: unquoted on purpose below).
# shellcheck disable=SC2086
sizes="-b 4 -e 1M -f 4 -n 2 -w 1"
for op in sum min max avg; do
  run 2 0 "Out of bounds values : 0 OK" $sizes -o $op -d float
done
for op in sum min max; do
  run 2 0 "Out of bounds values : 0 OK" $sizes -o $op -d int32
done
run 3 0 "Out of bounds values : 0 OK" $sizes -o sum
run 3 0 "Out of bounds values : 0 OK" $sizes -o avg --confirm 0 -z 1
run 2 0 "Out of bounds values : 0 OK" $sizes --raw iallreduce -R 3
run 2 0 "progress polling" $sizes --progress polling -o max
run 2 0 "progress blocking" $sizes --progress blocking --confirm 0

# The table: 10 rows, #wrong columns (5th and 9th after the 4 leading ones) all 0.
out=$("$mpirun_sh" 2 60 "$prog" $sizes --json "$tmp/ar.json" 2>&1)
rows=$(printf '%s\n' "$out" | grep -c '^ *[0-9]')
wrong=$(printf '%s\n' "$out" | awk '/^ *[0-9]/ { s += $8 + $12 } END { print s + 0 }')
if [ "$rows" -eq 10 ] && [ "$wrong" -eq 0 ]; then ok; else bad "table: $rows rows (want 10), wrong sum $wrong"; fi
if "$PY" - "$tmp/ar.json" <<'PYEOF'
import json, sys
j = json.load(open(sys.argv[1]))
assert j["world_size"] == 2, j["world_size"]
assert [r["bytes"] for r in j["rows"]] == [4 << (2 * i) for i in range(10)], j["rows"]
assert all(r[k]["wrong"] == 0 for r in j["rows"] for k in ("out_of_place", "in_place"))
assert j["summary"]["wrong"] == 0 and j["summary"]["sizes_ge_1mib"] == 1
assert len(j["ranks"]) == 2 and {r["rank"] for r in j["ranks"]} == {0, 1}
PYEOF
then ok; else bad "JSON mirror"; fi

# The checker catches a wrong value (one per size on rank 0: 10 sizes).
out=$(MPT_BENCH_INJECT_WRONG=1 MPT_MPIRUN_ARGS="-x MPT_BENCH_INJECT_WRONG" "$mpirun_sh" 2 60 "$prog" $sizes 2>&1)
got=$?
if [ "$got" -eq 1 ] && printf '%s\n' "$out" | grep -q "Out of bounds values : 10 WRONG"; then ok
else bad "injected wrong values: status $got"; printf '%s\n' "$out" | tail -n 4; fi

# Reduce-scatter, all-gather and bfloat16: exact at 2, 3 and 4 ranks.
for np in 2 3 4; do
  run $np 0 "Out of bounds values : 0 OK" $sizes --coll reducescatter
  run $np 0 "Out of bounds values : 0 OK" $sizes --coll allgather
  run $np 0 "Out of bounds values : 0 OK" $sizes -d bfloat16
done
run 3 0 "Out of bounds values : 0 OK" $sizes --coll reducescatter -o avg -d bfloat16 --confirm 0
run 3 0 "Out of bounds values : 0 OK" $sizes --coll reducescatter -d int32 --progress polling
run 2 0 "Out of bounds values : 0 OK" $sizes --coll allgather -d bfloat16 -z 1
# rsag (reduce-scatter + all-gather of the shards, checked as an all-reduce)
run 3 0 "Out of bounds values : 0 OK" $sizes --coll rsag -o avg
run 4 0 "Out of bounds values : 0 OK" $sizes --coll rsag -d bfloat16
run 1 2 "--coll rsag takes -o sum or avg" $sizes --coll rsag -o max
for coll in reducescatter allgather rsag; do
  out=$(MPT_BENCH_INJECT_WRONG=1 MPT_MPIRUN_ARGS="-x MPT_BENCH_INJECT_WRONG" "$mpirun_sh" 2 60 "$prog" $sizes --coll $coll 2>&1)
  got=$?
  if [ "$got" -eq 1 ] && printf '%s\n' "$out" | grep -q "Out of bounds values : 10 WRONG"; then ok
  else bad "injected wrong values, --coll $coll: status $got"; printf '%s\n' "$out" | tail -n 4; fi
done
# busbw / algbw per collective at 3 ranks, and the per-rank count (ceil(count / 3)).
for coll in allreduce reducescatter allgather rsag; do
  "$mpirun_sh" 3 60 "$prog" $sizes --coll $coll --json "$tmp/$coll.json" >/dev/null 2>&1 ||
    bad "--coll $coll --json at 3 ranks failed"
  if "$PY" - "$tmp/$coll.json" "$coll" <<'PYEOF'
import json, sys
j = json.load(open(sys.argv[1]))
coll = sys.argv[2]
assert j["benchmark"] == coll, j["benchmark"]
want = 2 * 2 / 3 if coll in ("allreduce", "rsag") else 2 / 3
for r in j["rows"]:
    for k in ("out_of_place", "in_place", "raw_out_of_place", "raw_in_place"):
        v = r[k]
        assert abs(v["busbw_gbps"] - v["algbw_gbps"] * want) <= 1e-4 * v["algbw_gbps"] + 1e-9, (k, v)
    per = r["count"] if coll in ("allreduce", "rsag") else -(-r["count"] // 3)
    assert r["count_per_rank"] == per, r
PYEOF
  then ok; else bad "--coll $coll: bus factor or per-rank count in the JSON"; fi
done

# Bad usage: exit 2 with a message.
run 1 2 "not allreduce, reducescatter, allgather or" --coll alltoall
run 1 2 "reducescatter takes -o sum or avg" --coll reducescatter -o max
run 1 2 "bfloat16 takes -o sum or avg" -d bfloat16 -o min
run 1 2 "iallreduce is for --coll allreduce" --coll allgather --raw iallreduce
run 1 2 "no prod reduction" -o prod
run 1 2 "datatype 'double' is not supported" -d double
if grep -q "define MPT_HAVE_NCCL 1" config.h 2>/dev/null; then
  run 1 2 "needs --backend mpi --device cpu" --coll allgather --backend nccl
fi
run 1 2 "avg needs -d float" -o avg -d int32
run 1 2 "larger than -e" -b 2M -e 1M
run 1 2 "is not a size" -b 12Q
run 1 2 "is not blocking or polling" --progress sometimes
run 1 0 "usage: mpirun" --help
if ! grep -q "define MPT_HAVE_NCCL 1" config.h 2>/dev/null; then
  run 1 2 "has no NCCL" --backend nccl
fi
# faults.md F47: a --json the run cannot write (a folder, a missing folder) failed only after
# every size was measured; now at once, before the table. The file is written atomically.
for j in "$tmp" "$tmp/no/such/dir/r.json"; do
  out=$("$mpirun_sh" 2 60 "$prog" -b 8 -e 8 --json "$j" 2>&1)
  got=$?
  [ "$got" -eq 1 ] && printf '%s' "$out" | grep -q -- "--json: cannot write '$j'" &&
    ! printf '%s' "$out" | grep -q "Avg bus bandwidth" && ok ||
    bad "--json $j: status $got: $(printf '%s' "$out" | grep -v '^\[' | tail -n 2)"
done
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
