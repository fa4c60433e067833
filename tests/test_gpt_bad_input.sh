#!/bin/sh
# Bad inputs and misuse of the language-model commands: `mpitrain tokenize`, token
# shards and model files, `mpitrain train --model gpt*` and `mpitrain generate`, as a user and as
# a hostile file would give them. Each case expects an exit status (2 a usage error, 1 a failure,
# 0 where the input is legal) and a message naming the problem; none may crash, hang, answer
# silently wrong or leave a partial output behind. Uses a 1-layer GPT of 7664 parameters on a
# 19 kB text; about 110 runs of the program (some under mpirun with 2 ranks), most of the time
# in MPI start-up (about 60 s on two loaded cores). Needs python3 for the hand-made files
# (skipped without it). docs/faults.md F25-F33 and F35-F43 list what these cases found. Prints
# "N passed, N failed".
set -u
prog=${MPITRAIN:-./mpitrain}
command -v python3 > /dev/null 2>&1 || { echo "no python3: skipped"; exit 77; }
EXPECT_TIMEOUT_S=60
# shellcheck source=tests/expect.sh
. "${srcdir:-.}/tests/expect.sh" # pass, fail, ok, bad, expect
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mpt_gpt_bad.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# A text of short sentences (deterministic), 19 kB, as byte-level shards.
awk 'BEGIN { srand(7); split("the a cat dog sat on mat ran fast slow red blue big small " \
     "house tree and of to in", w, " ");
     for (i = 0; i < 600; i++) { n = 5 + int(rand() * 6); s = "";
       for (j = 0; j < n; j++) s = s w[1 + int(rand() * 20)] " "; print s "." } }' \
  > "$tmp/text.txt"
"$prog" tokenize --bytes -o "$tmp/sh" "$tmp/text.txt" > /dev/null ||
  { echo "FAIL: tokenize"; exit 1; }

# ---- tokenize ------------------------------------------------------------------------------
# A file that fails while being read, after earlier shards were written (/proc files say size
# 0 and then give bytes): the run fails and the shards it wrote are removed, so the folder is
# not left holding a partial data set (which the next run would also refuse).
if [ -r /proc/self/status ]; then
  expect 1 "cannot read '/proc/self/status'" "tokenize: a file failing mid-way" -- \
    "$prog" tokenize --bytes --shard-tokens 100 -o "$tmp/part" "$tmp/text.txt" /proc/self/status
  n=$(ls "$tmp/part" 2>/dev/null | wc -l)
  [ "$n" -eq 0 ] && ok || bad "tokenize: a failed run left $n file(s) in its folder"
  expect 0 "tokenize: 17471 training tokens in 175 shards" "tokenize: the folder after a failure" -- \
    "$prog" tokenize --bytes --shard-tokens 100 -o "$tmp/part" "$tmp/text.txt"
fi
# A missing file after a good one: refused before anything is written.
expect 1 "cannot read '$tmp/missing.txt'" "tokenize: a missing second file" -- \
  "$prog" tokenize --bytes --shard-tokens 100 -o "$tmp/miss" "$tmp/text.txt" "$tmp/missing.txt"
n=$(ls "$tmp/miss" 2>/dev/null | wc -l)
[ "$n" -eq 0 ] && ok || bad "tokenize: a missing input left $n file(s) in the folder"

# --val-fraction just under 1 was printed as "validation fraction 1" (the %g of 6 digits).
expect 0 "validation fraction 0.9999999$" "tokenize --val-fraction 0.9999999" -- \
  "$prog" tokenize --bytes --val-fraction 0.9999999 -o "$tmp/f1" "$tmp/text.txt"
# Memory does not grow with the input: a file was read whole into memory (a corpus larger than
# the memory failed, or was killed); now in chunks. Peak resident memory (python's getrusage)
# of a 32 MiB file against a 19 kB one: within 16 MiB (reading it whole adds 32 MiB).
maxrss() {
  python3 -c 'import resource, subprocess, sys
subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)' "$@"
}
truncate -s 32M "$tmp/zeros.txt" 2>/dev/null || dd if=/dev/zero of="$tmp/zeros.txt" bs=1M count=32 2>/dev/null
small_kb=$(maxrss "$prog" tokenize --bytes --val-fraction 0 --shard-tokens 1000000 -o "$tmp/rss1" "$tmp/text.txt")
big_kb=$(maxrss "$prog" tokenize --bytes --val-fraction 0 --shard-tokens 1000000 -o "$tmp/rss2" "$tmp/zeros.txt")
[ -n "$small_kb" ] && [ -n "$big_kb" ] && [ $((big_kb - small_kb)) -lt 16384 ] &&
  [ "$(ls "$tmp/rss2" | wc -l)" -eq 34 ] && ok ||
  bad "tokenize: peak memory ${big_kb:-?} KiB for 32 MiB of text, ${small_kb:-?} KiB for 19 kB"
rm -rf "$tmp/rss1" "$tmp/rss2" "$tmp/zeros.txt"

