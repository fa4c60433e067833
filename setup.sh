#!/usr/bin/env bash
# mpitrain set-up: installs the Debian packages it needs (as root, when missing), generates
# the build system, configures and builds. Idempotent: a second run only rebuilds what changed.
#
#   ./setup.sh          install + build (the mpitrain program lands in the top folder)
#   ./setup.sh check    install + build + run the whole test suite (make check), then the
#                       sanitizer stage (below); print each Check summary line, each stage's
#                       wall time and a final "N passed, N failed" line over both. The test
#                       suite's build has the MPT_TEST_* fault-injection hooks compiled in
#                       (configure --enable-fault-injection); a plain ./setup.sh builds without
#                       them. Switching between the two reconfigures, and only the few files that
#                       include config.h are rebuilt. It also installs Debian's python3-torch:
#                       the GPT's PyTorch oracle (tests/test_gpt_torch.sh) needs it (the test
#                       is skipped, visibly, where it is missing).
#   ./setup.sh sanitize the sanitizer stage alone: the library, the program and the Check
#                       programs built with --enable-sanitizers (AddressSanitizer,
#                       UndefinedBehaviorSanitizer, LeakSanitizer; CUDA off) in build-asan/,
#                       apart from the main build, then run: the single-process Check programs,
#                       the MPI ones at 2 ranks and the signal tests (which and why: below). A
#                       sanitizer report fails its test.
#   ./setup.sh bench    install + build, plus what the benchmark harness needs: gnuplot
#                       (bench/plot.sh), Debian's PyTorch 1.13 (bench/compare_torch.sh), and
#                       BLIS and libxsmm, the candidate GEMM libraries mpt_gemm_bench times
#                       beside OpenBLAS and oneDNN (the library links neither); then
#                       bench/run_all.sh runs every benchmark
#
# Environment: CONFIGURE_FLAGS (extra ./configure flags), JOBS (parallel build jobs).
set -euo pipefail
cd "$(dirname "$0")"

packages=(build-essential autoconf automake libtool pkg-config openmpi-bin libopenmpi-dev
          libopenblas-dev libdnnl-dev zlib1g-dev check dataset-fashion-mnist fortunes
          slurmctld slurmd slurm-client munge iproute2 clang libclang-rt-14-dev groff-base)
case ${1:-} in
  ''|check|sanitize|bench) ;;
  *) echo "usage: ./setup.sh [check|sanitize|bench]" >&2; exit 2 ;;
esac
# The PyTorch oracle test uses Debian's PyTorch 1.13; the benchmarks also plot and make a venv.
if [ "${1:-}" = check ]; then packages+=(python3-torch); fi
if [ "${1:-}" = bench ]; then
  packages+=(gnuplot-nox python3-torch python3-venv libblis-dev libxsmm-dev)
fi
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
# Wall time of each stage, printed when it ends and again at the end.
stage_times=()
stage_t0=$SECONDS
stage_done() {
  local line
  line=$(printf '%-34s %5d s' "$1" $((SECONDS - stage_t0)))
  echo "setup.sh: stage: $line"
  stage_times+=("$line")
  stage_t0=$SECONDS
}
[ -x configure ] && [ configure -nt configure.ac ] || autoreconf -fi
# Fault injection: on for `check` (or when CONFIGURE_FLAGS asks for it), off otherwise.
fault_flag=--disable-fault-injection
case " ${CONFIGURE_FLAGS:-} " in *" --enable-fault-injection "*) fault_flag=--enable-fault-injection ;; esac
[ "${1:-}" = check ] && fault_flag=--enable-fault-injection
fault_built=--disable-fault-injection
grep -q '^#define MPT_FAULT_INJECTION 1' config.h 2> /dev/null && fault_built=--enable-fault-injection
if [ "${1:-}" != sanitize ]; then
  if ! { [ -f Makefile ] && [ config.status -nt configure ] &&
         [ "$fault_flag" = "$fault_built" ]; }; then
    ./configure ${CONFIGURE_FLAGS:-} "$fault_flag"
  fi
  make -j"$jobs"
  stage_done "install + build"
fi

