#!/bin/sh
# bench/compare_gpt.sh at a tiny size (no timing is judged): a GPT of gpt-mini's widths with
# T 16, B 1, one warm-up and two timed steps, 1 and 2 ranks, against Debian's PyTorch when it is
# installed (else --torch none). Checks: exit 0; the JSON has every configuration; both sides
# built the same model: mpitrain's parameter count (from its log) and PyTorch's are both
# Vp C + T C + L (12 C^2 + 13 C) + 2 C, and the FLOPs per token both 6 N + 6 L C T; the fraction
# of the peak is FLOPs/token x tokens/s / the measured peak; the 2-rank run has the DDP figures
# (buckets >= 1, hidden share in [0, 1]) and a peak resident memory for each rank, with
# --no-overlap nothing hidden; --precision bf16 is run or reported as skipped, never a failure;
# bad usage exits 2. llama-mini too, at B 1 and one timed step: the same model (9,638,784
# parameters) and FLOPs per token on both sides. Skipped (77) without mpirun. Prints "N passed,
# N failed".
set -u
case ${1:-} in
  -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d' | grep -v shellcheck | sed 's/^# \{0,1\}//'; exit 0 ;;
esac
here=$(cd "$(dirname "$0")" && pwd)
PY=python3
[ -x /usr/bin/python3 ] && PY=/usr/bin/python3
command -v mpirun >/dev/null 2>&1 || { echo "SKIP: no mpirun"; exit 77; }
MPT_BUILD=${MPT_BUILD:-$(pwd)}
export MPT_BUILD
[ -x "$MPT_BUILD/mpitrain" ] || { echo "SKIP: no mpitrain in $MPT_BUILD"; exit 77; }
torch=none
"$PY" -c 'import torch' 2>/dev/null && torch=debian
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mpt_test_cmpgpt.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
export MPT_BENCH_TIMEOUT=120

# 2600 bytes of text as the shard (byte vocabulary)
awk 'BEGIN { for (i = 0; i < 100; i++) print "the cat sat on the mat " i }' > "$tmp/text.txt"
"$MPT_BUILD/mpitrain" tokenize --bytes --val-fraction 0.1 -o "$tmp/shards" "$tmp/text.txt" \
  > /dev/null || { echo "FAIL: tokenize"; exit 1; }
tiny="--model gpt-mini --seq-len 16 --batch-size 1 --steps 2 --warmup 1 --repeats 1"
# shellcheck disable=SC2086 # word list on purpose
"$here/compare_gpt.sh" $tiny --np 1,2 --torch "$torch" --precision fp32,bf16 \
  --overlap both --shards "$tmp/shards/train_*.bin" --out "$tmp/runs" --json "$tmp/s.json" \
  > "$tmp/out.txt" 2>&1
rc=$?
if [ "$rc" -eq 0 ]; then ok; else bad "compare_gpt.sh exited $rc: $(tail -5 "$tmp/out.txt")"; fi

"$PY" - "$tmp/s.json" "$torch" > "$tmp/check.txt" 2>&1 <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
torch = sys.argv[2] != "none"
L, C, T, V = 6, 384, 16, 256
N = V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C
fpt = 6 * N + 6 * L * C * T
res = {(r["np"], r["precision"], r["overlap"]): r for r in d["results"]}
want = {(1, "fp32", True), (1, "bf16", True), (2, "fp32", True), (2, "bf16", True),
        (2, "fp32", False), (2, "bf16", False)}