# ---- model files ---------------------------------------------------------------------------
# mkmodel OUT T V L H C Vp FILL [TENSOR INDEX VALUE]...: an llm.c model file, every parameter
# FILL, then the given elements (TENSOR is 0..15 in llm.c's order) set; the header as given.
mkmodel() {
  python3 - "$@" <<'PY'
import struct, sys
a = sys.argv[1:]
T, V, L, H, C, Vp = [int(x) for x in a[1:7]]
counts = [Vp*C, T*C, L*C, L*C, L*3*C*C, L*3*C, L*C*C, L*C, L*C, L*C, L*4*C*C, L*4*C,
          L*C*4*C, L*C, C, C]
p = [float(a[7])] * sum(counts)
for i in range(8, len(a), 3):
    p[sum(counts[:int(a[i])]) + int(a[i + 1])] = float(a[i + 2])
with open(a[0], "wb") as f:
    f.write(struct.pack("<256i", 20240326, 3, T, V, L, H, C, Vp, *([0] * 248)))
    f.write(struct.pack("<%df" % len(p), *p))
PY
}
tiny="--model gpt --n-layer 1 --n-head 2 --n-embd 16 --seq-len 16 --vocab-size 256"
shards="--shards $tmp/sh/train_000000.bin"
# NaN / Inf weights (a model saved from a run that diverged): named with tensor and element
# (qkvb starts at 4096 + 256 + 2 x 16 + 768 = 5152),
# by generate (which sampled token 0 from NaN logits, printing NUL bytes, status 0) and by
# --init-from (which failed at step 0 on a NaN loss without naming the file).
mkmodel "$tmp/nan.bin" 16 256 1 2 16 256 0.01 5 3 nan
mkmodel "$tmp/inf.bin" 16 256 1 2 16 256 0.01 0 17 -inf
expect 1 "nan.bin': parameter 5155 (qkvb element 3) is nan" "generate: a NaN weight" -- \
  "$prog" generate --model-file "$tmp/nan.bin" --tokens 3
expect 1 "inf.bin': parameter 17 (wte element 17) is -inf" "generate: an infinite weight" -- \
  "$prog" generate --model-file "$tmp/inf.bin" --tokens 3
# shellcheck disable=SC2086
expect 1 "nan.bin': parameter 5155 (qkvb element 3) is nan" "--init-from: a NaN weight" -- \
  "$prog" train $tiny $shards --init-from "$tmp/nan.bin" --max-steps 1
# Finite weights whose logits overflow (the final LayerNorm's bias and wte's channel 0 at 3e38):
# generate stops naming the overflow instead of writing token 0 forever.
args="$tmp/huge.bin 8 256 1 1 4 256 0 15 0 3e38"
for t in $(seq 0 255); do args="$args 0 $((4 * t)) 3e38"; done
# shellcheck disable=SC2086
mkmodel $args
expect 1 "the logit of token 0 is inf after 0 generated token(s)" "generate: logits overflow" -- \
  "$prog" generate --model-file "$tmp/huge.bin" --tokens 3 --temperature 0

# generate's output to a full disk (/dev/full) was lost with status 0: now status 1, named.
mkmodel "$tmp/ok.bin" 16 256 1 2 16 256 0.01
if [ -w /dev/full ]; then
  expect 1 "cannot write the output: No space left on device" "generate > /dev/full" -- \
    sh -c 'exec "$0" generate --model-file "$1" --tokens 5000 > /dev/full' "$prog" "$tmp/ok.bin"
fi
expect 0 "" "generate from a finite model" -- "$prog" generate --model-file "$tmp/ok.bin" --tokens 5

# Hostile headers (status 1, the file and the field named): 0 layers, 0 heads, C not a
# multiple of H, Vp < V, bytes after the parameters, a token shard given as a model.
mkmodel "$tmp/l0.bin" 16 256 0 2 16 256 0.01
mkmodel "$tmp/h0.bin" 16 256 1 0 16 256 0.01
mkmodel "$tmp/h3.bin" 16 256 1 3 16 256 0.01
mkmodel "$tmp/vp.bin" 16 256 1 2 16 128 0.01
cp "$tmp/ok.bin" "$tmp/extra.bin" && printf 'abcd' >> "$tmp/extra.bin"
for case in "l0.bin|layers 0 outside 1..4096" "h0.bin|heads 0 outside" \
            "h3.bin|channels 16 not a multiple of heads 3" \
            "vp.bin|padded vocabulary 128 outside 256" "extra.bin|bytes after the parameters" \
            "sh/train_000000.bin|this is a token shard, not a model file"; do
  expect 1 "${case#*|}" "generate: model file ${case%%|*}" -- \
    "$prog" generate --model-file "$tmp/${case%%|*}" --tokens 2
done
# generate and memory: a model file's parameters (held three times: the parameters, their
# gradients and the file's copy) or a long context (the logits [context, Vp]) past the host's
# memory are refused before any allocation, naming the bound and the host's memory. Without a
# limit (a sparse 1.6 GB file of 4 bytes on disk is enough to ask for 4.8 GB) each allocation
# alone fits and touching them all ended in the kernel's OOM killer; as in the train cases
# below, the limit is fixed with ulimit -v (2 GiB) so the case is the same on any machine.
python3 - "$tmp/sparse.bin" <<'PY'
import struct, sys
T, V, L, H, C, Vp = 16, 256, 2, 1, 4096, 256
n = Vp * C + T * C + L * (12 * C * C + 13 * C) + 2 * C
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240326, 3, T, V, L, H, C, Vp, *([0] * 248)))
    f.truncate(1024 + 4 * n)
PY
expect 1 "model file '$tmp/sparse.bin' (403881984 parameters, a context of 3 tokens) needs at least 4.5 GiB to sample from .* this host has 2.0 GiB" \
  "generate: a model larger than the memory" -- sh -c "ulimit -v 2097152 && exec \"\$0\" \"\$@\"" \
  "$prog" generate --model-file "$tmp/sparse.bin" --tokens 2
mkmodel "$tmp/v64k.bin" 65536 65536 1 1 1 65536 0.01
ids=$(python3 -c 'print(" ".join(["1"] * 30000))')
expect 1 "(131099 parameters, a context of 30001 tokens) needs at least 7.3 GiB .*: give fewer --tokens or a shorter --prompt" \
  "generate: a context larger than the memory" -- sh -c "ulimit -v 2097152 && exec \"\$0\" \"\$@\"" \
  "$prog" generate --model-file "$tmp/v64k.bin" --prompt "$ids" --tokens 1
