#!/bin/sh
# bench/hf_interop.sh: Hugging Face interoperability, both ways, against transformers itself
# (PyPI's torch + transformers + safetensors in a virtual environment: $MPT_TORCH_VENV, default
# bench/.venv, made with pip on first use; not a test: it needs PyPI).
#
#   mpitrain -> transformers: models trained by mpitrain and saved with --save-model (a Llama:
#     fp32, bf16, sharded; a GPT-2) are loaded by LlamaForCausalLM / GPT2LMHeadModel
#     (from_pretrained, float32); both compute the logits of the same tokens (mpitrain's from
#     mpt_st_logits) and the max abs difference is printed.
#   transformers -> mpitrain: models of random weights saved by save_pretrained (a Llama with
#     grouped-query attention, untied, tied, and with Llama 3.1's "llama3" RoPE scaling; a GPT-2) are read by mpitrain (logits compared
#     the same way), trained by it for a few steps from --init-from (the loss printed at the
#     first and last step), saved, and loaded back by transformers, logits compared again.
#
#   bench/hf_interop.sh [--build DIR] [--out DIR] [--steps N]
set -u
. "$(dirname "$0")/bench_lib.sh"
out="" steps=10
while [ $# -gt 0 ]; do
  case $1 in
    --build) MPT_BUILD=$2; export MPT_BUILD; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) bench_die "unknown option '$1' (--help lists them)" ;;
  esac
done
bench_find_build
prog=$MPT_BUILD/mpitrain
logits=$MPT_BUILD/mpt_st_logits
[ -x "$logits" ] || bench_die "$logits not built (make mpt_st_logits in $MPT_BUILD)"
venv=${MPT_TORCH_VENV:-$BENCH_SRCDIR/bench/.venv}
py=$venv/bin/python
if ! "$py" -c 'import torch, transformers, safetensors, numpy' 2>/dev/null; then
  echo "making $venv: pip install torch transformers safetensors numpy from PyPI (once)" >&2
  "$(bench_python)" -m venv "$venv" || bench_die "cannot make the virtual environment $venv"
  "$venv/bin/pip" install --quiet torch transformers safetensors numpy >&2 ||
    bench_die "pip install failed"
fi
helper=$BENCH_SRCDIR/bench/hf_interop.py
if [ -z "$out" ]; then
  out=$(mktemp -d "${TMPDIR:-/tmp}/mpt_hf_interop.XXXXXX")
  trap 'rm -rf "$out"' EXIT
fi
mkdir -p "$out" || bench_die "cannot create $out"
OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
export OMP_NUM_THREADS

echo "# bench/hf_interop.sh: mpitrain $("$prog" --version | sed -n '1s/^mpitrain //p'), $("$py" -c \
  'import torch, transformers, safetensors; print("transformers", transformers.__version__, "torch", torch.__version__, "safetensors", safetensors.__version__)')"
echo "# commit $(git -C "$BENCH_SRCDIR" rev-parse --short HEAD 2> /dev/null || echo unknown)"
echo "# machine: $(uname -srm), $(bench_ncpus) CPU(s), $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1); $(date -u +%Y-%m-%dT%H:%M:%SZ)"
echo

echo "command: bench/hf_interop.sh --steps $steps (MPT_TORCH_VENV=$venv)"
echo

# data: byte-level token shards of a licence text; the compared tokens: a sentence's bytes
"$prog" tokenize --bytes -o "$out/data" /usr/share/common-licenses/GPL-3 > /dev/null ||
  bench_die "tokenize failed"
shards="--shards $out/data/train_000000.bin"
toks=$(printf 'The licensee may convey the covered work under this License.' |
  od -An -tu1 | tr -s ' \n' '  ')

compare() { # DIR: mpitrain's logits of $toks against transformers'
  # shellcheck disable=SC2086
  "$logits" "$1" "$out/logits.bin" $toks || { echo "mpt_st_logits $1 failed"; return 1; }
  # shellcheck disable=SC2086
  "$py" "$helper" compare "$1" "$out/logits.bin" $toks 2>&1 | grep -v -i "warn\|token_id"
}

train() { # LABEL STEPS ARGS...: an mpitrain run of STEPS steps; its first and last loss
  _label=$1 _steps=$2
  shift 2
  # shellcheck disable=SC2086
  "$prog" train $shards --max-steps "$_steps" --log-every 1 --batch-size 4 --no-progress "$@" \
    > "$out/$_label.log" 2>&1 || { echo "$_label: mpitrain train failed:"; tail -n 3 "$out/$_label.log"; return 1; }
  grep -o 'loss [0-9.]*' "$out/$_label.log" | sed -n '1p;$p' | tr '\n' ' ' |
    awk -v l="$_label" -v s="$_steps" '{ printf "%s: mpitrain trained %d step(s), loss %s -> %s\n", l, s, $2, $4 }'
}

echo "## mpitrain -> transformers"
mkdir -p "$out/llama" "$out/llama_bf16" "$out/llama_shards" "$out/gpt2"
train llama-tiny "$steps" --model llama-tiny --save-model "$out/llama"
compare "$out/llama"
train llama-tiny-bf16 1 --model llama --init-from "$out/llama" --lr 0 \
  --save-model "$out/llama_bf16" --save-dtype bf16
compare "$out/llama_bf16"
train llama-tiny-shards 1 --model llama --init-from "$out/llama" --lr 0 \
  --save-model "$out/llama_shards" --save-shard-size 100KB
echo "sharded: $(ls "$out/llama_shards" | tr '\n' ' ')"
compare "$out/llama_shards"
train gpt "$steps" --model gpt --n-layer 2 --n-head 4 --n-embd 64 --seq-len 64 --vocab-size 256 \
  --save-model "$out/gpt2"
compare "$out/gpt2"
echo

echo "## transformers -> mpitrain"
for kind in llama llama-tied llama3 gpt2; do
  "$py" "$helper" make "$kind" "$out/hf_$kind" 2>&1 | grep -v -i "warn\|token_id"
  compare "$out/hf_$kind"
  mkdir -p "$out/hf_${kind}_trained"
  if [ "$kind" = gpt2 ]; then
    train "hf_$kind" "$steps" --model gpt --n-layer 2 --n-head 4 --n-embd 64 --seq-len 128 \
      --vocab-size 256 --init-from "$out/hf_$kind" --save-model "$out/hf_${kind}_trained"
  else
    train "hf_$kind" "$steps" --model llama --init-from "$out/hf_$kind" --seq-len 64 \
      --save-model "$out/hf_${kind}_trained"
  fi
  compare "$out/hf_${kind}_trained"
done