# The sanitizer stage. configure refuses a VPATH build of a source tree configured in place
# (the main build's), so build-asan/src is a copy of the sources: the files git tracks and the
# new ones it does not ignore, as they are now, plus the build system autoreconf made above.
# It is refreshed every time with the files' times kept, so make rebuilds only what changed.
# build-asan/obj builds it with --enable-sanitizers, the same fault-injection hooks as the test
# suite's build, and no CUDA (nothing to run it on).
# What runs, and why (about 8 minutes on 2 cores, a fresh build included):
# - every Check program that the suite runs as a program (the single-process ones): the
#   kernels, the tape, the threads, the loaders, the checkpoints; two at a time, with ASan's fast
#   unwinder for allocation stacks (3x faster; these do not start MPI, whose never-freed memory
#   the leak suppressions in tests/lsan.supp match only on the slow unwinder's full stacks).
# - the MPI Check programs at 2 ranks (comm, progress, devices, DDP, DDP faults, bf16 DDP,
#   GPT DDP, DP inside DDP, evaluation): the 3- and 4-rank runs repeat the same code
#   oversubscribed. Not test_comm_shard_npN.mpi: it bounds the peak resident memory, which ASan's shadow and quarantine
#   raise (a failure that is no finding).
# - the signal tests, the program under the sanitizers: tests/test_preempt.sh (SIGTERM to one
#   process and to 1 of 2 ranks), tests/test_preempt_stress.sh (MPT_PREEMPT_RUNS signalled
#   runs under load, default 10 here) and tests/test_usage.sh (SIGUSR1, and most options).
# The scripts run one at a time (timing, and the load of their own), with the slow unwinder.
# Not run: the other scripts, which train or benchmark for minutes and whose library code the
# Check programs cover (under ASan the whole suite would take hours on 2 cores).
# Sets san_pass, san_fail, san_skip and san_trs (the .trs files of this stage).
san_pass=0
san_fail=0
san_skip=0
san_trs=()
sanitizer_stage() {
  local src=build-asan/src obj=build-asan/obj tests progs all_progs scripts t
  scripts="tests/test_comm_np2.mpi tests/test_comm_progress_np2.mpi tests/test_comm_devices_np2.mpi
           tests/test_ddp_np2.mpi tests/test_faults_np2.mpi tests/test_ddp_bf16_np2.mpi tests/test_gpt_ddp_np2.mpi
           tests/test_dp_hybrid_np2.mpi tests/test_eval_np2.mpi
           tests/test_preempt.sh tests/test_preempt_stress.sh tests/test_usage.sh"
  if ! git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    echo "setup.sh: sanitizer stage skipped: it copies the sources with git (not a git checkout)"
    san_skip=1
    return 0
  fi
  mkdir -p "$src" "$obj"
  { git ls-files -z -c -o --exclude-standard
    printf '%s\0' configure Makefile.in aclocal.m4 config.h.in
    find build-aux m4 -type f -print0
  } | tar --null --ignore-failed-read -cf - -T - 2>/dev/null | tar -xf - -C "$src"
  if ! { [ -f "$obj/Makefile" ] && [ "$obj/config.status" -nt "$src/configure" ]; }; then
    if ! (cd "$obj" && ../src/configure --enable-sanitizers --with-cuda=no \
            --enable-fault-injection >../configure.log 2>&1); then
      echo "setup.sh: sanitizer stage: configure failed (build-asan/configure.log):"
      tail -n 20 build-asan/configure.log
      san_fail=1
      return 0
    fi
  fi
  # The suite's tests that are programs run bare (the rest are scripts and the MPI programs
  # registered at rank counts, PROGRAM_npN.mpi), and every test program (the scripts run some;
  # check-TESTS would build them all anyway).
  tests=$(printf 'print:\n\t@echo $(TESTS)\n' |
            make -s --no-print-directory -C "$obj" -f Makefile -f - print || true)
  progs=$(printf '%s\n' $tests | grep -vE '\.(sh|mpi)$' | tr '\n' ' ')
  all_progs=$(printf 'print:\n\t@echo $(check_PROGRAMS)\n' |
                make -s --no-print-directory -C "$obj" -f Makefile -f - print || true)
  # Two make runs, not one "make all PROGS": automake's "all" is a recursive make, and a second
  # goal beside it builds the same objects in a second make at the same time (a half-written
  # .lo then fails the link).
  if ! { make -C "$obj" -j"$jobs" all && make -C "$obj" -j"$jobs" $all_progs; } \
       >build-asan/build.log 2>&1; then
    echo "setup.sh: sanitizer stage: the build failed (build-asan/build.log):"
    tail -n 20 build-asan/build.log
    san_fail=1
    return 0
  fi
  stage_done "sanitizer build"
  # check-TESTS builds the other test programs too; a failed test does not stop the others
  ASAN_OPTIONS=${ASAN_OPTIONS-fast_unwind_on_malloc=1} \
    make -C "$obj" -j"$jobs" check-TESTS TESTS="$progs" >/dev/null 2>&1 || true
  MPT_PREEMPT_RUNS=${MPT_PREEMPT_RUNS-10} \
    make -C "$obj" -j1 check-TESTS TESTS="$(echo $scripts)" >/dev/null 2>&1 || true
  for t in $progs $scripts; do
    # automake names the log of PROGRAM_npN.mpi PROGRAM_npN.log (its extension dropped); a
    # missing .trs is a failure of that test, never of this script
    local base="$obj/${t%.mpi}" result summary
    local trs="$base.trs"
    result=$(sed -n 's/^:test-result: //p' "$trs" 2>/dev/null | head -n1 || true)
    summary=$(grep -E '^[0-9]+%: Checks: ' "$base.log" 2>/dev/null | tail -n1 || true)
    printf 'asan %-26s %-5s %s\n' "$(basename "$t")" "${result:-?}" "$summary"
    case ${result:-} in
      PASS) san_pass=$((san_pass + 1)) ;;
      SKIP) san_skip=$((san_skip + 1)) ;;
      *) san_fail=$((san_fail + 1)) ;;
    esac
    san_trs+=("$trs")
  done
  echo "setup.sh: sanitizer stage (ASan + UBSan + LSan): $san_pass passed, $san_fail failed," \
       "$san_skip skipped"
  stage_done "sanitizer tests"
}