expect 0 "" "generate: a small model under ulimit -v 3 GiB" -- sh -c "ulimit -v 3145728 && exec \"\$0\" \"\$@\"" \
  "$prog" generate --model-file "$tmp/ok.bin" --tokens 5
rm -f "$tmp/sparse.bin"
# generate's arguments (status 2): the value and its range named
for case in "--tokens 0|--tokens '0' must be an integer in \[1, 1000000\]" \
            "--tokens 2000000|--tokens '2000000'" "--temperature nan|--temperature 'nan'" \
            "--top-k -1|--top-k '-1'" "--seed -1|--seed '-1'"; do
  # shellcheck disable=SC2086
  expect 2 "${case#*|}" "generate ${case%%|*}" -- \
    "$prog" generate --model-file "$tmp/ok.bin" ${case%%|*}
done
# A seed past 2^53 was refused as "not a non-negative integer", and a temperature that
# underflows a double ('1e-310', strtod's ERANGE) as outside [0, 100]: the range is named, and
# the tiny temperature samples.
expect 2 "--seed '18446744073709551615' must be an integer in \[0, 9007199254740992\]" \
  "generate --seed 2^64 - 1" -- "$prog" generate --model-file "$tmp/ok.bin" --seed 18446744073709551615
n=$("$prog" generate --model-file "$tmp/ok.bin" --temperature 1e-310 --tokens 20 --prompt a | wc -c)
[ "$n" -eq 22 ] && ok || bad "generate --temperature 1e-310: $n bytes, expected 22"
expect 2 "--prompt is empty" "generate --prompt ''" -- \
  "$prog" generate --model-file "$tmp/ok.bin" --prompt ""
# A vocabulary of more than bytes takes token ids as the prompt: text, or an id past V, is named.
mkmodel "$tmp/v300.bin" 8 300 1 1 4 384 0.01
expect 2 "'hello' is not a list of token ids in \[0, 300)" "generate: text for token ids" -- \
  "$prog" generate --model-file "$tmp/v300.bin" --prompt hello
expect 2 "'1 300' is not a list of token ids" "generate: an id past V" -- \
  "$prog" generate --model-file "$tmp/v300.bin" --prompt "1 300"
expect 0 "" "generate: ids" -- "$prog" generate --model-file "$tmp/v300.bin" --prompt "1, 299" --tokens 2

# ---- token shards ---------------------------------------------------------------------------
# (A glob matching nothing and a token outside the vocabulary: tests/test_train_gpt.sh.)
# mkshard OUT MAGIC VERSION COUNT NTOKENS VALUE: a header saying COUNT, then NTOKENS tokens.
mkshard() {
  python3 -c 'import struct, sys
a = [int(x) for x in sys.argv[2:]]
open(sys.argv[1], "wb").write(struct.pack("<256i", a[0], a[1], a[2], *([0] * 253)) +
                              struct.pack("<%dH" % a[3], *([a[4]] * a[3])))' "$@"
}
mkshard "$tmp/magic.bin" 20240521 1 200 200 5
mkshard "$tmp/ver.bin" 20240520 2 200 200 5
mkshard "$tmp/lie.bin" 20240520 1 300 200 5
mkshard "$tmp/neg.bin" 20240520 1 -5 200 5
mkshard "$tmp/empty.bin" 20240520 1 0 0 0
mkshard "$tmp/short.bin" 20240520 1 128 128 5 # one token short of B 8 x T 16 + 1
mkdir "$tmp/dir.bin"
for case in "magic.bin|has magic 20240521, expected 20240520" "ver.bin|has version 2, expected 1" \
            "lie.bin|header says 300 tokens (1624 bytes): truncated" \
            "neg.bin|negative token count -5" "empty.bin|no shard holds a window of B\*T+1 = 129" \
            "short.bin|(1 shard, 128 tokens in all)" "dir.bin|is not a regular file" \
            "ok.bin|this is an llm.c model file, not a shard"; do
  # shellcheck disable=SC2086
  expect 1 "${case#*|}" "train --shards ${case%%|*}" -- \
    "$prog" train $tiny --shards "$tmp/${case%%|*}" --max-steps 1
done
# shellcheck disable=SC2086
expect 1 "short.bin': no shard holds a window" "train --val-shards too short" -- \
  "$prog" train $tiny $shards --val-shards "$tmp/short.bin" --max-steps 1
# exactly one window (B 8 x T 16 + 1 tokens): legal
mkshard "$tmp/one.bin" 20240520 1 129 129 5
# shellcheck disable=SC2086
expect 0 "step      1/1" "train on a shard of one window" -- \
  "$prog" train $tiny --shards "$tmp/one.bin" --max-steps 1
# ... on 2 ranks with --drop-last no rank has a window: the error blamed "--accumulate 1",
# which was not given; it names the windows, the ranks and --drop-last.
# shellcheck disable=SC2086
expect 1 "an epoch has no micro-batch of 1 sample(s) on this rank (1 sample(s) in the data, 2 rank(s), --drop-last)" \
  "train: 1 window, 2 ranks, --drop-last" -- "${srcdir:-.}/tests/mpirun.sh" 2 60 "$prog" train \
  $tiny --shards "$tmp/one.bin" --max-steps 1 --drop-last

