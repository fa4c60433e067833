#!/bin/sh
# Llama models as Hugging Face safetensors on the command line: a llama-tiny trained and saved,
# read back by --model llama (the shape of its config.json) and saved again byte-identical
# (--lr 0), as bf16 (each value the oracle's round to nearest even of the fp32 file's) and as
# shards (the oracle: the same tensors; read back byte-identical); generate gives the same text
# from the folder, the file and the shards. A Llama written by tests/st_oracle.py from the format
# alone, of Llama 3.2 1B's structure (16 layers, 32 query and 8 key/value heads, vocabulary
# 128256, rope_theta 500000, tied, BF16; width 128 instead of 2048 so that it fits this test's
# memory: the full shape is read by tests/test_llama_file), runs a step (its loss ln(128256) =
# 11.76 within 0.1: weights of at most 1/16) and is written back with every value exact. Bad
# models and options refused, named. Needs python3 (skipped without). About 25 runs, 30 to 90 s.
set -u
prog=${MPITRAIN:-./mpitrain}
command -v python3 > /dev/null 2>&1 || { echo "no python3: skipped"; exit 77; }
oracle="${srcdir:-.}/tests/st_oracle.py"
# shellcheck source=tests/expect.sh
. "${srcdir:-.}/tests/expect.sh" # pass, fail, ok, bad, expect
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mpt_llama_st_cli.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
EXPECT_TIMEOUT_S=180

awk 'BEGIN { srand(5); split("the a cat dog sat on mat ran fast slow red blue", w, " ");
     for (i = 0; i < 300; i++) { n = 4 + int(rand() * 6); s = "";
       for (j = 0; j < n; j++) s = s w[1 + int(rand() * 12)] " "; print s "." } }' \
  > "$tmp/text.txt"
"$prog" tokenize --bytes -o "$tmp/sh" "$tmp/text.txt" > /dev/null || { echo "FAIL: tokenize"; exit 1; }
shards="--shards $tmp/sh/train_000000.bin"
run="--max-steps 1 --lr 0 --batch-size 2 --no-progress"

mkdir "$tmp/m" "$tmp/b16" "$tmp/shd"
# shellcheck disable=SC2086
expect 0 "model written to $tmp/m" "llama-tiny --save-model DIR" -- \
  "$prog" train --model llama-tiny $shards --max-steps 3 --batch-size 2 --save-model "$tmp/m"
grep -q '"num_key_value_heads": 2' "$tmp/m/config.json" && ok || bad "config.json: no num_key_value_heads 2"
# shellcheck disable=SC2086
expect 0 "model llama: 2 layers, 4 heads (2 key/value), 64 channels, MLP 192, T 64" \
  "--model llama --init-from DIR" -- \
  "$prog" train --model llama --init-from "$tmp/m" $shards $run --save-model "$tmp/m2.safetensors"
cmp -s "$tmp/m/model.safetensors" "$tmp/m2.safetensors" && ok ||
  bad "DIR -> X.safetensors through --lr 0 is not byte-identical"
# shellcheck disable=SC2086
expect 0 "model written to $tmp/b16" "--save-dtype bf16" -- \
  "$prog" train --model llama --init-from "$tmp/m2.safetensors" $shards $run \
  --save-model "$tmp/b16" --save-dtype bf16
expect 0 "oracle: 21 tensors rounded to nearest even" "bf16 values" -- \
  python3 "$oracle" bf16 "$tmp/m/model.safetensors" "$tmp/b16/model.safetensors"
# shellcheck disable=SC2086
expect 0 "model written to $tmp/shd" "--save-shard-size 40KB" -- \
  "$prog" train --model llama-tiny --init-from "$tmp/m" $shards $run --save-model "$tmp/shd" \
  --save-shard-size 40KB
expect 0 "oracle: the shards hold the file's 21 tensors, bit for bit" "shards" -- \
  python3 "$oracle" same "$tmp/m/model.safetensors" "$tmp/shd"
# shellcheck disable=SC2086
expect 0 "the parameters were read from $tmp/shd" "--init-from shards" -- \
  "$prog" train --model llama --init-from "$tmp/shd" $shards $run --save-model "$tmp/m3.safetensors"
cmp -s "$tmp/m/model.safetensors" "$tmp/m3.safetensors" && ok || bad "shards -> file differs"
g1=$("$prog" generate --model-file "$tmp/m" --tokens 30 --seed 4 2>&1 | od -An -tx1)
g2=$("$prog" generate --model-file "$tmp/m2.safetensors" --tokens 30 --seed 4 2>&1 | od -An -tx1)
g3=$("$prog" generate --model-file "$tmp/shd" --tokens 30 --seed 4 2>&1 | od -An -tx1)
[ -n "$g1" ] && [ "$g1" = "$g2" ] && [ "$g1" = "$g3" ] && ok || bad "generate: folder, file and shards differ"

