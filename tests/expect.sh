# Shared by the bad-input test scripts (sourced, POSIX sh): the pass / fail counters, ok and
# bad, and expect, which runs one command and checks its exit status and its output.
#   expect STATUS PATTERN DESCRIPTION -- COMMAND...: the status and a line matching PATTERN
#   (grep), the command killed after EXPECT_TIMEOUT_S seconds (default 60). Output and status
#   of the last run are left in $out and $got.
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
expect() {
  want=$1 pattern=$2 what=$3
  shift 4
  out=$(timeout "${EXPECT_TIMEOUT_S:-60}" "$@" 2>&1)
  got=$?
  if [ $got -eq "$want" ] && printf '%s\n' "$out" | grep -q -- "$pattern"; then
    ok
  else
    bad "$what: status $got (want $want, and '$pattern'): $(printf '%s' "$out" | tail -n 3)"
  fi
}