# Two ranks whose relative --shards glob reads other files (mpirun MPMD with -wdir): with other
# window counts the ranks ran different numbers of steps and their collectives crossed (an
# all-reduce of 2 floats met a gradient bucket: MPI_ERR_TRUNCATE, or a bus error, signal 7);
# with the same counts and other tokens they trained silently. Now every rank stops before
# training, naming the rank, what differs and the files. Shards of 600000 tokens (1.2 MB, above
# the 1 MiB the check reads whole) that differ in their last token only are caught by its
# sampled blocks; identical copies train.
case $prog in /*) abs=$prog ;; *) abs=$(pwd)/$prog ;; esac
# mkdiff OUT COUNT VALUE LAST: COUNT tokens of VALUE, the last one LAST
mkdiff() {
  python3 -c 'import struct, sys
n, v, z = (int(x) for x in sys.argv[2:])
open(sys.argv[1], "wb").write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)) +
                              struct.pack("<%dH" % n, *([v] * (n - 1) + [z])))' "$@"
}
for r in a b c d e f; do mkdir -p "$tmp/r$r/d"; done
mkdiff "$tmp/ra/d/t.bin" 2000 5 5
mkdiff "$tmp/rb/d/t.bin" 1000 5 5
mkdiff "$tmp/rc/d/t.bin" 2000 6 6
cp "$tmp/ra/d/t.bin" "$tmp/rd/d/t.bin" && mkdiff "$tmp/rd/d/v.bin" 500 5 5
mkdiff "$tmp/ra/d/v.bin" 400 5 5
mkdiff "$tmp/re/d/t.bin" 600000 5 5
mkdiff "$tmp/rf/d/t.bin" 600000 5 9
# two A B EXTRA...: rank 0 in $tmp/rA, rank 1 in $tmp/rB, the same command line (a script, for
# expect's timeout)
cat > "$tmp/two.sh" <<EOF
#!/bin/sh
a=\$1 b=\$2
shift 2
exec "${srcdir:-.}/tests/mpirun.sh" 1 60 -wdir "$tmp/r\$a" "$abs" train $tiny --shards d/t.bin \\
  --max-steps 1 "\$@" : -np 1 -wdir "$tmp/r\$b" "$abs" train $tiny --shards d/t.bin \\
  --max-steps 1 "\$@"
EOF
chmod +x "$tmp/two.sh"
expect 1 "ranks read different token shards (--shards, the number of tokens): rank 1 has 1000 from 'd/t.bin' (first shard $tmp/rb/d/t.bin) on .*, rank 0 has 2000" \
  "2 ranks, shards of other sizes" -- "$tmp/two.sh" a b
expect 1 "(--shards, the tokens (a sample of each shard)): rank 1 has CRC-32" \
  "2 ranks, shards of other tokens" -- "$tmp/two.sh" a c
expect 1 "(--val-shards, the number of tokens): rank 1 has 500" \
  "2 ranks, validation shards of other sizes" -- "$tmp/two.sh" a d --val-shards d/v.bin
expect 1 "(--shards, the tokens (a sample of each shard)): rank 1 has CRC-32" \
  "2 ranks, 1.2 MB shards differing in the last token" -- "$tmp/two.sh" e f
expect 0 "step      1/1" "2 ranks, identical copies" -- "$tmp/two.sh" a d
# Two ranks started with other options (MPMD): another --lr (the same shapes) trained
# silently, each replica its own way; the mlp/cnn trainer's check of the command lines now runs
# in the GPT trainer too.
# shellcheck disable=SC2086
expect 1 "ranks were started with different options: rank 1 has '0.1' where rank 0 has '0.001' (after '--lr')" \
  "2 ranks, other --lr" -- "${srcdir:-.}/tests/mpirun.sh" 1 60 "$prog" train $tiny $shards \
  --max-steps 1 --lr 0.001 : -np 1 "$prog" train $tiny $shards --max-steps 1 --lr 0.1

# A token outside the vocabulary in the last window only is found at start-up, before step 1,
# on one rank and on two (where rank 1 checks the second shard and rank 0 names rank 1), not
# when that window comes up (before: only if the sampler drew it).
mkdir "$tmp/late"
python3 -c 'import struct, sys
for name, bad in (("a", 5), ("b", 300)):
    toks = [5] * 6400 + [bad]  # 50 windows of B 8 x T 16 + 1 tokens; the last id is `bad`
    open(sys.argv[1] + "/lt_" + name + ".bin", "wb").write(
        struct.pack("<256i", 20240520, 1, len(toks), *([0] * 253)) + struct.pack("<%dH" % len(toks), *toks))' "$tmp/late"
# shellcheck disable=SC2086
expect 1 "lt_b.bin': token 6400 (byte offset 13824) is 300, outside the vocabulary of 256" \
  "a bad id in the last window, found at start-up" -- \
  "$prog" train $tiny --shards "$tmp/late/lt_b.bin" --max-steps 1
# shellcheck disable=SC2086
out=$(timeout 120 "${srcdir:-.}/tests/mpirun.sh" 2 60 "$prog" train $tiny \
      --shards "$tmp/late/lt_*.bin" --max-steps 1 2>&1)
rc=$?
if [ $rc -ne 0 ] && printf '%s\n' "$out" | grep -q "rank 1 found bad token data" &&
   printf '%s\n' "$out" | grep -q "lt_b.bin': token 6400 (byte offset 13824) is 300" &&
   ! printf '%s\n' "$out" | grep -q "step      1/1"; then
  ok
else
  bad "a bad id in rank 1's shard, 2 ranks (status $rc): $(printf '%s' "$out" | tail -n 4)"
fi

# ---- train: sizes (status 2, the option and its range named) --------------------------------
for case in "--n-embd 0|--n-embd: 0 is outside \[1, 65536\]" \
            "--n-head 7 --n-embd 384|--n-embd 384 is not a multiple of --n-head 7" \
            "--seq-len 0|--seq-len: 0 is outside" "--vocab-size 70000|--vocab-size: 70000 is outside \[1, 65536\]" \
            "--vocab-size 0|--vocab-size: 0 is outside" "--batch-size 0|--batch-size: 0 is outside" \
            "--accumulate 0|--accumulate: 0 is outside" "--grad-clip nan|'nan' is not a finite number"; do
  # shellcheck disable=SC2086
  expect 2 "${case#*|}" "train ${case%%|*}" -- "$prog" train --model gpt $shards ${case%%|*}
done

# A number that underflows a double ('1e-310': strtod's ERANGE) was refused as "not a finite
# number" (train) or outside [0, 1) (tokenize); it is the small number it is. But the trainers
# use --lr in float, where it (and one that underflows a double) is 0: refused (faults.md F45).
# shellcheck disable=SC2086
expect 2 "--lr: 1e-310 is below the smallest normal float" "train --lr 1e-310" -- \
  "$prog" train $tiny $shards --max-steps 1 --lr 1e-310
# shellcheck disable=SC2086
expect 2 "--lr: -1e-400 is below the smallest normal float" "train --lr -1e-400 (-0)" -- \
  "$prog" train $tiny $shards --max-steps 1 --lr -1e-400
expect 0 "validation fraction 1e-310" "tokenize --val-fraction 1e-310" -- \
  "$prog" tokenize --bytes --val-fraction 1e-310 -o "$tmp/uf" "$tmp/text.txt"

# --top-k near the vocabulary (GPT-2's 50257): the k-th largest logit was found in k passes
# over V, about 2.5e9 steps (a second or more) per token; now a sort. 60 tokens within 15 s
# (before: a minute on these machines).
mkmodel "$tmp/v50k.bin" 8 50257 1 1 4 50304 0.01
n=$(timeout 15 "$prog" generate --model-file "$tmp/v50k.bin" --tokens 60 --top-k 50000 | wc -l)
[ "$n" -eq 60 ] && ok || bad "generate --top-k 50000: $n of 60 tokens within 15 s"

# ---- train: options -----------------------------------------------------------------------
# Options of the image models were silently ignored with a GPT (a --hidden that changed
# nothing): a usage error naming the option and the model's reason. (The loop's own options,
# --metrics-json, --trace, --mode dp..., work with every model: tests/test_options_models.sh.)
for opt in "--hidden 10" "--batchnorm" "--conv-algo im2col" "--dropout 0.1" "--data $tmp" \
           "--synthetic"; do
  name=${opt%% *}
  # shellcheck disable=SC2086
  expect 2 "$name does not apply to --model gpt: " "train $opt with a GPT" -- \
    "$prog" train $tiny $shards --max-steps 1 $opt
done
# Options that have no effect in this GPT run were taken without a word (a --checkpoint-every
# without --checkpoint-dir writes no checkpoint): a warning each, as the mlp trainer gives.
# shellcheck disable=SC2086
"$prog" train $tiny $shards --max-steps 1 --checkpoint-every 1 --momentum 0.5 --gam 0.5 \
  --bucket-cap-mb 1 > "$tmp/unused.log" 2>&1
for w in "--checkpoint-every has no effect: no --checkpoint-dir" \
         "--momentum has no effect: AdamW has no momentum option" \
         "--gamma has no effect: it applies to --schedule step only" \
         "--bucket-cap-mb has no effect: one rank"; do
  grep -q -- "warning: $w" "$tmp/unused.log" && ok || bad "no warning '$w': $(tail -n 2 "$tmp/unused.log")"
done
# --val-every without validation shards validated nothing, silently.
# shellcheck disable=SC2086
expect 2 "--val-every needs --val-shards" "train --val-every without --val-shards" -- \
  "$prog" train $tiny $shards --val-every 2 --max-steps 4

# --max-steps beyond the data (17471 tokens are 136 windows of B 8 x T 16 + 1): the run ended
# after one epoch without a word; now a warning names both figures (the run is legal).
# shellcheck disable=SC2086
expect 0 "warning: --max-steps 100000 is more than the 136 steps of an epoch" \
  "train --max-steps beyond the data" -- "$prog" train $tiny $shards --max-steps 100000

# A --shards glob that also takes the validation shard (every .bin of tokenize's folder): the
# validation loss measured text trained on, silently. Refused naming the file, also when the
# validation path is another spelling (a symbolic link) of a training shard.
# shellcheck disable=SC2086
expect 1 "token shard '$tmp/sh/val_000000.bin' is both a training shard" \
  "train: validation shards among the training shards" -- \
  "$prog" train $tiny --shards "$tmp/sh/*.bin" --val-shards "$tmp/sh/val_*.bin" --max-steps 1
ln -s "$tmp/sh/train_000000.bin" "$tmp/link.bin"
# shellcheck disable=SC2086
expect 1 "validation shard (--val-shards, as '$tmp/link.bin')" "train: validation = training, linked" -- \
  "$prog" train $tiny $shards --val-shards "$tmp/link.bin" --max-steps 1
# A glob that takes one shard twice (a symbolic or a hard link beside it) trained its windows
# twice in every epoch, silently; the same in --val-shards counted them
# twice in the loss. Refused naming both paths.
mkdir "$tmp/dup" && cp "$tmp/sh/train_000000.bin" "$tmp/dup/a.bin"
ln "$tmp/dup/a.bin" "$tmp/dup/b.bin" && ln -s a.bin "$tmp/dup/c.bin"
# shellcheck disable=SC2086
expect 1 "--shards: '$tmp/dup/a.bin' and '$tmp/dup/b.bin' are the same file (a link)" \
  "train: a shard twice (hard link)" -- "$prog" train $tiny --shards "$tmp/dup/*.bin" --max-steps 1
rm "$tmp/dup/b.bin"
# shellcheck disable=SC2086
expect 1 "--val-shards: '$tmp/dup/a.bin' and '$tmp/dup/c.bin' are the same file (a link)" \
  "train: a validation shard twice (symbolic link)" -- "$prog" train $tiny \
  --shards "$tmp/sh/train_*.bin" --val-shards "$tmp/dup/*.bin" --max-steps 1
# shellcheck disable=SC2086
expect 0 "val loss" "train: disjoint validation shards" -- \
  "$prog" train $tiny $shards --val-shards "$tmp/sh/val_*.bin" --max-steps 1

# Validation over many windows: the window losses were summed in float, whose sum of 100000
# losses of about 5.5 rounds every addition by up to 2^-5: over 100000 windows of one token pair
# (all the same loss) the mean came to 5.5402 where each window's is 5.5452. Summed in double,
# the mean is the window's.
python3 -c 'import struct, sys
n = 100001  # windows of B 1 x T 1 + 1: 100000
open(sys.argv[1], "wb").write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)) +
                              struct.pack("<%dH" % n, *([7] * n)))' "$tmp/same.bin"
one="--model gpt --n-layer 1 --n-head 1 --n-embd 1 --seq-len 1 --batch-size 1 --vocab-size 256"
# shellcheck disable=SC2086
v1=$("$prog" train $one $shards --val-shards "$tmp/same.bin" --val-steps 1 --max-steps 1 \
  --threads 1 2>&1 | grep -m1 "step      0  val loss")
# shellcheck disable=SC2086
vn=$("$prog" train $one $shards --val-shards "$tmp/same.bin" --val-steps 100000 --max-steps 1 \
  --threads 1 2>&1 | grep -m1 "step      0  val loss")
[ -n "$v1" ] && [ "$v1" = "$vn" ] && ok ||
  bad "validation over 100000 equal windows: '$vn', one window: '$v1'"
# The training loss of a logging interval alike: with --lr 0 every step has the same loss, and
# the mean over a --log-every of 100000 steps came to 5.5402 where one step's is 5.5452.
# shellcheck disable=SC2086
t1=$("$prog" train $one --shards "$tmp/same.bin" --lr 0 --max-steps 1 --threads 1 2>&1 |
  grep -m1 "step      1/1  loss" | sed 's/  norm.*//; s/.*loss/loss/')