assert set(res) == want, f"configurations {sorted(res)}"
for key, r in res.items():
    m = r["impls"]["mpitrain"]
    if key[1] == "bf16" and r["skipped"]:
        continue
    assert m["tokens_per_sec"] and m["tokens_per_sec"] > 0, (key, m)
    assert m["flops_per_token"] == fpt, (key, m["flops_per_token"], fpt)
    assert abs(m["peak_fraction"] - fpt * m["tokens_per_sec"] * 1e-9
               / r["sgemm_peak_gflops"]) < 1e-9 * max(1, m["peak_fraction"]), key
    assert m["peak_rss_mib"] and len(m["peak_rss_mib"]) == key[0], (key, m["peak_rss_mib"])
    if key[0] == 2:
        assert m["buckets"] >= 1 and 0 <= m["hidden_fraction"] <= 1, (key, m)
        if not key[2]:
            assert m["hidden_fraction"] == 0, (key, m["hidden_fraction"])
    t = r["impls"].get("torch_debian")
    if torch and key[2] and t and t["tokens_per_sec"]:  # gloo start-up may fail on a busy box
        assert t["flops_per_token"] == fpt, (key, t["flops_per_token"], fpt)
        assert t["peak_rss_mib"] and len(t["peak_rss_mib"]) == key[0], key
        assert abs(t["ratio"] - m["tokens_per_sec"] / t["tokens_per_sec"]) < 1e-9, key
    if not key[2]:
        assert "torch_debian" not in r["impls"], key
print("summary ok")
EOF
if [ $? -eq 0 ]; then ok; else bad "summary: $(cat "$tmp/check.txt")"; fi
grep -q "model gpt: 6 layers" "$tmp"/runs/mpitrain_gpt-mini_np1_fp32_*_r1.log &&
  grep -q "^gpt-mini  1   1    16" "$tmp/out.txt" && ok || bad "table or mpitrain log: $(head -5 "$tmp/out.txt")"
# each configuration's --profile table (here 2 steps: the second is profiled)
grep -q "^# mpitrain --profile, gpt-mini_np2_fp32_cap25_ovon, repeat 1:" "$tmp/out.txt" &&
  grep -Eq "^  linear_nd +19.0 " "$tmp/out.txt" && ok || bad "profile tables: $(tail -20 "$tmp/out.txt")"

# llama-mini (its T, 256; B 1, one warm-up and one timed step, one process): both sides built
# the same Llama, 9,638,784 parameters, and the FLOPs per token are 6 N + 6 L C T on both
"$here/compare_gpt.sh" --model llama-mini --batch-size 1 --steps 1 --warmup 1 --repeats 1 \
  --np 1 --torch "$torch" --shards "$tmp/shards/train_*.bin" --out "$tmp/lruns" \
  --json "$tmp/l.json" > "$tmp/lout.txt" 2>&1
rc=$?
"$PY" - "$tmp/l.json" "$torch" > "$tmp/lcheck.txt" 2>&1 <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
N, fpt = 9638784, 6 * 9638784 + 6 * 6 * 384 * 256
(r,) = d["results"]
m = r["impls"]["mpitrain"]
assert r["model"] == "llama-mini" and m["tokens_per_sec"] > 0, r
assert m["flops_per_token"] == fpt, (m["flops_per_token"], fpt)
t = r["impls"].get("torch_debian")
if sys.argv[2] != "none":  # the PyTorch side must have run, not only mpitrain's
    assert t and t["tokens_per_sec"] and t["tokens_per_sec"] > 0, ("torch side failed", t)
    assert t["flops_per_token"] == fpt, (t["flops_per_token"], fpt)
print("llama summary ok")
EOF
lrc=$?
if [ $rc -eq 0 ] && [ $lrc -eq 0 ] && grep -q "model llama-mini: 6 layers" "$tmp"/lruns/mpitrain_*.log; then
  ok
else
  bad "llama-mini (exit $rc): $(tail -3 "$tmp/lout.txt"); $(cat "$tmp/lcheck.txt")"
fi

for args in "--model gpt3" "--np 0" "--torch conda" "--precision fp16" "--overlap maybe" \
  "--bucket-cap-mb x" "--steps" "--model llama-mini --seq-len 16"; do
  # shellcheck disable=SC2086 # word list on purpose
  "$here/compare_gpt.sh" $args > "$tmp/usage.txt" 2>&1
  rc=$?
  if [ "$rc" -eq 2 ] && [ -s "$tmp/usage.txt" ]; then ok; else bad "'$args' exited $rc"; fi
done
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
