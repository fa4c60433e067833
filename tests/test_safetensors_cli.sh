#!/bin/sh
# Hugging Face safetensors models on the command line: `train --save-model X.safetensors` and
# `--init-from DIR|X.safetensors`, `generate --model-file` of both formats. A trained tiny GPT
# saved as safetensors, read back (--lr 0 leaves it unchanged) and saved as an llm.c file equal
# to the one the same run writes directly; generate gives the same text from both; a model
# written by tests/st_oracle.py from the format alone (BF16 and F32, the "transformer." prefix,
# transformers' extra tensors) read exactly; --save-dtype bf16 checked by the oracle's own
# rounding, --save-shard-size's shards against the one file and read back exactly; bad models
# and options refused naming the file. Needs python3 (skipped without). About 20 runs of the
# program, 15 s.
set -u
prog=${MPITRAIN:-./mpitrain}
command -v python3 > /dev/null 2>&1 || { echo "no python3: skipped"; exit 77; }
oracle="${srcdir:-.}/tests/st_oracle.py"
# shellcheck source=tests/expect.sh
. "${srcdir:-.}/tests/expect.sh" # pass, fail, ok, bad, expect
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mpt_st_cli.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

awk 'BEGIN { srand(3); split("the a cat dog sat on mat ran fast slow red blue", w, " ");
     for (i = 0; i < 300; i++) { n = 4 + int(rand() * 6); s = "";
       for (j = 0; j < n; j++) s = s w[1 + int(rand() * 12)] " "; print s "." } }' \
  > "$tmp/text.txt"
"$prog" tokenize --bytes -o "$tmp/sh" "$tmp/text.txt" > /dev/null || { echo "FAIL: tokenize"; exit 1; }
tiny="--model gpt --n-layer 2 --n-head 2 --n-embd 16 --seq-len 16 --vocab-size 256"
shards="--shards $tmp/sh/train_000000.bin"

# The same run (same seed) saved in both formats; the safetensors file read back and written
# as an llm.c file: byte-identical to the direct one.
mkdir "$tmp/a" "$tmp/hf"
# shellcheck disable=SC2086
expect 0 "model written to $tmp/a/m.bin" "train --save-model m.bin" -- \
  "$prog" train $tiny $shards --max-steps 8 --save-model "$tmp/a/m.bin"
# shellcheck disable=SC2086
expect 0 "model written to $tmp/hf/m.safetensors" "train --save-model m.safetensors" -- \
  "$prog" train $tiny $shards --max-steps 8 --save-model "$tmp/hf/m.safetensors"
grep -q '"n_layer": 2' "$tmp/hf/config.json" && ok || bad "config.json: no n_layer 2"
# shellcheck disable=SC2086
expect 0 "the parameters were read from $tmp/hf/m.safetensors" "train --init-from m.safetensors" -- \
  "$prog" train $tiny $shards --max-steps 1 --lr 0 --init-from "$tmp/hf/m.safetensors" \
  --save-model "$tmp/a/back.bin"
cmp -s "$tmp/a/m.bin" "$tmp/a/back.bin" && ok || bad "safetensors -> llm.c differs from the direct llm.c file"
# a directory (model.safetensors + config.json) to a directory, then to an llm.c file
mv "$tmp/hf/m.safetensors" "$tmp/hf/model.safetensors"
mkdir "$tmp/hf2"
# shellcheck disable=SC2086
expect 0 "model written to $tmp/hf2" "train --init-from DIR --save-model DIR" -- \
  "$prog" train $tiny $shards --max-steps 1 --lr 0 --init-from "$tmp/hf" --save-model "$tmp/hf2"
cmp -s "$tmp/hf/model.safetensors" "$tmp/hf2/model.safetensors" && ok ||
  bad "DIR -> DIR: model.safetensors differs"
# an existing safetensors file is replaced
# shellcheck disable=SC2086
expect 0 "model written to $tmp/hf2/model.safetensors" "--save-model over a safetensors file" -- \
  "$prog" train $tiny $shards --max-steps 1 --lr 0 --init-from "$tmp/a/m.bin" \
  --save-model "$tmp/hf2/model.safetensors"
cmp -s "$tmp/hf/model.safetensors" "$tmp/hf2/model.safetensors" && ok ||
  bad "llm.c -> safetensors differs from the direct safetensors file"
# generate: the same text from both formats
g1=$("$prog" generate --model-file "$tmp/a/m.bin" --tokens 40 --seed 5 2>&1 | od -An -tx1)
g2=$("$prog" generate --model-file "$tmp/hf" --tokens 40 --seed 5 2>&1 | od -An -tx1)
[ -n "$g1" ] && [ "$g1" = "$g2" ] && ok || bad "generate: llm.c and safetensors models differ"

# --save-dtype bf16: every value the oracle's round-to-nearest-even of the fp32 file's;
# --save-shard-size: shards and their index, read back bit-exact (the llm.c file of the same
# parameters byte-identical), generate the same text; the two options refused where they mean
# nothing.
mkdir "$tmp/b16" "$tmp/sh16"
# shellcheck disable=SC2086
expect 0 "model written to $tmp/b16" "train --save-dtype bf16" -- \
  "$prog" train $tiny $shards --max-steps 1 --lr 0 --init-from "$tmp/hf" --save-model "$tmp/b16" \
  --save-dtype bf16
