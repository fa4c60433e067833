#!/bin/sh
# The PyTorch oracle for the Llama model: tests/llama_torch_helper (mpitrain) writes a tiny
# Llama's parameters and their names, a token batch, its logits, loss, gradients and 10 steps of
# clipping + AdamW; tests/llama_torch.py (Debian's python3-torch) builds the same Llama as its
# own nn.Module with Hugging Face's parameter names, loads the parameters by name and compares
# everything (tolerances and why: in llama_torch.py). Two shapes: grouped-query attention (4
# query heads, 2 key/value heads) with an untied head, and multi-query attention (1 key/value
# head) with the head tied to the embedding; and the first with Llama 3's RoPE frequency
# scaling (llama3: one frequency in each of its three bands, the oracle's own float64 rule).
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
for shape in gqa tied llama3; do
  mkdir "$dir/$shape"
  echo "== $shape"
  ./tests/llama_torch_helper "$dir/$shape" "$shape" || { echo "FAIL: llama_torch_helper $shape"; exit 1; }
  OMP_NUM_THREADS=1 timeout 300 "$py" "$here/llama_torch.py" "$dir/$shape" || exit 1
done
