#!/bin/sh
# The PyTorch oracle for the GPT model: tests/gpt_torch_helper (mpitrain) writes a tiny GPT's
# model file, a token batch, its logits, loss, gradients and 10 steps of clipping + AdamW;
# tests/gpt_torch.py (Debian's python3-torch) builds the same GPT as its own nn.Module from the
# model file and compares everything (tolerances and why: in gpt_torch.py).
# Skipped (77) when /usr/bin/python3 cannot import torch and numpy.
set -u
here=$(dirname "$0")
py=/usr/bin/python3
if ! "$py" -c 'import torch, numpy' > /dev/null 2>&1; then
  echo "SKIP: $py cannot import torch and numpy (Debian: apt-get install python3-torch)"
  exit 77
fi
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
./tests/gpt_torch_helper "$dir" || { echo "FAIL: gpt_torch_helper"; exit 1; }
OMP_NUM_THREADS=1 timeout 300 "$py" "$here/gpt_torch.py" "$dir"
