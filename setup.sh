#!/usr/bin/env bash
# mpitrain set-up: installs the Debian packages it needs (as root, when missing), generates
# the build system, configures and builds. Idempotent: a second run only rebuilds what changed.
#
#   ./setup.sh          install + build (the mpitrain program lands in the top folder)
#   ./setup.sh check    install + build + run the whole test suite (make check), then print
#                       each Check summary line and a final "N passed, N failed" line. The test
#                       suite's build has the MPT_TEST_* fault-injection hooks compiled in
#                       (configure --enable-fault-injection); a plain ./setup.sh builds without
#                       them. Switching between the two reconfigures, and only the few files that
#                       include config.h are rebuilt. It also installs Debian's python3-torch:
#                       the GPT's PyTorch oracle (tests/test_gpt_torch.sh) needs it (the test
#                       is skipped, visibly, where it is missing).
#   ./setup.sh bench    install + build, plus what the benchmark harness needs: gnuplot
#                       (bench/plot.sh) and Debian's PyTorch 1.13 (bench/compare_torch.sh);
#                       then bench/run_all.sh runs every benchmark
#
# Environment: CONFIGURE_FLAGS (extra ./configure flags), JOBS (parallel build jobs).
set -euo pipefail
cd "$(dirname "$0")"

packages=(build-essential autoconf automake libtool pkg-config openmpi-bin libopenmpi-dev
          libopenblas-dev libdnnl-dev zlib1g-dev check dataset-fashion-mnist fortunes
          slurmctld slurmd slurm-client munge iproute2 clang libclang-rt-14-dev groff-base)
case ${1:-} in ''|check|bench) ;; *) echo "usage: ./setup.sh [check|bench]" >&2; exit 2 ;; esac
# The PyTorch oracle test uses Debian's PyTorch 1.13; the benchmarks also plot and make a venv.
if [ "${1:-}" = check ]; then packages+=(python3-torch); fi
if [ "${1:-}" = bench ]; then packages+=(gnuplot-nox python3-torch python3-venv); fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup.sh: missing packages: ${missing[*]} (run as root, or: sudo apt-get install ${missing[*]})" >&2
    exit 1
  fi
  echo "setup.sh: installing ${missing[*]}"
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

jobs=${JOBS:-$(nproc)}
[ -x configure ] && [ configure -nt configure.ac ] || autoreconf -fi
# Fault injection: on for `check` (or when CONFIGURE_FLAGS asks for it), off otherwise.
fault_flag=--disable-fault-injection
case " ${CONFIGURE_FLAGS:-} " in *" --enable-fault-injection "*) fault_flag=--enable-fault-injection ;; esac
[ "${1:-}" = check ] && fault_flag=--enable-fault-injection
fault_built=--disable-fault-injection
grep -q '^#define MPT_FAULT_INJECTION 1' config.h 2> /dev/null && fault_built=--enable-fault-injection
if ! { [ -f Makefile ] && [ config.status -nt configure ] && [ "$fault_flag" = "$fault_built" ]; }; then
  ./configure ${CONFIGURE_FLAGS:-} "$fault_flag"
fi
make -j"$jobs"

if [ "${1:-}" = bench ]; then
  echo "setup.sh: the benchmark harness is ready: bench/run_all.sh --out bench/results (see bench/README.md)"
fi

if [ "${1:-}" = check ]; then
  status=0
  make -j"$jobs" check || status=$?
  # Under automake's driver Check's own summary lines land in tests/*.log: show them.
  for log in tests/*.log bench/*.log; do
    [ "$log" = tests/test-suite.log ] && continue
    [ "$log" = test-suite.log ] && continue
    [ -f "$log" ] || continue
    result=$(sed -n 's/^:test-result: //p' "${log%.log}.trs" 2>/dev/null | head -n1)
    summary=$(grep -E '^[0-9]+%: Checks: ' "$log" | tail -n1 || true)
    printf '%-28s %-5s %s\n' "$(basename "${log%.log}")" "${result:-?}" "$summary"
  done
  # grep finds nothing when nothing failed: count with cat | grep -c, which never stops the script.
  results=$(cat tests/*.trs bench/*.trs 2>/dev/null || true)
  pass=$(printf '%s\n' "$results" | grep -c '^:test-result: PASS' || true)
  fail=$(printf '%s\n' "$results" | grep -c -E '^:test-result: (FAIL|ERROR|XPASS)' || true)
  skip=$(printf '%s\n' "$results" | grep -c '^:test-result: SKIP' || true)
  # Each failed test's own failure lines and its last lines, short, so that the end of the
  # output (all a CI page may keep) says what failed in every failed test, not only the last.
  for trs in tests/*.trs bench/*.trs; do
    [ -f "$trs" ] || continue
    grep -q -E '^:test-result: (FAIL|ERROR|XPASS)' "$trs" || continue
    log=${trs%.trs}.log
    echo "---- $log: failure lines, then its last lines ----"
    grep -E '(^| )(FAIL|not ok)|:F:|:E:|[Ee]rror' "$log" | head -n 12 || true
    echo "  ..."
    tail -n 6 "$log"
  done
  echo "$pass passed, $fail failed, $skip skipped"
  [ "$fail" -eq 0 ] || status=1
  exit "$status"
fi