expect 0 "oracle: 28 tensors rounded to nearest even" "bf16 values" -- \
  python3 "$oracle" bf16 "$tmp/hf/model.safetensors" "$tmp/b16/model.safetensors"
grep -q '"torch_dtype": "bfloat16"' "$tmp/b16/config.json" && ok || bad "bf16 config.json: torch_dtype"
# shellcheck disable=SC2086
expect 0 "model written to $tmp/sh16" "train --save-shard-size 16KB" -- \
  "$prog" train $tiny $shards --max-steps 1 --lr 0 --init-from "$tmp/hf" --save-model "$tmp/sh16" \
  --save-shard-size 16KB
[ -f "$tmp/sh16/model.safetensors.index.json" ] && [ ! -f "$tmp/sh16/model.safetensors" ] &&
  n=$(ls "$tmp/sh16" | grep -c '^model-000[0-9][0-9]-of-000[0-9][0-9].safetensors$') && [ "$n" -ge 3 ] && ok ||
  bad "--save-shard-size 16KB: $(ls "$tmp/sh16" | tr '\n' ' ')"
expect 0 "oracle: the shards hold the file's 28 tensors, bit for bit" "shards against the file" -- \
  python3 "$oracle" same "$tmp/hf/model.safetensors" "$tmp/sh16"
# shellcheck disable=SC2086
expect 0 "the parameters were read from $tmp/sh16" "train --init-from a sharded folder" -- \
  "$prog" train $tiny $shards --max-steps 1 --lr 0 --init-from "$tmp/sh16" --save-model "$tmp/a/sh.bin"
cmp -s "$tmp/a/m.bin" "$tmp/a/sh.bin" && ok || bad "sharded -> llm.c differs from the direct llm.c file"
g3=$("$prog" generate --model-file "$tmp/sh16" --tokens 40 --seed 5 2>&1 | od -An -tx1)
[ "$g1" = "$g3" ] && ok || bad "generate: the sharded model's text differs"
# shellcheck disable=SC2086
expect 2 "--save-dtype needs --save-model" "--save-dtype without --save-model" -- \
  "$prog" train $tiny $shards --max-steps 1 --save-dtype bf16
# shellcheck disable=SC2086
expect 2 "--save-shard-size: size '5XB' is not a positive whole number" "a bad size" -- \
  "$prog" train $tiny $shards --max-steps 1 --save-model "$tmp/x" --save-shard-size 5XB
# shellcheck disable=SC2086
expect 2 "--save-dtype: 'fp16' is not fp32 or bf16" "--save-dtype fp16" -- \
  "$prog" train $tiny $shards --max-steps 1 --save-model "$tmp/x" --save-dtype fp16
# shellcheck disable=SC2086
expect 1 "--save-dtype: --save-model '$tmp/a/x.bin' is an llm.c model file" "bf16 to an llm.c file" -- \
  "$prog" train $tiny $shards --max-steps 1 --save-model "$tmp/a/x.bin" --save-dtype bf16

# The oracle's model: every value exact after --init-from DIR and --save-model FILE.bin.
mkdir "$tmp/or"
python3 "$oracle" write "$tmp/or" || { echo "FAIL: st_oracle.py write"; exit 1; }
expect 0 "the parameters were read from $tmp/or" "train --init-from the oracle's model" -- \
  "$prog" train --model gpt --n-layer 1 --n-head 2 --n-embd 8 --seq-len 16 --vocab-size 256 \
  $shards --max-steps 1 --lr 0 --init-from "$tmp/or" --save-model "$tmp/or.bin"
expect 0 "oracle: .* parameters exact" "the oracle's values in mpitrain's file" -- \
  python3 "$oracle" check "$tmp/or" "$tmp/or.bin"

# Bad models: named.
mkdir "$tmp/bad"
cp "$tmp/hf/model.safetensors" "$tmp/bad/"
expect 1 "$tmp/bad/config.json' does not exist" "--init-from DIR without config.json" -- \
  "$prog" generate --model-file "$tmp/bad" --tokens 4
printf '{"n_layer": 2, "n_head": 2, "n_embd": 16, "n_positions": 16, "vocab_size": 256}' \
  > "$tmp/bad/config.json"
head -c 5000 "$tmp/hf/model.safetensors" > "$tmp/bad/model.safetensors"
# shellcheck disable=SC2086
expect 1 "bad/model.safetensors': tensor '.*': data_offsets .* past the end of the data" \
  "--init-from a truncated safetensors file" -- \
  "$prog" train $tiny $shards --max-steps 1 --init-from "$tmp/bad"
printf '{"n_layer": 3, "n_head": 2, "n_embd": 16, "n_positions": 16, "vocab_size": 256}' \
  > "$tmp/bad/config.json"
cp "$tmp/hf/model.safetensors" "$tmp/bad/"
expect 1 "has no tensor 'h.2.ln_1.weight'" "config.json of more layers than the file" -- \
  "$prog" generate --model-file "$tmp/bad" --tokens 4
printf 'not a safetensors file' > "$tmp/bad/x.safetensors"
expect 1 "bad/x.safetensors': header length .* is past the end of the file" "--init-from text" -- \
  "$prog" generate --model-file "$tmp/bad/x.safetensors" --tokens 4

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
