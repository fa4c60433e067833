# bench/bench_lib.sh: shell functions shared by the benchmark scripts (sourced, not run).
#
#   bench_find_build       sets MPT_BUILD to the build folder holding `mpitrain`
#   bench_option_value     refuses an option without a usable value
#   bench_count NAME V     refuses V unless it is a number from 1 to 9999
#   bench_python           prints the python3 to use (Debian's, which has torch, when present)
#   bench_launch NP CMD... runs CMD with NP ranks of mpirun (NP = 0: a plain process), under a
#                          timeout, one BLAS thread per rank unless OPENBLAS_NUM_THREADS is set
#
# Environment: MPT_BUILD (build folder), MPIRUN (the mpirun to use), MPT_BENCH_MPIRUN_ARGS (extra
# mpirun arguments, default "--bind-to none"), MPT_BENCH_TIMEOUT (seconds per run, default 600).
# As root, mpirun gets --allow-run-as-root; with more ranks than CPUs, --oversubscribe.

BENCH_SRCDIR=$(cd "$(dirname "$0")/.." && pwd)

bench_die() {
  echo "$(basename "$0"): $*" >&2
  exit 2
}

bench_find_build() {
  if [ -n "${MPT_BUILD:-}" ]; then
    [ -x "$MPT_BUILD/mpitrain" ] || bench_die "MPT_BUILD=$MPT_BUILD has no mpitrain (run make there)"
    MPT_BUILD=$(cd "$MPT_BUILD" && pwd)
    return 0
  fi
  for d in . "$BENCH_SRCDIR" "$BENCH_SRCDIR"/build "$BENCH_SRCDIR"/build-*; do
    if [ -x "$d/mpitrain" ]; then
      MPT_BUILD=$(cd "$d" && pwd)
      return 0
    fi
  done
  bench_die "no build folder with mpitrain found: build the project, then pass --build DIR or set MPT_BUILD"
}

# bench_option_value "$@": refuses (exit 2) the option $1 without a value, with an empty one, or
# with another option where its value should be.
bench_option_value() {
  [ $# -ge 2 ] || bench_die "$1 needs a value (see --help)"
  case $2 in
    '') bench_die "$1: the value is empty" ;;
    --*) bench_die "$1 needs a value, not the option '$2' (see --help)" ;;
  esac
}

# bench_count NAME VALUE: refuses (exit 2) a VALUE that is not a plain decimal from 1 to 9999
# (sh's arithmetic reads 010 as octal and stops at 08; test(1) stops past its range).
bench_count() {
  case $2 in *[!0-9]* | 0* | '' | ?????*) bench_die "$1: '$2' is not a number from 1 to 9999" ;; esac
}

bench_python() {
  if [ -x /usr/bin/python3 ]; then echo /usr/bin/python3; else command -v python3; fi
}

bench_ncpus() {
  getconf _NPROCESSORS_ONLN 2>/dev/null || nproc 2>/dev/null || echo 1
}

bench_launch() {
  _bl_np=$1
  shift
  OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
  OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
  export OPENBLAS_NUM_THREADS OMP_NUM_THREADS
  if [ "$_bl_np" -eq 0 ]; then
    timeout -k 10 "${MPT_BENCH_TIMEOUT:-600}" "$@"
    return $?
  fi
  _bl_mpirun=${MPIRUN:-mpirun}
  command -v "$_bl_mpirun" >/dev/null 2>&1 || bench_die "'$_bl_mpirun' not found (apt-get install openmpi-bin)"
  _bl_extra=""
  [ "$(id -u)" -eq 0 ] && _bl_extra="--allow-run-as-root"
  [ "$_bl_np" -gt "$(bench_ncpus)" ] && _bl_extra="$_bl_extra --oversubscribe"
  # shellcheck disable=SC2086 # word lists on purpose
  timeout -k 10 "${MPT_BENCH_TIMEOUT:-600}" "$_bl_mpirun" $_bl_extra ${MPT_BENCH_MPIRUN_ARGS:---bind-to none} \
    -x OPENBLAS_NUM_THREADS -x OMP_NUM_THREADS -np "$_bl_np" "$@"
}

# Splits a comma-separated list into words.
bench_words() {
  echo "$1" | tr ',' ' '
}

# Idle fraction of all CPUs over the next second (from /proc/stat), e.g. 0.97.
bench_idle_fraction() {
  _a=$(head -1 /proc/stat)
  sleep 1
  _b=$(head -1 /proc/stat)
  echo "$_a
$_b" | awk '{ idle = $5 + $6; tot = 0; for (i = 2; i <= NF; i++) tot += $i;
              if (NR == 1) { i0 = idle; t0 = tot } else { d = tot - t0;
              printf "%.2f\n", (d > 0) ? (idle - i0) / d : 1 } }'
}

# On a shared machine, waits (at most MPT_BENCH_WAIT_IDLE_S seconds, default 0 = do not wait)
# until the CPUs are at least MPT_BENCH_IDLE (default 0.9) idle over one second. Prints the last
# idle fraction measured.
bench_wait_idle() {
  _limit=${MPT_BENCH_WAIT_IDLE_S:-0}
  _want=${MPT_BENCH_IDLE:-0.9}
  _start=$(date +%s)
  while :; do
    _idle=$(bench_idle_fraction)
    if awk -v i="$_idle" -v w="$_want" 'BEGIN { exit !(i >= w) }'; then break; fi
    [ $(( $(date +%s) - _start )) -ge "$_limit" ] && break
  done
  echo "$_idle"
}