# The same model with Llama 3's RoPE scaling in config.json (transformers 4's rope_scaling; an
# original context of 16 so that it changes positions below T: llama-tiny's head of 16 has
# wavelengths 2 pi, 20, 63, ... against the bands' 4 and 16): read, its scaling shown, written
# back in both spellings and read again byte-identical (--lr 0); generate runs, the same from
# both; its checkpoint is refused to an unscaled resume. (That the scaling computes Hugging
# Face's numbers: tests/test_llama_torch.sh.)
mkdir "$tmp/l3" "$tmp/l3b"
cp "$tmp/m/model.safetensors" "$tmp/l3/"
sed 's/"rope_scaling": null/"rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0, "original_max_position_embeddings": 16, "rope_type": "llama3"}/' \
  "$tmp/m/config.json" > "$tmp/l3/config.json"
# shellcheck disable=SC2086
expect 0 "RoPE theta 10000 (llama3 scaling: factor 8, low/high_freq_factor 1/4, original context 16)" \
  "--init-from a llama3-scaled model" -- \
  "$prog" train --model llama --init-from "$tmp/l3" $shards $run --save-model "$tmp/l3b"
grep -q '"rope_parameters": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0, "original_max_position_embeddings": 16, "rope_theta": 10000.0, "rope_type": "llama3"}' \
  "$tmp/l3b/config.json" && ok || bad "llama3 rope_parameters not written: $(grep rope "$tmp/l3b/config.json")"
grep -q '"rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0, "original_max_position_embeddings": 16, "rope_type": "llama3"}' \
  "$tmp/l3b/config.json" && ok || bad "llama3 rope_scaling not written"
cmp -s "$tmp/m/model.safetensors" "$tmp/l3b/model.safetensors" && ok ||
  bad "the llama3-scaled model through --lr 0 is not byte-identical"
g4=$("$prog" generate --model-file "$tmp/l3" --tokens 30 --seed 4 2>&1 | od -An -tx1)
g5=$("$prog" generate --model-file "$tmp/l3b" --tokens 30 --seed 4 2>&1 | od -An -tx1)
[ -n "$g4" ] && [ "$g4" = "$g5" ] && ok || bad "generate: the llama3 model and its copy differ"
# a checkpoint of the scaled run is not resumed by an unscaled one (run-options.txt)
# shellcheck disable=SC2086
expect 0 "step      2/2" "a llama3-scaled run with checkpoints" -- \
  "$prog" train --model llama --init-from "$tmp/l3" $shards --max-steps 2 --batch-size 2 \
  --no-progress --log-every 1 --checkpoint-dir "$tmp/l3ck" --checkpoint-every 1
# shellcheck disable=SC2086
expect 1 "rope-scaling llama3 factor/low/high/original-context 8/1/4/16 in the checkpointed run, none now" \
  "resuming a llama3-scaled run without its scaling" -- \
  "$prog" train --model llama-tiny $shards --max-steps 2 --batch-size 2 \
  --no-progress --resume "$tmp/l3ck/ckpt-step00000001.mpt"

# The oracle's Llama of Llama 3.2 1B's structure: one step, then every value back exact.
mkdir "$tmp/or"
python3 "$oracle" llama "$tmp/or" || { echo "FAIL: st_oracle.py llama"; exit 1; }
# shellcheck disable=SC2086
expect 0 "step      1/1  loss 11\.[6-8]" "a step of the 1B-structured Llama" -- \
  "$prog" train --model llama --init-from "$tmp/or" $shards --seq-len 16 $run --log-every 1 \
  --save-model "$tmp/or.safetensors"
printf '%s\n' "$out" | grep -q "16 layers, 32 heads (8 key/value), 128 channels, MLP 512, T 131072, vocabulary 128256, RoPE theta 500000, tied head" &&
  ok || bad "the 1B-structured Llama's shape: $(printf '%s\n' "$out" | grep 'model llama:' | head -n 1)"
expect 0 "oracle: 146 Llama tensors exact" "the oracle's values in mpitrain's file" -- \
  python3 "$oracle" llama-check "$tmp/or" "$tmp/or.safetensors"