if [ "${1:-}" = bench ]; then
  echo "setup.sh: the benchmark harness is ready: bench/run_all.sh --out bench/results (see bench/README.md)"
fi

# Each failed test's own failure lines and its last lines, short, so that the end of the output
# (all a CI page may keep) says what failed in every failed test, not only the last.
show_failures() {
  local trs log
  for trs in "$@"; do
    [ -f "$trs" ] || continue
    grep -q -E '^:test-result: (FAIL|ERROR|XPASS)' "$trs" || continue
    log=${trs%.trs}.log
    echo "---- $log: failure lines, then its last lines ----"
    grep -E '(^| )(FAIL|not ok)|:F:|:E:|[Ee]rror|Sanitizer|runtime error' "$log" |
      head -n 12 || true
    echo "  ..."
    tail -n 6 "$log"
  done
}

if [ "${1:-}" = sanitize ]; then
  sanitizer_stage
  show_failures "${san_trs[@]}"
  printf 'setup.sh: %s\n' "${stage_times[@]}"
  echo "$san_pass passed, $san_fail failed, $san_skip skipped"
  [ "$san_fail" -eq 0 ]
  exit
fi

if [ "${1:-}" = check ]; then
  status=0
  make -j"$jobs" check || status=$?
  stage_done "test suite (make check)"
  # Under automake's driver Check's own summary lines land in tests/*.log: show them.
  for log in tests/*.log bench/*.log; do
    [ "$log" = tests/test-suite.log ] && continue
    [ "$log" = test-suite.log ] && continue
    [ -f "$log" ] || continue
    result=$(sed -n 's/^:test-result: //p' "${log%.log}.trs" 2>/dev/null | head -n1 || true)
    summary=$(grep -E '^[0-9]+%: Checks: ' "$log" | tail -n1 || true)
    printf '%-28s %-5s %s\n' "$(basename "${log%.log}")" "${result:-?}" "$summary"
  done
  # grep finds nothing when nothing failed: count with cat | grep -c, which never stops the script.
  results=$(cat tests/*.trs bench/*.trs 2>/dev/null || true)
  pass=$(printf '%s\n' "$results" | grep -c '^:test-result: PASS' || true)
  fail=$(printf '%s\n' "$results" | grep -c -E '^:test-result: (FAIL|ERROR|XPASS)' || true)
  skip=$(printf '%s\n' "$results" | grep -c '^:test-result: SKIP' || true)
  echo "setup.sh: test suite: $pass passed, $fail failed, $skip skipped"
  sanitizer_stage
  show_failures tests/*.trs bench/*.trs "${san_trs[@]}"
  printf 'setup.sh: %s\n' "${stage_times[@]}"
  # the final line counts both the test suite and the sanitizer stage
  pass=$((pass + san_pass))
  fail=$((fail + san_fail))
  skip=$((skip + san_skip))
  echo "$pass passed, $fail failed, $skip skipped"
  [ "$fail" -eq 0 ] || status=1
  exit "$status"
fi
