#!/bin/sh
# `mpitrain hang-report DIR` on dump files written here by hand (the format of src/comm/flight.c,
# docs/hangs.md), one process, no MPI. Each case compares the whole report with the text it must
# be, and its exit status:
#   1. ranks that agree: every collective finished on every rank, no difference;
#   2. ranks that diverge (3 ranks): one inside the collective for 7.0 s, one queued behind
#      another, one that never entered it; one rank's steps jump from 2 to 4 (a skipped step),
#      so its collectives pair with other steps' and the signatures differ;
#   3. a rank that left no dump, named with the host and pid the others recorded for it;
#   4. dumps cut short: one without its end line and with a half-written last line, one that is
#      only the .tmp of a rank killed while writing, an empty .tmp;
#   5. garbage: a file named like a dump that is not one is named on stderr, left out, status 1
#      (the report of the others is still printed); a folder with garbage only: status 1;
#   6. --json of case 2, read with python3 (checked field by field);
#   7. usage: no folder, an unknown option, two folders (status 2), a missing folder (status 1).
# Prints "N passed, N failed".
set -u
prog=./mpitrain
[ -x "$prog" ] || { echo "$0: $prog not found (run from the build directory)"; exit 1; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mpt_hang_report.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }

# head_of FILE RANK WORLD HOST PID REASON NOW_MS NEXT_SEQ: the header lines of a dump, then a
# peer line for every rank (rank r on host h<r>, pid 100 + r).
head_of() {
  {
    echo "mpitrain-flight-recorder 1"
    echo "rank $2 of $3"
    echo "host $4"
    echo "pid $5"
    echo "reason $6"
    echo "now_ms $7"
    echo "wall_s 1796339655"
    echo "timeout_ms 5000.000"
    echo "capacity 2000"
    echo "next_seq $8"
    pr=0
    while [ $pr -lt "$3" ]; do echo "peer $pr pid $((100 + pr)) host h$pr"; pr=$((pr + 1)); done
  } > "$1"
}
# coll FILE SEQ OP COUNT STEP STATE PURPOSE [START_MS]: one collective line (float32, arg 1).
coll() {
  st=${8:-1000.000}
  en=0.000
  [ "$6" = done ] && en=2000.000
  [ "$6" = queued ] && st=0.000
  echo "c seq=$2 op=$3 dtype=float32 count=$4 arg=1 step=$5 state=$6 enq=900.000 start=$st end=$en purpose=$7" >> "$1"
}
# steps FILE FIRST LAST: a healthy run's collectives for steps FIRST..LAST, two per step (stop
# vote #2s, gradient bucket #2s+1), all done.
steps() {
  s=$2
  while [ "$s" -le "$3" ]; do
    coll "$1" $((2 * s)) all-reduce 1 "$s" done "stop vote"
    coll "$1" $((2 * s + 1)) all-reduce 25450 "$s" done "grad bucket 0"
    s=$((s + 1))
  done
}
# check NAME WANT_STATUS EXPECTED_FILE -- ARGS: the report's stdout equals EXPECTED_FILE exactly.
check() {
  name=$1 want=$2 exp=$3
  shift 4
  "$prog" hang-report "$@" > "$tmp/got" 2> "$tmp/err"
  got=$?
  if [ $got -ne "$want" ]; then
    bad "$name: status $got (want $want); stderr: $(cat "$tmp/err")"
  elif ! diff "$exp" "$tmp/got" > "$tmp/diff"; then
    bad "$name: the report differs from the expected one (< expected, > got):"
    cat "$tmp/diff"
  else
    ok
  fi
}

# 1. Two ranks that agree.
d=$tmp/agree
mkdir "$d"
for r in 0 1; do
  head_of "$d/flight-rank$r.txt" $r 2 h$r $((100 + r)) SIGUSR2 5000.000 8
  steps "$d/flight-rank$r.txt" 0 3
  echo "end 8" >> "$d/flight-rank$r.txt"