# shellcheck disable=SC2086
tn=$("$prog" train $one --shards "$tmp/same.bin" --lr 0 --max-steps 100000 --log-every 100000 \
  --threads 1 2>&1 | grep -m1 "step 100000/100000  loss" | sed 's/  norm.*//; s/.*loss/loss/')
[ -n "$t1" ] && [ "$t1" = "$tn" ] && ok ||
  bad "training loss over 100000 equal steps: '$tn', one step: '$t1'"

# ---- train: --resume with other options ----------------------------------------------------
# A checkpoint after 3 steps of B 2; resuming it with another --accumulate, --batch-size or --lr
# continued silently (the epoch position then counts other windows), and with --n-head 4 or
# --vocab-size 200 (the same tensor shapes) loaded the parameters into another model. Now each
# is refused naming both values (--accumulate: the global batch it would change, as a product
# that equals it, and the setting that keeps it; --max-steps, which sets the epoch's length when
# the data holds more: the checkpoint's); the same options still resume.
# shellcheck disable=SC2086
"$prog" train $tiny $shards --batch-size 2 --max-steps 6 --checkpoint-dir "$tmp/ck" \
  --stop-at-step 3 > "$tmp/ck.log" 2>&1 || bad "checkpointed run: $(tail -n 2 "$tmp/ck.log")"
