#!/bin/sh
# Bad input to the Llama safetensors models and to --gemm tune's cache, each refused, named, or
# handled: config.json fields out of range, of the wrong type or inconsistent; an index naming
# files outside its folder, itself, a folder or a FIFO; a header length past the file;
# --save-model onto a FIFO; --save-shard-size and --save-dtype garbage; --seq-len past
# max_position_embeddings. --gemm-cache (and MPT_GEMM_CACHE) naming a folder, a FIFO (its open
# blocked the run for good, SIGTERM included), a character device (as root, --gemm-cache
# /dev/null replaced the device by a regular file), 100 MB of garbage or a file in a missing
# folder: the run times the shapes, warns, leaves the special file as it was, and succeeds.
# Also a vocabulary too large for the host, refused before allocation, and three runs sharing
# one cache. About 45 short runs, 30 to 90 s.
set -u
prog=${MPITRAIN:-./mpitrain}
# shellcheck source=tests/expect.sh
. "${srcdir:-.}/tests/expect.sh" # pass, fail, ok, bad, expect
command -v mkfifo > /dev/null 2>&1 || { echo "no mkfifo: skipped"; exit 77; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mpt_llama_bad.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
EXPECT_TIMEOUT_S=120

awk 'BEGIN { for (i = 0; i < 200; i++) print "the cat sat on the mat and ran fast." }' \
  > "$tmp/text.txt"
"$prog" tokenize --bytes -o "$tmp/sh" "$tmp/text.txt" > /dev/null || { echo "FAIL: tokenize"; exit 1; }
run="--shards $tmp/sh/train_000000.bin --max-steps 1 --batch-size 2 --no-progress --lr 0"
mkdir "$tmp/m"
# shellcheck disable=SC2086
expect 0 "model written to $tmp/m" "llama-tiny --save-model DIR" -- \
  "$prog" train --model llama-tiny $run --save-model "$tmp/m"

# config.json: one field replaced (KEY VALUE), then generate
mkdir "$tmp/b"
cp "$tmp/m/model.safetensors" "$tmp/b/"
field() {
  sed "s/\"$1\": [^,]*/\"$1\": $2/" "$tmp/m/config.json" > "$tmp/b/config.json"
  grep -q "\"$1\": $2" "$tmp/b/config.json" || bad "config.json: $1 not replaced"
}
gen_bad() { # KEY VALUE PATTERN
  field "$1" "$2"
  expect 1 "$3" "config.json $1 $2" -- "$prog" generate --model-file "$tmp/b" --tokens 4
}
range="is not an integer in \[1, 2147483647\]"
gen_bad vocab_size -1 "vocab_size $range"
gen_bad vocab_size 0 "vocab_size $range"
gen_bad vocab_size 1e40 "vocab_size $range"
gen_bad vocab_size '"256"' "vocab_size $range"
gen_bad vocab_size 2147483647 "holds 2^31 elements or more"
gen_bad vocab_size 300 "has shape \[256, 64\], the config"
gen_bad hidden_size 0 "hidden_size $range"
gen_bad hidden_size 2.5 "hidden_size $range"
gen_bad hidden_size 66 "head_dim is not hidden_size / num_attention_heads (66 / 4)"
gen_bad num_attention_heads 3 "num_attention_heads 3 is not a multiple of num_key_value_heads 2"
gen_bad num_attention_heads 0 "num_attention_heads $range"
gen_bad num_key_value_heads 0 "num_key_value_heads $range"
gen_bad num_key_value_heads 8 "num_attention_heads 4 is not a multiple of num_key_value_heads 8"
gen_bad num_key_value_heads null "num_key_value_heads $range"
gen_bad num_hidden_layers 1000000 "has no tensor 'model.layers.2.input_layernorm.weight'"
gen_bad num_hidden_layers 1 "holds tensor 'model.layers.1.input_layernorm.weight', which is not"
gen_bad max_position_embeddings 0 "max_position_embeddings $range"
gen_bad intermediate_size 100000000 "holds 2^31 elements or more"
gen_bad rms_norm_eps NaN "invalid JSON"
gen_bad rms_norm_eps -1 "rms_norm_eps is not a number in \[0, 1\]"
gen_bad rope_theta 0 "rope_theta is not a number in \[1, 1e+30\]"
gen_bad tie_word_embeddings '"yes"' "tie_word_embeddings is not true or false"
# tie_word_embeddings against the tensors: true with an lm_head.weight reads as transformers
# does (the head is the embedding; lm_head.weight not read); false without one is refused
field tie_word_embeddings true
mkdir "$tmp/t"
# shellcheck disable=SC2086
expect 0 "tied head" "tie_word_embeddings true beside an lm_head.weight" -- \
  "$prog" train --model llama --init-from "$tmp/b" $run --save-model "$tmp/t"
sed 's/"tie_word_embeddings": true/"tie_word_embeddings": false/' "$tmp/t/config.json" \
  > "$tmp/t/c.json" && mv "$tmp/t/c.json" "$tmp/t/config.json"
expect 1 "has no tensor 'lm_head.weight'" "tie_word_embeddings false without lm_head.weight" -- \
  "$prog" generate --model-file "$tmp/t" --tokens 4
field max_position_embeddings 16
# shellcheck disable=SC2086
expect 1 "--seq-len 17 is longer than the model's T 16 (max_position_embeddings)" \
  "--seq-len past max_position_embeddings" -- \
  "$prog" train --model llama --init-from "$tmp/b" $run --seq-len 17
expect 0 "" "generate past max_position_embeddings" -- \
  "$prog" generate --model-file "$tmp/b" --tokens 40 --prompt "the cat sat on the mat and ran."
printf '{"hidden_size": 64' > "$tmp/b/config.json"
expect 1 "model config '$tmp/b/config.json'" "a cut config.json" -- \
  "$prog" generate --model-file "$tmp/b" --tokens 4
rm "$tmp/b/config.json"
mkdir "$tmp/b/config.json"
expect 1 "is not a regular file" "config.json a folder" -- \
  "$prog" generate --model-file "$tmp/b" --tokens 4
rmdir "$tmp/b/config.json"
mkfifo "$tmp/b/config.json"
expect 1 "is not a regular file" "config.json a FIFO" -- \
  "$prog" generate --model-file "$tmp/b" --tokens 4
rm -f "$tmp/b/config.json"

# model.safetensors.index.json
mkdir "$tmp/i"
cp "$tmp/m/config.json" "$tmp/i/"
cp "$tmp/m/model.safetensors" "$tmp/x.safetensors"
index() { printf '{"metadata": {}, "weight_map": {"model.embed_tokens.weight": %s}}\n' "$1" \
  > "$tmp/i/model.safetensors.index.json"; }
index '"../x.safetensors"'
expect 1 "is not mapped to a file name" "an index naming ../" -- \
  "$prog" generate --model-file "$tmp/i" --tokens 4
index '"model.safetensors.index.json"'
expect 1 "safetensors" "an index naming itself" -- \
  "$prog" generate --model-file "$tmp/i" --tokens 4
printf '{"weight_map": {"a": "s.safetensors", "a": "s.safetensors"}}\n' \
  > "$tmp/i/model.safetensors.index.json"
expect 1 "duplicate key 'a'" "an index with a tensor twice" -- \
  "$prog" generate --model-file "$tmp/i" --tokens 4
index '"s.safetensors"'
mkdir "$tmp/i/s.safetensors"
expect 1 "is not a regular file" "a shard that is a folder" -- \
  "$prog" generate --model-file "$tmp/i" --tokens 4
rmdir "$tmp/i/s.safetensors"
mkfifo "$tmp/i/s.safetensors"
expect 1 "is not a regular file" "a shard that is a FIFO" -- \
  "$prog" generate --model-file "$tmp/i" --tokens 4
rm -f "$tmp/i/s.safetensors"
printf '\377\377\377\377\377\377\377\177{}' > "$tmp/i/s.safetensors"
expect 1 "safetensors" "a header length of 2^63" -- \
  "$prog" generate --model-file "$tmp/i" --tokens 4
printf '\020\000\000\000\000\000\000\000{"a": 1}' > "$tmp/i/s.safetensors"
expect 1 "safetensors" "a header length past the file" -- \
  "$prog" generate --model-file "$tmp/i" --tokens 4

# A vocabulary of 4 million (2 GB of float32, a sparse file): refused by the memory bound
# before anything is allocated (MPITRAIN_HOST_MEMORY stands for a host of 512 MiB)
if command -v python3 > /dev/null 2>&1; then
  mkdir "$tmp/huge"
  python3 - "$tmp/m" "$tmp/huge" << 'PY'
import json, struct, sys
src, dst = sys.argv[1], sys.argv[2]
raw = open(src + "/model.safetensors", "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
head, data = json.loads(raw[8:8 + n]), raw[8 + n:]
V, out, off, parts = 4000000, {}, 0, []
for k in sorted((k for k in head if k != "__metadata__"), key=lambda k: head[k]["data_offsets"][0]):
    t = head[k]
    s, e = t["data_offsets"]
    big = k in ("model.embed_tokens.weight", "lm_head.weight")
    nb = V * t["shape"][1] * 4 if big else e - s
    out[k] = {"dtype": t["dtype"], "shape": [V, t["shape"][1]] if big else t["shape"],
              "data_offsets": [off, off + nb]}
    parts.append((off, None if big else data[s:e]))
    off += nb
h = json.dumps(out).encode()
h += b" " * (-len(h) % 8)
with open(dst + "/model.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h)
    base = f.tell()
    for o, d in parts:
        if d is not None:
            f.seek(base + o)
            f.write(d)
    f.truncate(base + off)
c = json.load(open(src + "/config.json"))
c["vocab_size"] = V
json.dump(c, open(dst + "/config.json", "w"))
PY
  expect 1 "needs at least 4.8 GiB to sample from" "generate from a 2 GB model on 512 MiB" -- \
    env MPITRAIN_HOST_MEMORY=512M "$prog" generate --model-file "$tmp/huge" --tokens 4
  # shellcheck disable=SC2086
  expect 1 "needs at least 9.5 GiB per rank" "train a 2 GB model on 512 MiB" -- \
    env MPITRAIN_HOST_MEMORY=512M "$prog" train --model llama --init-from "$tmp/huge" $run
  rm -rf "$tmp/huge"
fi

# A GPT-2 safetensors folder: its config.json's fields out of range, and what mpitrain's GPT-2
# computes with fixed (LayerNorm epsilon 1e-5, tanh GELU, tied head), which was read past
mkdir "$tmp/g" "$tmp/gb"
# shellcheck disable=SC2086
expect 0 "model written to $tmp/g" "gpt-mini --save-model DIR" -- \
  "$prog" train --model gpt-mini $run --save-model "$tmp/g"
cp "$tmp/g/model.safetensors" "$tmp/gb/"
gpt_bad() { # KEY VALUE PATTERN
  sed "s/\"$1\": [^,]*/\"$1\": $2/" "$tmp/g/config.json" > "$tmp/gb/config.json"
  grep -q "\"$1\": $2" "$tmp/gb/config.json" || bad "config.json: $1 not replaced"
  expect 1 "$3" "GPT-2 config.json $1 $2" -- "$prog" generate --model-file "$tmp/gb" --tokens 4
}
grange="is not an integer in \[1, 1073741824\]"
gpt_bad n_embd 0 "n_embd $grange"
gpt_bad n_head 5 "channels 384 not a multiple of heads 5"
gpt_bad n_layer -1 "n_layer $grange"
gpt_bad n_positions 1e9 "n_positions $grange"
gpt_bad n_positions 100 "tensor 'wpe.weight' has shape \[256, 384\], the config"
gpt_bad vocab_size 999999999 "vocabulary size 999999999 outside 1..16777216"
gpt_bad vocab_size '"a"' "vocab_size $grange"
gpt_bad layer_norm_epsilon -1 "layer_norm_epsilon is not a number in \[0, 1\]"
gpt_bad layer_norm_epsilon 1e-6 "layer_norm_epsilon 1e-06 is not 1e-05"
gpt_bad activation_function '"relu"' "activation_function relu is not \"gelu_new\""
gpt_bad tie_word_embeddings false "tie_word_embeddings is not true"

# --save-model and its options
mkfifo "$tmp/f.safetensors"
# shellcheck disable=SC2086
expect 1 "exists and is not a regular file" "--save-model onto a FIFO" -- \
  "$prog" train --model llama-tiny $run --save-model "$tmp/f.safetensors"
[ -p "$tmp/f.safetensors" ] && ok || bad "--save-model replaced the FIFO"
for s in 0 -5 garbage 1e3 99999999999999999999999; do
  # shellcheck disable=SC2086
  expect 2 "size '$s' is not a positive whole number" "--save-shard-size $s" -- \
    "$prog" train --model llama-tiny $run --save-model "$tmp/m" --save-shard-size "$s"
done
# shellcheck disable=SC2086
expect 2 "'fp16' is not fp32 or bf16" "--save-dtype fp16" -- \
  "$prog" train --model llama-tiny $run --save-model "$tmp/m" --save-dtype fp16

# --gemm tune's cache: special files are neither read (a FIFO blocked the open) nor replaced
mkdir "$tmp/cdir"
mkfifo "$tmp/fifo"
head -c 100000000 /dev/zero | tr '\000' 'x' > "$tmp/garbage"
dev=
if [ "$(id -u)" -eq 0 ] && mknod "$tmp/null" c 1 3 2> /dev/null; then dev=null; fi
for c in cdir fifo $dev; do
  # shellcheck disable=SC2086
  expect 0 "GEMM tuning cache '$tmp/$c' is not a regular file" "--gemm-cache $c" -- \
    "$prog" train --model llama-tiny $run --gemm tune --gemm-cache "$tmp/$c"
  printf '%s\n' "$out" | grep -q "the cache could not be written" && ok ||
    bad "--gemm-cache $c: no warning that the cache was not written"
  # shellcheck disable=SC2086
  expect 0 "GEMM tuning cache '$tmp/$c' is not a regular file" "MPT_GEMM_CACHE=$c" -- \
    env MPT_GEMM_CACHE="$tmp/$c" "$prog" train --model llama-tiny $run --gemm tune
done
[ -d "$tmp/cdir" ] && [ -p "$tmp/fifo" ] && ok || bad "the folder or the FIFO was replaced"
[ -z "$dev" ] || { [ -c "$tmp/null" ] && ok || bad "the device was replaced by a file"; }
# shellcheck disable=SC2086
expect 0 "GEMM tuning cache $tmp/garbage: larger than 1 MiB" "--gemm-cache of 100 MB" -- \
  "$prog" train --model llama-tiny $run --gemm tune --gemm-cache "$tmp/garbage"
# shellcheck disable=SC2086
expect 0 "no cache at $tmp/no/such/c.txt yet" "--gemm-cache in a missing folder" -- \
  "$prog" train --model llama-tiny $run --gemm tune --gemm-cache "$tmp/no/such/c.txt"
head -n 1 "$tmp/no/such/c.txt" | grep -q "mpitrain-gemm-cache 1" && ok ||
  bad "the cache in a missing folder was not written"

# Three runs writing one cache at once: each succeeds, the file is one whole cache
for i in 1 2 3; do
  # shellcheck disable=SC2086
  "$prog" train --model llama-tiny $run --gemm tune --gemm-cache "$tmp/shared.txt" \
    > "$tmp/c$i.log" 2>&1 &
  pids="${pids:-} $!"
done
for p in $pids; do wait "$p" || bad "a run sharing the cache failed"; done
head -n 1 "$tmp/shared.txt" | grep -q "mpitrain-gemm-cache 1" && [ "$(tail -n 1 "$tmp/shared.txt")" = end ] &&
  ok || bad "the shared cache is not one whole cache"
[ "$(ls "$tmp" | grep -c '^shared')" -eq 1 ] && ok || bad "temporary files of the shared cache left"

# SIGTERM mid-run of a llama-tiny: exit 75 and a checkpoint that --resume auto continues from
awk 'BEGIN { for (i = 0; i < 3000; i++) print "the cat sat on the mat " i "." }' > "$tmp/long.txt"
"$prog" tokenize --bytes -o "$tmp/lsh" "$tmp/long.txt" > /dev/null || bad "tokenize the long text"
pre="--model llama-tiny --shards $tmp/lsh/train_000000.bin --epochs 1000 --batch-size 2 \
  --no-progress --threads 1 --checkpoint-dir $tmp/ck"
for attempt in first resumed; do
  # shellcheck disable=SC2086
  "$prog" train $pre --resume auto > "$tmp/pre.log" 2>&1 &
  pid=$!
  n=0
  while [ $n -lt 600 ] && ! grep -q "step" "$tmp/pre.log" 2> /dev/null; do sleep 0.2; n=$((n + 1)); done
  sleep 2
  kill -TERM "$pid"
  wait "$pid"
  rc=$?
  [ $rc -eq 75 ] && grep -q "preempted (SIGTERM): exit status 75" "$tmp/pre.log" && ok ||
    bad "$attempt llama-tiny run: status $rc after SIGTERM (want 75): $(tail -n 2 "$tmp/pre.log")"
  ls "$tmp/ck"/ckpt-step*.mpt > /dev/null 2>&1 && ok || bad "no checkpoint after SIGTERM"
done
grep -q "resumed from $tmp/ck: epoch" "$tmp/pre.log" && ok || bad "the second run did not resume"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