# --save-model PATH that does not exist yet: without the .safetensors suffix a folder, created
# with its missing parents (with or without a trailing /), holding the same bytes; for a GPT-2
# a suffix-less path is a folder too, while X.bin stays an llm.c model file.
for d in "new/sub" "new2/"; do
  # shellcheck disable=SC2086
  expect 0 "model written to $tmp/$d" "--save-model to a missing folder $d" -- \
    "$prog" train --model llama --init-from "$tmp/m" $shards $run --save-model "$tmp/$d"
  cmp -s "$tmp/m/model.safetensors" "$tmp/${d%/}/model.safetensors" && ok ||
    bad "--save-model $d: not the folder's model.safetensors, byte-identical"
  [ -f "$tmp/${d%/}/config.json" ] && ok || bad "--save-model $d: no config.json"
done
# shellcheck disable=SC2086
expect 0 "model written to $tmp/gnew" "gpt-mini --save-model to a missing folder" -- \
  "$prog" train --model gpt-mini $shards $run --save-model "$tmp/gnew"
[ -f "$tmp/gnew/model.safetensors" ] && [ -f "$tmp/gnew/config.json" ] && ok ||
  bad "gpt-mini --save-model gnew: not a safetensors folder"
# shellcheck disable=SC2086
expect 0 "model written to $tmp/g.bin" "gpt-mini --save-model X.bin" -- \
  "$prog" train --model gpt-mini $shards $run --save-model "$tmp/g.bin"
[ -f "$tmp/g.bin" ] && [ "$(head -c 4 "$tmp/g.bin" | od -An -tu4 | tr -d ' ')" = 20240326 ] &&
  ok || bad "gpt-mini --save-model g.bin: not an llm.c model file"

# Bad models and options: named.
# shellcheck disable=SC2086
expect 2 "--model llama takes its shape from a Hugging Face model's config.json" \
  "--model llama without --init-from" -- "$prog" train --model llama $shards
# shellcheck disable=SC2086
expect 2 "--seq-len 65 is longer than --model llama-tiny's T 64" "--seq-len past T" -- \
  "$prog" train --model llama-tiny $shards --seq-len 65
# shellcheck disable=SC2086
expect 1 "--save-model '$tmp/x.bin': a Llama is written as Hugging Face safetensors" \
  "a Llama to an llm.c file" -- "$prog" train --model llama-tiny $shards $run --save-model "$tmp/x.bin"
: > "$tmp/x.bin"
# shellcheck disable=SC2086
expect 1 "--init-from '$tmp/x.bin': a Llama starts from Hugging Face safetensors" \
  "a Llama from an llm.c file" -- "$prog" train --model llama-tiny $shards $run --init-from "$tmp/x.bin"
mkdir "$tmp/bad"
cp "$tmp/m/model.safetensors" "$tmp/bad/"
sed 's/"num_key_value_heads": 2/"num_key_value_heads": 3/' "$tmp/m/config.json" > "$tmp/bad/config.json"
# shellcheck disable=SC2086
expect 1 "num_attention_heads 4 is not a multiple of num_key_value_heads 3" "heads % kv heads" -- \
  "$prog" train --model llama --init-from "$tmp/bad" $shards $run
sed 's/"rope_scaling": null/"rope_scaling": {"rope_type": "yarn", "factor": 32.0}/' \
  "$tmp/m/config.json" > "$tmp/bad/config.json"
expect 1 "rope_scaling of rope_type 'yarn' is not implemented" "yarn RoPE scaling" -- \
  "$prog" generate --model-file "$tmp/bad" --tokens 4
sed 's/"rope_scaling": null/"rope_scaling": {"rope_type": "llama3", "factor": 32.0}/' \
  "$tmp/m/config.json" > "$tmp/bad/config.json"
expect 1 "low_freq_factor is missing" "llama3 RoPE scaling without its numbers" -- \
  "$prog" generate --model-file "$tmp/bad" --tokens 4
sed 's/"intermediate_size": 192/"intermediate_size": 96/' "$tmp/m/config.json" > "$tmp/bad/config.json"
expect 1 "tensor 'model.layers.0.mlp.gate_proj.weight' has shape \[192, 64\], the config .* gives \[96, 64\]" \
  "a shape that does not match config.json" -- "$prog" generate --model-file "$tmp/bad" --tokens 4
cp "$tmp/m/config.json" "$tmp/bad/config.json"
head -c 30000 "$tmp/m/model.safetensors" > "$tmp/bad/model.safetensors"
# shellcheck disable=SC2086
expect 1 "past the end of the data" "a truncated file" -- \
  "$prog" train --model llama-tiny --init-from "$tmp/bad" $shards $run
# shellcheck disable=SC2086
expect 1 "has hidden_size 64, the model 384" "a file of another shape than the preset" -- \
  "$prog" train --model llama-mini --init-from "$tmp/m" $shards $run

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