small="--model gpt --n-layer 1 --n-embd 16 --seq-len 16"
for case in "--accumulate 2|global batch of 1 window(s) of --batch-size x --seq-len tokens per step (1 rank(s) x 1 x accumulate 1), and 1 x 1 x 2 = 2 .*keep it: --accumulate 1" \
            "--max-steps 8|--max-steps changed: the checkpointed run's epochs are 6 steps of 1 sample(s) (its --max-steps, fewer than the data holds), this run's, with --max-steps 8, are 8 steps: give --max-steps 6 to continue the same run" \
            "--batch-size 4|(--batch-size 2), this run's of 4: --batch-size must stay 2" \
            "--lr 0.1|--lr 0.001 in the checkpointed run, 0.1 now"; do
  # shellcheck disable=SC2086
  expect 1 "${case#*|}" "--resume with ${case%%|*}" -- "$prog" train $tiny $shards --batch-size 2 \
    --max-steps 6 --resume "$tmp/ck" ${case%%|*}
done
# shellcheck disable=SC2086
expect 1 "seq-len/vocab-size 1/2/16/16/256 in the checkpointed run, 1/4/16/16/256 now" \
  "--resume with --n-head 4" -- "$prog" train $small --n-head 4 --vocab-size 256 $shards \
  --batch-size 2 --max-steps 6 --resume "$tmp/ck"
# shellcheck disable=SC2086
expect 1 "1/2/16/16/256 in the checkpointed run, 1/2/16/16/200 now" \
  "--resume with --vocab-size 200" -- "$prog" train $small --n-head 2 --vocab-size 200 $shards \
  --batch-size 2 --max-steps 6 --resume "$tmp/ck"
# ... on 2 ranks too (rank 0 compares; the job ends, not only rank 0)
# shellcheck disable=SC2086
expect 1 "global batch of 1 window(s) of --batch-size x --seq-len tokens per step (1 rank(s) x 1 x accumulate 1).*ranks that can: 1" \
  "--resume with --accumulate 2, 2 ranks" -- \
  "${srcdir:-.}/tests/mpirun.sh" 2 60 "$prog" train $tiny $shards --batch-size 2 --max-steps 6 \
  --resume "$tmp/ck" --accumulate 2