done
cat > "$tmp/want" <<EOF
hang report for $d: 2 dump(s), world of 2 rank(s)
last collective every rank finished: all-reduce #7 (25450 float32, step 3, grad bucket 0)
first collective where the ranks differ: none (every rank finished every collective recorded)
per rank:
  rank 0 host h0 pid 100: dump reason 'SIGUSR2', 8 collective(s) recorded, next #8
  rank 1 host h1 pid 101: dump reason 'SIGUSR2', 8 collective(s) recorded, next #8
EOF
check agree 0 "$tmp/want" -- "$d"

# 2. Three ranks that diverge. Rank 1 skipped step 3: its collectives #6, #7 are step 4's and it
# has finished one step fewer than the others' count of collectives; ranks 0 and 2 are at #10.
d=$tmp/diverge
mkdir "$d"
f=$d/flight-rank0.txt
head_of "$f" 0 3 h0 100 "collective timeout: deadline exceeded" 9000.000 11
steps "$f" 0 4
coll "$f" 10 all-reduce 1 5 running "stop vote" 2000.000
echo "end 11" >> "$f"
f=$d/flight-rank1.txt
head_of "$f" 1 3 h1 101 SIGUSR2 8500.000 10
steps "$f" 0 2
coll "$f" 6 all-reduce 1 4 done "stop vote"
coll "$f" 7 all-reduce 25450 4 done "grad bucket 0"
coll "$f" 8 all-reduce 1 5 done "stop vote"
coll "$f" 9 all-reduce 25450 5 done "grad bucket 0"
echo "end 10" >> "$f"
f=$d/flight-rank2.txt
head_of "$f" 2 3 h2 102 "collective timeout: deadline exceeded" 9100.000 12
steps "$f" 0 4
coll "$f" 10 all-reduce 1 5 queued "stop vote"
coll "$f" 11 all-reduce 25450 5 queued "grad bucket 0"
echo "end 12" >> "$f"
cat > "$tmp/want" <<EOF
hang report for $d: 3 dump(s), world of 3 rank(s)
last collective every rank finished: all-reduce #9 (25450 float32, step 4, grad bucket 0)
first collective where the ranks differ: all-reduce #10 (1 float32, step 5, stop vote)
  inside it: rank 0 (host h0, pid 100, for 7.0 s)
  queued behind another (not started): rank 2 (host h2, pid 102, enqueued 8.2 s ago)
  never entered it: rank 1 (host h1, pid 101, last finished #9)
ranks whose collectives differ: #6: rank 0, 2 all-reduce #6 (1 float32, step 3, stop vote); rank 1 all-reduce #6 (1 float32, step 4, stop vote); (a rank that skipped or repeated a step, or synced alone, pairs its collectives with other steps' collectives)
rank 1 skipped step 3 (host h1, pid 101): its collectives go from step 2 (#5) to step 4 (#6)
per rank:
  rank 0 host h0 pid 100: dump reason 'collective timeout: deadline exceeded', 11 collective(s) recorded, next #11
  rank 1 host h1 pid 101: dump reason 'SIGUSR2', 10 collective(s) recorded, next #10
  rank 2 host h2 pid 102: dump reason 'collective timeout: deadline exceeded', 12 collective(s) recorded, next #12
EOF
check diverge 0 "$tmp/want" -- "$d"

# 6. The same as JSON.
if command -v python3 > /dev/null 2>&1; then
  "$prog" hang-report "$d" --json > "$tmp/json" 2> "$tmp/err"
  rc=$?
  if [ $rc -ne 0 ]; then
    bad "--json: status $rc: $(cat "$tmp/err")"
  elif python3 - "$tmp/json" "$d" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
def want(what, got, exp):
    if got != exp:
        print("FAIL: --json %s: %r, want %r" % (what, got, exp))
        sys.exit(1)
want("dir", r["dir"], sys.argv[2])
want("world", r["world"], 3)
want("dumps", [(d["rank"], d["host"], d["pid"], d["collectives"], d["truncated"]) for d in r["dumps"]],
     [(0, "h0", 100, 11, False), (1, "h1", 101, 10, False), (2, "h2", 102, 12, False)])
want("no_dump", r["no_dump"], [])
want("last_all_finished", r["last_all_finished"],
     {"seq": 9, "op": "all-reduce", "dtype": "float32", "count": 25450, "arg": 1, "step": 4,
      "purpose": "grad bucket 0"})
fd = r["first_difference"]
want("first_difference.collective", fd["collective"],
     {"seq": 10, "op": "all-reduce", "dtype": "float32", "count": 1, "arg": 1, "step": 5,
      "purpose": "stop vote"})
want("inside", fd["inside"], [{"rank": 0, "host": "h0", "pid": 100, "seconds": 7.0}])
want("queued", [q["rank"] for q in fd["queued"]], [2])
want("never_entered", [q["rank"] for q in fd["never_entered"]], [1])
want("finished", fd["finished"], [])
sm = r["signature_mismatch"]
want("signature_mismatch", (sm["seq"], [(x["rank"], x["collective"]["step"]) for x in sm["ranks"]]),
     (6, [(0, 3), (1, 4), (2, 3)]))
want("step_jumps", r["step_jumps"],
     [{"rank": 1, "host": "h1", "pid": 101, "from_step": 2, "to_step": 4, "seq": 6}])
PY
  then
    ok
  else
    bad "--json of the diverging ranks (above)"
  fi
else
  echo "no python3: the --json case is not checked"
fi

# 3. A rank that left no dump (rank 1 of 3, stopped): named with its host and pid from the
# others' peer lines.
d=$tmp/missing
mkdir "$d"
for r in 0 2; do
  f=$d/flight-rank$r.txt
  head_of "$f" $r 3 h$r $((100 + r)) "collective timeout: deadline exceeded" 7000.000 11
  steps "$f" 0 4
  coll "$f" 10 all-reduce 1 5 running "stop vote" 2000.000
  echo "end 11" >> "$f"
done
cat > "$tmp/want" <<EOF
hang report for $d: 2 dump(s), world of 3 rank(s)
last collective every rank with a dump finished: all-reduce #9 (25450 float32, step 4, grad bucket 0)
first collective where the ranks differ: all-reduce #10 (1 float32, step 5, stop vote)
  inside it: rank 0 (host h0, pid 100, for 5.0 s) rank 2 (host h2, pid 102, for 5.0 s)
ranks that left no dump (stopped, killed, or their folder is on another host: copy every host's dumps into one folder): rank 1 (host h1, pid 101)
per rank:
  rank 0 host h0 pid 100: dump reason 'collective timeout: deadline exceeded', 11 collective(s) recorded, next #11
  rank 2 host h2 pid 102: dump reason 'collective timeout: deadline exceeded', 11 collective(s) recorded, next #11
EOF
check "missing rank" 0 "$tmp/want" -- "$d"

# 4. Dumps cut short. Rank 0: whole, inside #8. Rank 1: no end line, its last line (#8) cut
# mid-way. Rank 2: only its .tmp (killed while writing), cut after step 1. Rank 3: an empty .tmp
# (killed before its first line). What the cut dumps do not say is not taken as "never entered".
d=$tmp/cut
mkdir "$d"
f=$d/flight-rank0.txt
head_of "$f" 0 4 h0 100 "collective timeout: deadline exceeded" 9000.000 9
steps "$f" 0 3
coll "$f" 8 all-reduce 1 4 running "stop vote" 4000.000
echo "end 9" >> "$f"
f=$d/flight-rank1.txt
head_of "$f" 1 4 h1 101 "fatal signal SIGSEGV" 9000.000 9
steps "$f" 0 3
printf 'c seq=8 op=all-reduce dtype=float32 cou' >> "$f"
f=$d/flight-rank2.txt.tmp
head_of "$f" 2 4 h2 102 "fatal signal SIGBUS" 9000.000 9
steps "$f" 0 1
: > "$d/flight-rank3.txt.tmp"
cat > "$tmp/want" <<EOF
hang report for $d: 4 dump(s), world of 4 rank(s)
last collective every rank finished: all-reduce #7 (25450 float32, step 3, grad bucket 0)
first collective where the ranks differ: all-reduce #8 (1 float32, step 4, stop vote)
  inside it: rank 0 (host h0, pid 100, for 5.0 s)
  not known (dump cut short before it): rank 1 (host h1, pid 101) rank 2 (host h2, pid 102) rank 3 (host h3, pid 103)
per rank:
  rank 0 host h0 pid 100: dump reason 'collective timeout: deadline exceeded', 9 collective(s) recorded, next #9
  rank 1 host h1 pid 101: dump reason 'fatal signal SIGSEGV', 8 collective(s) recorded, next #9; CUT SHORT (no end line); 1 unreadable line(s)
  rank 2 host h2 pid 102: dump reason 'fatal signal SIGBUS', 4 collective(s) recorded, next #9; CUT SHORT (only the .tmp: killed while writing)
  rank 3 host h3 pid 103: dump reason '?', 0 collective(s) recorded, next #0; CUT SHORT (only the .tmp: killed while writing)
EOF
check "cut short" 0 "$tmp/want" -- "$d"
# a whole dump beside its .tmp: the whole one is read, the .tmp ignored
printf 'garbage' > "$d/flight-rank0.txt.tmp"
check "cut short, a .tmp beside the whole dump" 0 "$tmp/want" -- "$d"

# 5. Garbage named like a dump: named on stderr, left out, status 1; the others are reported.
d=$tmp/garbage
mkdir "$d"
f=$d/flight-rank0.txt
head_of "$f" 0 2 h0 100 SIGUSR2 5000.000 8
steps "$f" 0 3
echo "end 8" >> "$f"
printf 'PK\003\004 this is a zip file, not a dump\nc seq=1 op=x\n' > "$d/flight-rank1.txt"
cat > "$tmp/want" <<EOF
hang report for $d: 1 dump(s), world of 2 rank(s)
last collective every rank with a dump finished: all-reduce #7 (25450 float32, step 3, grad bucket 0)
first collective where the ranks differ: none (every rank finished every collective recorded)
ranks that left no dump (stopped, killed, or their folder is on another host: copy every host's dumps into one folder): rank 1 (host h1, pid 101)
per rank:
  rank 0 host h0 pid 100: dump reason 'SIGUSR2', 8 collective(s) recorded, next #8
EOF
check garbage 1 "$tmp/want" -- "$d"
grep -qx "mpitrain hang-report: $d/flight-rank1.txt is not a flight recorder dump (its first line is not 'mpitrain-flight-recorder 1'): left out" "$tmp/err" &&
  ok || bad "garbage: stderr does not name the file: $(cat "$tmp/err")"
# garbage only (binary, no newline at all): no report, status 1, both files named
d=$tmp/garbage_only
mkdir "$d"
printf '\177ELF\002\001\001' > "$d/flight-rank0.txt"
printf 'hello\n' > "$d/flight-rank1.txt"
: > "$tmp/empty"
check "garbage only" 1 "$tmp/empty" -- "$d"
[ "$(grep -c "is not a flight recorder dump" "$tmp/err")" -eq 2 ] &&
  grep -q "^mpitrain hang-report: no dump (flight-rankR.txt) in $d" "$tmp/err" &&
  ok || bad "garbage only: stderr: $(cat "$tmp/err")"

# 7. Usage.
for args in "" "--bogus $tmp/agree" "$tmp/agree $tmp/diverge"; do
  # shellcheck disable=SC2086 # words on purpose
  "$prog" hang-report $args > /dev/null 2> "$tmp/err"
  rc=$?
  [ $rc -eq 2 ] && grep -q "usage: mpitrain hang-report DIR\|one folder, not" "$tmp/err" &&
    ok || bad "hang-report $args: status $rc (want 2 and the usage): $(cat "$tmp/err")"
done
"$prog" hang-report "$tmp/nonexistent" > /dev/null 2> "$tmp/err"
rc=$?
[ $rc -eq 1 ] && grep -q "cannot read the folder $tmp/nonexistent: No such file or directory" "$tmp/err" &&
  ok || bad "a missing folder: status $rc (want 1): $(cat "$tmp/err")"
d=$tmp/none
mkdir "$d"
"$prog" hang-report "$d" > /dev/null 2> "$tmp/err"
rc=$?
[ $rc -eq 1 ] && grep -q "no dump (flight-rankR.txt) in $d" "$tmp/err" &&
  ok || bad "an empty folder: status $rc (want 1): $(cat "$tmp/err")"

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
