#!/bin/sh
# Rules of the source tree that no compiler checks, read from the tracked files (git ls-files;
# skipped outside a git checkout):
#   1. src/core/error.h (the internal mpt__error) is included only by files that use mpt__error;
#      everything else reaches the check macros through mpitrain/core.h;
#   2. the log levels have one spelling each (MPT_LOG_ERROR / WARN / INFO / DEBUG): no
#      MPT_LOG_ERR, MPT_LOG_WARNING, MPT_LOG_INF or MPT_LOG_DBG aliases;
#   3. the documentation is one folder, docs/: nothing is tracked under doc/, every docs/NAME.md
#      cited in a tracked file exists, and no file cites an upper-case NAME.md that is neither in
#      the tree nor one of the documents of other projects named in `external` below;
#   4. mpitrain.pc.in's Libs.private names every $(X_LIBS) the library links (Makefile.am's
#      BASE_LIBS and each local.mk's libmpitrain_all_la_LIBADD), so a static link through
#      pkg-config gets them all;
#   5. an MPI program at a rank count is registered one way: TESTS names tests/PROGRAM_npN.mpi
#      and tests/run_np.sh's table has its arm (and no arm that no registered name uses); no
#      tests/*_npN.sh wrapper script is left;
#   6. the nn layer does not reach up into the file formats (src/ckpt): no file of src/nn and no
#      nn header (nn.h, autograd.h, transformer.h, gpt_config.h, llama.h) includes ckpt.h,
#      gpt_file.h, safetensors.h or a src/ckpt header, and src/nn calls no mpt_gpt_file_,
#      mpt_gpt_st_ or mpt_ckpt_ function (the GPT's config and layout are nn's: gpt_config.h);
#   7. whole files are replaced in one way: rename(2) is called in src/ only by
#      core/atomic_file.c (temporary file, fsync, rename, fsync of the folder) and by
#      comm/flight.c's dump, which runs in signal handlers (no stdio, no allocation).
# Each rule also runs on a made-up tree that breaks it, and must fail there. Prints
# "N passed, N failed".
set -u
srcdir=$(cd "${srcdir:-.}" && pwd)
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
if ! git -C "$srcdir" rev-parse --is-inside-work-tree > /dev/null 2>&1; then
  echo "SKIP: $srcdir is not a git checkout (the checks read the tracked files)"
  exit 77
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mpt_tree.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# nccl-tests' PERFORMANCE.md (bus bandwidth); the design, style and environment notes kept
# beside the repository.
external='PERFORMANCE.md DESIGN.md STYLE.md ENVIRONMENT.md'

# Each rule reads the tracked files of the git tree $1 and prints one line per breach.
rule_error_h() {
  git -C "$1" grep -lE '#include "core/error\.h"' -- 'src/*.c' 'src/*.h' 'src/*.cu' |
    while read -r f; do
      case $f in src/comm/comm_impl.h)
        # the comm backends' shared header: comm_mpi.c and comm_nccl.c use it through it
        git -C "$1" grep -qw mpt__error -- 'src/comm/*.c' || echo "$f: includes core/error.h, no comm file uses mpt__error"
        continue ;;
      esac
      git -C "$1" grep -qw mpt__error -- "$f" || echo "$f: includes core/error.h and uses no mpt__error"
    done
}
rule_log_aliases() {
  git -C "$1" grep -nwE 'MPT_LOG_(ERR|WARNING|INF|DBG)' -- ':!tests/test_tree.sh' | cut -c1-160
}
rule_docs() {
  git -C "$1" ls-files | grep '^doc/' | sed 's/^/tracked under doc\/: /'
  git -C "$1" grep -ohE 'docs/[A-Za-z0-9_-]+\.md' -- ':!tests/test_tree.sh' | sort -u |
    while read -r p; do [ -f "$1/$p" ] || echo "cited, not in the tree: $p"; done
  names=$(git -C "$1" ls-files | sed 's|.*/||' | grep -E '^[A-Z][A-Z0-9_-]*\.md$' | sort -u)
  git -C "$1" grep -ohE '\b[A-Z][A-Z0-9_-]*\.md\b' -- ':!tests/test_tree.sh' | sort -u |
    while read -r n; do
      case " $external $names " in *" $n "*) ;; *) echo "cited, not in the tree: $n" ;; esac
    done
}
rule_pc() {
  [ -f "$1/mpitrain.pc.in" ] || { echo "no mpitrain.pc.in"; return; }
  libs=$(grep '^Libs.private:' "$1/mpitrain.pc.in")
  { grep -E '^BASE_LIBS *=' "$1/Makefile.am"
    git -C "$1" grep -h 'libmpitrain_all_la_LIBADD' -- '*.am' '*.mk'; } |
    grep -oE '\$\([A-Z0-9_]+_LIBS\)' | sort -u | tr -d '$()' |
    while read -r v; do
      case $v in BASE_LIBS) continue ;; esac
      case $libs in *"@$v@"*) ;; *) echo "mpitrain.pc.in: Libs.private lacks @$v@" ;; esac
    done
}