# shellcheck disable=SC2086
expect 0 "resumed from .*: epoch 1, global step 3" "--resume with the same options" -- \
  "$prog" train $tiny $shards --batch-size 2 --max-steps 6 --resume "$tmp/ck"

# Resumed on other shards, shorter than the position the checkpoint holds (65 tokens are 2
# windows of B 2 x T 16 + 1, the checkpoint is 3 steps into its epoch): the run said "resumed
# at step 3", trained nothing and exited 0; another --shards trained on other text without a
# word. Refused naming both data set sizes (the checkpoint records its own).
mkshard "$tmp/two.bin" 20240520 1 65 65 5
# shellcheck disable=SC2086
expect 1 "trained on a data set of 545 samples, this run's has 2" \
  "--resume on other, shorter shards" -- "$prog" train $tiny --shards "$tmp/two.bin" \
  --batch-size 2 --max-steps 6 --resume "$tmp/ck"
# ... and the same glob over other, shorter text: refused the same way.
cp "$tmp/sh/train_000000.bin" "$tmp/swap.bin"
# shellcheck disable=SC2086
"$prog" train $tiny --shards "$tmp/swap.bin" --batch-size 2 --max-steps 6 --stop-at-step 3 \
  --checkpoint-dir "$tmp/ck_swap" > /dev/null 2>&1
cp "$tmp/two.bin" "$tmp/swap.bin"
# shellcheck disable=SC2086
expect 1 "trained on a data set of 545 samples, this run's has 2" \
  "--resume on the same glob over shorter text" -- "$prog" train $tiny --shards "$tmp/swap.bin" \
  --batch-size 2 --max-steps 6 --resume "$tmp/ck_swap"

# A checkpoint given as a model file (to sample from it): named as such, with what to do.
expect 1 "this is an mpitrain checkpoint: continue it with --resume, or write a model file" \
  "generate --model-file CHECKPOINT" -- \
  "$prog" generate --model-file "$tmp/ck/ckpt-step00000003.mpt"
# --init-from with --resume auto (a job that starts from a pretrained model and is resubmitted
# after preemption) was refused on every submission: now the first run (no checkpoint) reads
# the model file, and a resubmitted run resumes from the checkpoint without reading it (shown
# with the NaN model: read, it fails naming it; not read, the run resumes).
# shellcheck disable=SC2086
expect 1 "nan.bin': parameter 5155 (qkvb element 3) is nan" "--init-from, --resume auto, new run" -- \
  "$prog" train $tiny $shards --batch-size 2 --max-steps 6 --init-from "$tmp/nan.bin" \
  --resume auto --checkpoint-dir "$tmp/ck_new"
# shellcheck disable=SC2086
expect 0 "resumed from .*: epoch 1, global step 3" "--init-from, --resume auto, checkpoint" -- \
  "$prog" train $tiny $shards --batch-size 2 --max-steps 6 --init-from "$tmp/nan.bin" \
  --resume auto --checkpoint-dir "$tmp/ck"
# shellcheck disable=SC2086
expect 1 "give one" "--init-from with an explicit --resume" -- \
  "$prog" train $tiny $shards --batch-size 2 --max-steps 6 --init-from "$tmp/nan.bin" \
  --resume "$tmp/ck"

# ---- train: outputs --------------------------------------------------------------------------
# --save-model into a folder that does not exist (or a file's path as folder) failed only when
# the model was written, after the whole run: now refused before the first step. The same check
# serves the mlp's --save-params.
# shellcheck disable=SC2086
expect 1 "--save-model '$tmp/nodir/m.bin': its folder '$tmp/nodir' cannot take the file (No such file or directory)" \
  "train --save-model into a missing folder" -- \
  "$prog" train $tiny $shards --max-steps 1 --save-model "$tmp/nodir/m.bin"
# shellcheck disable=SC2086
expect 1 "its folder '$tmp/text.txt' cannot take the file (not a directory)" \
  "train --save-model under a file" -- \
  "$prog" train $tiny $shards --max-steps 1 --save-model "$tmp/text.txt/m.bin"
expect 1 "--save-params '$tmp/nodir/p.bin': its folder" "mlp --save-params into a missing folder" -- \
  "$prog" train --synthetic --train-limit 64 --epochs 1 --save-params "$tmp/nodir/p.bin"
# shellcheck disable=SC2086
out=$("$prog" train $tiny $shards --max-steps 1 --save-model "$tmp/nodir/m.bin" 2>&1)
printf '%s' "$out" | grep -q "step " && bad "--save-model into a missing folder: trained first" || ok

# A folder that access(2) lets root write to but that takes no file (procfs here; NFS with root
# squashed alike): the run trained to the end and then failed to write the model. The file the
# writer creates (PATH.tmp.PID) is now created and removed before the first step.
if [ -d /proc/self ]; then
  # shellcheck disable=SC2086
  out=$("$prog" train $tiny $shards --max-steps 1 --save-model /proc/m.bin 2>&1)
  st=$?
  if [ $st -eq 1 ] && printf '%s' "$out" | grep -q "cannot create '/proc/m.bin.tmp" &&
     ! printf '%s' "$out" | grep -q "step "; then ok; else
    bad "--save-model /proc/m.bin: status $st: $(printf '%s' "$out" | tail -n 2)"
  fi
