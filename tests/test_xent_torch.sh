#!/bin/sh
# The PyTorch oracle for the cross-entropy at large logits (|logit| ~ 1e1, 1e2, 1e3, 1e4):
# tests/xent_torch_helper (mpitrain) runs LayerNorm -> linear head -> the fused cross-entropy
# over a padded vocabulary, and the unfused one, and writes the inputs, losses and gradients;
# tests/xent_torch.py (Debian's python3-torch) compares them with PyTorch in float64
# (tolerances and why: in xent_torch.py). Skipped (77) when /usr/bin/python3 cannot import
# torch and numpy.
set -u
here=$(dirname "$0")
py=/usr/bin/python3
if ! "$py" -c 'import torch, numpy' > /dev/null 2>&1; then
  echo "SKIP: $py cannot import torch and numpy (Debian: apt-get install python3-torch)"
  exit 77
fi
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
./tests/xent_torch_helper "$dir" || { echo "FAIL: xent_torch_helper"; exit 1; }
OMP_NUM_THREADS=1 timeout 300 "$py" "$here/xent_torch.py" "$dir"
