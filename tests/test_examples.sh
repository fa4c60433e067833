#!/bin/sh
# The examples (examples/*.c), run as a user would:
#  - custom_op: a user op's gradients against central differences (one process);
#  - custom_model: a user's residual model trained by the library's loop (mpt_trainer_run) with
#    DDP on Fashion-MNIST, 2 ranks, one epoch on 6000 samples: test accuracy at least 0.70 and
#    bit-identical replicas; then two epochs with a checkpoint folder, stopped at step 60 and
#    continued by a second run (resume auto), whose accuracy equals one run of two epochs;
#  - hand_loop: the same model with the step's seven calls written out, the same checks;
#  - dp_vs_ddp: DataParallel and DDP side by side, 2 ranks / 2 devices: the same parameters at
#    the end (1e-4);
#  - the library installed with `make install DESTDIR=...` (no mpt__ symbol in `nm -D
#    --defined-only` of it) and custom_op built out of tree with `pkg-config --cflags --libs
#    mpitrain` only, then run.
# Skips (77) without Debian's Fashion-MNIST package or mpirun; each mpirun has a time limit.
set -u
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/.." && pwd)
status=0
fail() { echo "FAIL: $*"; status=1; }

"$top/examples/custom_op" || fail "examples/custom_op"

if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] &&
   [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte ]; then
  echo "no Fashion-MNIST (apt-get install dataset-fashion-mnist): skipping the training examples"
else
  "$here/mpirun.sh" 2 300 "$top/examples/custom_model" 1 6000 0.70 ||
    fail "examples/custom_model under mpirun -np 2"
  "$here/mpirun.sh" 2 300 "$top/examples/hand_loop" 1 6000 0.70 ||
    fail "examples/hand_loop under mpirun -np 2"
  # resume auto: 2 epochs stopped at step 60, then a second run to the end, against 2 epochs in
  # one run
  ck=$(mktemp -d)
  out2="" out3=""
  out1=$("$here/mpirun.sh" 2 300 "$top/examples/custom_model" 2 3000 0 "$ck/a" 60 2>&1) &&
    out2=$("$here/mpirun.sh" 2 300 "$top/examples/custom_model" 2 3000 0 "$ck/a" 2>&1) &&
    out3=$("$here/mpirun.sh" 2 300 "$top/examples/custom_model" 2 3000 0 2>&1) ||
    fail "examples/custom_model with a checkpoint folder"
  printf '%s' "$out2" | grep -q "resume auto: resuming from" ||
    fail "custom_model: the second run did not resume: $(printf '%s' "$out2" | tail -3)"
  a=$(printf '%s' "$out2" | grep -o 'test accuracy [0-9.]*')
  b=$(printf '%s' "$out3" | grep -o 'test accuracy [0-9.]*')
  [ -n "$a" ] && [ "$a" = "$b" ] ||
    fail "custom_model: 1 + 1 resumed epochs gave '$a', 2 epochs in one run '$b'"
  rm -rf "$ck"
  "$here/mpirun.sh" 2 300 "$top/examples/dp_vs_ddp" 60 || fail "examples/dp_vs_ddp under mpirun -np 2"
fi

# Out of tree: install into a scratch root, build with pkg-config alone.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ! make -C "$top" install DESTDIR="$tmp/root" >"$tmp/install.log" 2>&1; then
  tail -20 "$tmp/install.log"
  fail "make install DESTDIR=..."
else
  # The installed library exports the public API only (tests/test_exports.sh checks the
  # build tree's both ways).
  lib=$(find "$tmp/root" -name 'libmpitrain.so*' -type f | head -n1)
  internal=$(nm -D --defined-only "$lib" | awk '$3 ~ /^mpt__/ {print $3}' | head -n5)
  [ -z "$internal" ] || fail "the installed $lib exports internal symbols: $internal"
  pc=$(find "$tmp/root" -name mpitrain.pc | head -n1)
  if [ -z "$pc" ]; then
    fail "make install put no mpitrain.pc"
  else
    export PKG_CONFIG_PATH="$(dirname "$pc")" PKG_CONFIG_SYSROOT_DIR="$tmp/root"
    flags=$(pkg-config --cflags --libs mpitrain) || fail "pkg-config --cflags --libs mpitrain"
    # shellcheck disable=SC2086 # flags is a list of words
    if cc -std=c11 -o "$tmp/custom_op" "$top/examples/custom_op.c" $flags -lm 2>"$tmp/cc.log"; then
      libdir=$(pkg-config --variable=libdir mpitrain) # the sysroot is already in front
      if LD_LIBRARY_PATH="$libdir" "$tmp/custom_op" >/dev/null; then
        echo "ok: custom_op built out of tree with pkg-config alone ($flags) and passed"
      else
        fail "custom_op built out of tree did not pass"
      fi
    else
      cat "$tmp/cc.log"
      fail "custom_op does not build out of tree with pkg-config alone"
    fi
  fi
fi
exit $status