fi
# --save-model onto an existing file that is not a model file (a slip of the path: the training
# shard, a checkpoint, a text) replaced it at the end of the run, the data lost; now refused
# before the first step, the file kept. A model file (and an empty file) is still replaced.
cp "$tmp/sh/train_000000.bin" "$tmp/keep.bin"
for case in "keep.bin|it is a token shard" "text.txt|it does not start with the magic 20240326" \
            "ck/ckpt-step00000003.mpt|it is an mpitrain checkpoint"; do
  cp "$tmp/${case%%|*}" "$tmp/orig"
  # shellcheck disable=SC2086
  expect 1 "--save-model '$tmp/${case%%|*}' exists and is not an llm.c model file (${case#*|})" \
    "train --save-model onto ${case%%|*}" -- "$prog" train $tiny $shards --max-steps 1 \
    --save-model "$tmp/${case%%|*}"
  cmp -s "$tmp/orig" "$tmp/${case%%|*}" && ok || bad "--save-model replaced ${case%%|*}"
done
cp "$tmp/ok.bin" "$tmp/prev.bin"
# shellcheck disable=SC2086
expect 0 "model written to $tmp/prev.bin" "train --save-model onto a model file" -- \
  "$prog" train $tiny $shards --max-steps 1 --save-model "$tmp/prev.bin"

# ---- train: memory --------------------------------------------------------------------------
# Sizes past the host's memory: refused before any allocation with the bound and the host's
# memory named, rather than failing at some allocation, or, where every allocation fits alone,
# being killed by the kernel once they are touched. The limit is fixed with ulimit -v (2 GiB) so
# the case is the same on any machine: 16 layers of C 1024 are N = 201,869,312 parameters;
# parameters, gradients and AdamW's state 16 N bytes, the forward's B T = 512 tokens at least
# 4 x 512 x (14 x 16 x 1024 + 256) bytes, the fused attention's statistics and scratch a few
# MiB: 3.4 GiB. With the reference attention (MPT_ATTENTION=reference), a long sequence of a
# small model is refused for its attention matrices ([B, H, T, T] per layer: 4 x 2 x 8 x 8192^2
# bytes = 4 GiB of 4.1). The fused attention (the default on the CPU) keeps 8 bytes a row and
# one 8 T^2-byte scratch per thread: a run whose matrices would take 2 GiB (2 layers, 16 heads,
# T 4096) trains under the same 2 GiB limit (it was refused by a bound that counted the
# matrices whichever attention ran), and is refused with the reference. The tiny GPT still trains
# under a limit (3 GiB: the libraries mapped, CUDA's and NCCL's included, and OpenBLAS's 128 MiB
# per thread take about 1.5 GiB of address space before the model).
# shellcheck disable=SC2086
expect 1 "(201869312 parameters, B 8 x T 64) needs at least 3.4 GiB per rank .* this host has 2.0 GiB for 1 rank" \
  "train: a GPT larger than the memory" -- sh -c "ulimit -v 2097152 && exec \"\$0\" \"\$@\"" \
  "$prog" train --model gpt --n-layer 16 --n-head 4 --n-embd 1024 --seq-len 64 \
  --vocab-size 256 $shards --max-steps 1
# shellcheck disable=SC2086
expect 1 "(640768 parameters, B 1 x T 8192) needs at least 4.1 GiB per rank" \
  "train: attention matrices larger than the memory" -- env MPT_ATTENTION=reference \
  sh -c "ulimit -v 2097152 && exec \"\$0\" \"\$@\"" "$prog" train --model gpt --n-layer 2 \
  --n-head 8 --n-embd 64 --seq-len 8192 --vocab-size 256 $shards --batch-size 1 --max-steps 1
# The sampler holds every window's index (8 bytes each, on every rank) and was allocated before
# the bound was checked, which did not count it: a shard of 2^31 - 1 tokens (a sparse file,
# 4 GiB long, nothing on disk) in windows of B 1 x T 1 + 1 asks for 16 GiB. Refused by the
# bound, naming the windows and what makes them fewer.
python3 -c 'import struct, sys
f = open(sys.argv[1], "wb")
f.write(struct.pack("<256i", 20240520, 1, 2147483647, *([0] * 253)))
f.truncate(1024 + 2 * 2147483647)' "$tmp/huge.bin"
expect 1 "needs at least 16.0 GiB per rank (.* 8 bytes for each of the shards' 2147483646 windows); this host has 2.0 GiB for 1 rank: give fewer shards, or a larger --batch-size or --seq-len" \
  "train: windows past the memory" -- sh -c "ulimit -v 2097152 && exec \"\$0\" \"\$@\"" \
  "$prog" train --model gpt --n-layer 1 --n-head 1 --n-embd 4 --seq-len 1 --batch-size 1 \
  --vocab-size 256 --shards "$tmp/huge.bin" --max-steps 1
rm -f "$tmp/huge.bin"
long="--model gpt --n-layer 2 --n-head 16 --n-embd 64 --seq-len 4096 --vocab-size 256"
# shellcheck disable=SC2086
expect 1 "(378624 parameters, B 1 x T 4096) needs at least 2.0 GiB per rank" \
  "train: T 4096, reference attention's matrices past the memory" -- \
  env MPT_ATTENTION=reference sh -c "ulimit -v 2097152 && exec \"\$0\" \"\$@\"" "$prog" \
  train $long $shards --batch-size 1 --max-steps 1 --threads 1
# shellcheck disable=SC2086
expect 0 "step      1/1" "train: T 4096 with the fused attention, under the same limit" -- \
  sh -c "ulimit -v 2097152 && exec \"\$0\" \"\$@\"" "$prog" \
  train $long $shards --batch-size 1 --max-steps 1 --threads 1
# shellcheck disable=SC2086
expect 0 "step      1/1" "train: the tiny GPT under ulimit -v 3 GiB" -- \
  sh -c "ulimit -v 3145728 && exec \"\$0\" \"\$@\"" "$prog" train $tiny $shards --max-steps 1 \
  --threads 1

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