rule_np() {
  git -C "$1" ls-files 'tests/*_np[0-9]*.sh' | sed 's/^/a wrapper script instead of a PROGRAM_npN.mpi name: /'
  names=$(git -C "$1" grep -ohE 'tests/[a-z0-9_]+_np[0-9]+\.mpi' -- '*.am' '*.mk' | sort -u)
  for n in $names; do
    sh "$1/tests/run_np.sh" --print "$n" > /dev/null 2>&1 || echo "$n: registered, not in tests/run_np.sh's table"
  done
  sed -n 's/^  \(test_[][a-z0-9_]*\.mpi\)).*/\1/p' "$1/tests/run_np.sh" | while read -r arm; do
    used=0
    for n in $names; do
      # shellcheck disable=SC2254 # the arm is a pattern
      case ${n#tests/} in $arm) used=1 ;; esac
    done
    [ $used -eq 1 ] || echo "tests/run_np.sh: the arm $arm matches no registered test"
  done
}

rule_nn_below_ckpt() {
  git -C "$1" grep -nE '#include "(mpitrain/(ckpt|gpt_file|safetensors)\.h|ckpt/)' -- 'src/nn/*' \
    include/mpitrain/nn.h include/mpitrain/autograd.h include/mpitrain/transformer.h \
    include/mpitrain/gpt_config.h include/mpitrain/llama.h
  git -C "$1" grep -nE '\bmpt_(gpt_file_|gpt_st_|ckpt_)[a-z_]*\(' -- 'src/nn/*.c'
}

rule_rename() {
  git -C "$1" grep -nE '\brename\(' -- 'src/*.c' ':!src/core/atomic_file.c' ':!src/comm/flight.c' |
    grep -v '^[^:]*:[0-9]*: *\*'
}

check() { # NAME: the rule holds on the source tree
  out=$("rule_$1" "$srcdir")
  if [ -z "$out" ]; then ok; else bad "$1:"; printf '%s\n' "$out" | sed 's/^/  /'; fi
}
check error_h
check log_aliases
check docs
check pc
check np
check nn_below_ckpt
check rename

# The rules must be able to fail: a small git tree breaking each once.
t=$tmp/tree
mkdir -p "$t/src/core" "$t/src/nn" "$t/src/comm" "$t/doc" "$t/docs"
printf '#include "core/error.h"\nint f(void) { return 0; }\n' > "$t/src/nn/a.c"
printf '#include "core/error.h"\nint g(void) { return mpt__error(1); }\n' > "$t/src/nn/b.c"
printf 'mpt_log(MPT_LOG_DBG, "x");\n' > "$t/src/nn/c.c"
printf 'see docs/nowhere.md and FAULTS.md; docs/here.md, README.md, PERFORMANCE.md\n' > "$t/src/core/d.c"
printf '# here\n' > "$t/docs/here.md"
printf '# readme\n' > "$t/README.md"
printf 'manual\n' > "$t/doc/x.1"
printf 'BASE_LIBS = $(OPENBLAS_LIBS) $(ONEDNN_LIBS) -lm\n' > "$t/Makefile.am"
printf 'libmpitrain_all_la_LIBADD += $(CUDA_LIBS) -lstdc++\n' > "$t/src/core/local.mk"
printf 'Libs.private: @OPENBLAS_LIBS@ -lm\n' > "$t/mpitrain.pc.in"
mkdir -p "$t/tests"
sed 's/^  test_comm_np2\.mpi) .*/  test_gone_np2.mpi) limit=1 ;;/' "$srcdir/tests/run_np.sh" > "$t/tests/run_np.sh"
cp "$srcdir/tests/mpirun.sh" "$t/tests/"
printf 'exec true\n' > "$t/tests/test_old_np2.sh"
printf 'TESTS += tests/test_comm_np2.mpi tests/test_comm_np3.mpi\n' > "$t/tests/x.mk"
mkdir -p "$t/include/mpitrain"
printf '#include "mpitrain/gpt_file.h"\n' > "$t/include/mpitrain/transformer.h"
printf 'static int f(void) { return mpt_gpt_file_read(0, 0, 0, 0, 0); }\n' > "$t/src/nn/g.c"
printf 'int h(void) { return rename("a.tmp", "a"); }\n' > "$t/src/nn/h.c"
printf ' * rename(2) of a temporary file, said in a comment\n' > "$t/src/nn/i.c"
git -C "$t" init -q && git -C "$t" add -A
probe() { # RULE, TEXT it must print
  out=$("rule_$1" "$t")
  case $out in *"$2"*) ok ;; *) bad "rule $1 misses '$2' on a tree that breaks it; it printed: $out" ;; esac
}
probe error_h "src/nn/a.c: includes core/error.h and uses no mpt__error"
rule_error_h "$t" | grep -q 'b\.c' && bad "rule error_h names src/nn/b.c, which uses mpt__error" || ok
probe log_aliases "MPT_LOG_DBG"
probe docs "tracked under doc/: doc/x.1"
probe docs "cited, not in the tree: docs/nowhere.md"
probe docs "cited, not in the tree: FAULTS.md"
rule_docs "$t" | grep -qE ': (docs/here|README|PERFORMANCE)\.md$' &&
  bad "rule docs names a file that is there or allowed: $(rule_docs "$t")" || ok
probe pc "lacks @ONEDNN_LIBS@"
probe pc "lacks @CUDA_LIBS@"
probe np "a wrapper script instead of a PROGRAM_npN.mpi name: tests/test_old_np2.sh"
probe np "tests/test_comm_np2.mpi: registered, not in tests/run_np.sh's table"
probe np "the arm test_gone_np2.mpi matches no registered test"
probe nn_below_ckpt 'include/mpitrain/transformer.h:1:#include "mpitrain/gpt_file.h"'
probe nn_below_ckpt "src/nn/g.c:1:static int f(void) { return mpt_gpt_file_read("
probe rename 'src/nn/h.c:1:int h(void) { return rename("a.tmp", "a"); }'
rule_rename "$t" | grep -q 'i\.c' && bad "rule rename names a comment (src/nn/i.c)" || ok
rule_np "$t" | grep -q 'test_comm_np3' && bad "rule np names test_comm_np3.mpi, which is in the table" || ok

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
