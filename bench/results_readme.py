#!/usr/bin/env python3
"""bench/results_readme.py: bench/results/README.md made from the set itself.

Reads machine.txt and manifest.tsv (written by bench/run_all.sh) and the set's JSON and text
files; prints the README on stdout: the machine, the headline table (every figure computed
here from a file of the set, its file named beside it), the plots and one line per file with
its start time, duration, load average before it, commit and command. A figure whose file is
missing or unreadable reads "not in this set". Standard library only.

  bench/results_readme.py --dir bench/results > bench/results/README.md
"""
import argparse
import json
import os
import re
import statistics
import sys

MISSING = "not in this set"
# What a damaged file (a key missing, a value of the wrong type, a zero) raises while one of
# its figures is read: that figure, or that record, is left out.
BAD = (KeyError, TypeError, ValueError, AttributeError, IndexError, ZeroDivisionError)


def load_json(d, name):
    """The file's object, or None when it is missing, unreadable or not a JSON object."""
    try:
        with open(os.path.join(d, name)) as f:
            j = json.load(f)
    except (OSError, ValueError, RecursionError):
        return None
    return j if isinstance(j, dict) else None


def records(j, key):
    """The objects of the list j[key] (an empty list when j or the list is not there)."""
    v = (j or {}).get(key)
    return [r for r in v if isinstance(r, dict)] if isinstance(v, list) else []


def read_text(d, name):
    try:
        with open(os.path.join(d, name), errors="replace") as f:
            return f.read()
    except OSError:
        return None


def fmt(x, nd=2):
    return MISSING if x is None else f"{x:.{nd}f}"


def compare_torch(d, stem, model):
    """(mpitrain samples/s, {flavor: (torch samples/s, pair ratio median, version)})."""
    ours, sides = [], {}
    for flavor in ("debian", "pypi"):
        j = load_json(d, f"{stem}_{flavor}.json")
        if not j:
            continue
        for r in records(j, "results"):
            if r.get("model") != model:
                continue
            try:
                o = float(r["mpitrain_samples_per_sec"])
                t = float(r["torch_samples_per_sec"])
                ratio = float(r["pair_ratio_median"] if "pair_ratio_median" in r else r["ratio"])
                v = j.get("versions", {}).get("torch", "?")
            except BAD:
                continue
            ours.append(o)
            sides[flavor] = (t, ratio, str(v))
    return (statistics.median(ours) if ours else None), sides


def torch_row(d, stem, model, label, goal):
    ours, sides = compare_torch(d, stem, model)
    if ours is None:
        return f"| {label} | {stem}_* | {MISSING} | | {goal} |"
    parts = []
    for flavor in ("debian", "pypi"):
        if flavor in sides:
            t, r, v = sides[flavor]
            parts.append(f"**{r:.2f}x** vs {v.split('+')[0]} ({t:.0f})")
    return (f"| {label} | {stem}_{{debian,pypi}}.json | {ours:.0f} samples/s | "
            f"{'; '.join(parts)} | {goal} |")


def gpt_rows(d, name, model, goal, precision="fp32", note=""):
    j = load_json(d, name)
    rows = []
    for r in records(j, "results"):
        if (r.get("model") != model or r.get("precision", "fp32") != precision
                or r.get("skipped")):
            continue
        try:
            rows.append(gpt_row(r, name, model, goal, precision, note))
        except BAD:
            continue
    return rows or [f"| {model} tokens/s | {name} | {MISSING} | | {goal} |"]


def gpt_row(r, name, model, goal, precision, note):
    """One result of compare_gpt.sh's JSON as a row; raises one of BAD on a damaged record."""
    imp = r["impls"]
    m = imp.get("mpitrain", {})
    if not m.get("tokens_per_sec"):
        raise ValueError("no tokens/s")
    parts = []
    for side in ("torch_debian", "torch_pypi"):
        t = imp.get(side)
        if t and t.get("tokens_per_sec"):
            v = t.get("torch_version", "?").split("+")[0]
            parts.append(f"**{t.get('pair_ratio_median', t['ratio']):.2f}x** vs {v} "
                         f"({t['tokens_per_sec']:.0f})")
    how = (f"{r['np']} process x {r['threads']} threads" if r["np"] == 1
           else f"{r['np']} ranks x {r['threads']} thread(s)")
    pf = m.get("peak_fraction")
    of = "the SGEMM peak" if precision == "fp32" else "the fp32 SGEMM peak"
    peak = f", {100 * pf:.0f} % of {of}" if pf else ""
    prec = ("" if precision == "fp32" else f", {precision}") + note
    return (f"| {model}{prec}, B {r['batch_size']} x T {r['seq_len']}, {how}, tokens/s | {name} | "
            f"{m['tokens_per_sec']:.0f}{peak} | {'; '.join(parts)} | {goal} |")


def allreduce_ratio(d, name):
    j = load_json(d, name)
    if not j:
        return None
    rs = []
    for row in records(j, "rows"):
        try:
            if row["bytes"] >= 1 << 20:
                rs += [float(row["ratio_out_of_place"]), float(row["ratio_in_place"])]
        except BAD:
            continue
    return statistics.mean(rs) if rs else None


def num(s):
    """s as a float; None where it is not a number ("1.2.3", "+-", "e")."""
    try:
        return float(s)
    except ValueError:
        return None


def grep(text, pattern):
    m = re.search(pattern, text or "", re.M)
    return num(m.group(1)) if m else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", required=True)
    d = ap.parse_args().dir
    if not os.path.isdir(d):
        sys.exit(f"results_readme.py: --dir '{d}' is not a folder")
    machine = read_text(d, "machine.txt")
    if machine is None:
        sys.exit(f"results_readme.py: {d}/machine.txt is missing or unreadable "
                 "(bench/run_all.sh writes it)")
    mach = {}
    for line in machine.splitlines():
        k, _, v = line.partition(": ")
        mach.setdefault(k, []).append(v)
    manifest = []
    for line in (read_text(d, "manifest.tsv") or "").splitlines():
        f = line.split("\t", 5)  # a tab inside the command stays in the command
        if len(f) == 6 and f[0]:
            manifest.append(f)
    commits = sorted({m[4] for m in manifest})
    starts = sorted(m[1] for m in manifest)

    out = []
    w = out.append
    w("# Benchmark results")
    w("")
    w("The current set: every file here comes from one run of `bench/run_all.sh` on the machine "
      "below (the commit and the command of each file are in the table at the end; "
      "`bench/run_all.sh --help` lists its options). How each tool measures, and how noise is "
      "handled (waiting for idle CPUs, alternating runs, medians, ratios of back-to-back pairs), "
      "is in [bench/README.md](../README.md). This README is made from the files by "
      "`bench/results_readme.py`. No GPU figures: the CUDA backend has not run on a GPU.")
    w("")
    w("## Machine")
    w("")
    w("| | |")
    w("|---|---|")
    for k in ("cpu", "isa", "memory", "system", "compiler"):
        if k in mach:
            w(f"| {k} | {mach[k][0]} |")
    libs = [v for v in mach.get("mpitrain --version", [])
            if v.split(":")[0] in ("MPI", "OpenBLAS", "oneDNN", "zlib", "CPU ISA", "oneDNN ISA",
                                   "bf16 compute (CPU)", "features")]
    for v in libs:
        k, _, rest = v.partition(": ")
        w(f"| {k} | {rest} |")
    for k in ("pytorch (Debian)", "pytorch (PyPI)", "gnuplot", "mpirun arguments"):
        if k in mach:
            w(f"| {k} | {mach[k][0]} |")
    w(f"| commit | {', '.join(commits) if commits else mach.get('commit', ['?'])[0]} |")
    if starts:
        w(f"| measured (UTC) | {starts[0]} to {starts[-1]} |")
    w("")
    w("## Headline")
    w("")
    w("Ratios are medians of back-to-back pairs (mpitrain / PyTorch, same model, batch per rank, "
      "ranks and threads); the figure in brackets is PyTorch's median.")
    w("")
    w("| what | file | mpitrain | against | goal |")
    w("|---|---|---|---|---|")
    w(torch_row(d, "compare_torch_mlp", "mlp", "mlp 784-512-512-10, DDP 2 ranks, batch 64", ">= 2x"))
    w(torch_row(d, "compare_torch_cnn", "cnn", "cnn (2 conv 5x5 + 2 fc), DDP 2 ranks, batch 64",
                ">= 1.5x"))
    w(torch_row(d, "compare_torch_avx2", "mlp", "mlp, the same, AVX2 forced on both sides", ">= 2x"))
    w(torch_row(d, "compare_torch_avx2", "cnn", "cnn, the same, AVX2 forced on both sides",
                ">= 1.5x"))
    for r in gpt_rows(d, "compare_gpt_mini.json", "gpt-mini", ">= 1.25x the faster"):
        w(r)
    for r in gpt_rows(d, "compare_gpt_mini_avx2.json", "gpt-mini", ">= 1.25x the faster",
                      note=", AVX2 forced on both sides"):
        w(r)
    for r in gpt_rows(d, "compare_llama_mini.json", "llama-mini", ""):
        w(r)
    for r in gpt_rows(d, "compare_gpt_gpt2.json", "gpt2", ""):
        w(r)
    if load_json(d, "compare_gpt_mini_bf16.json"):
        for r in gpt_rows(d, "compare_gpt_mini_bf16.json", "gpt-mini", "", "bf16"):
            w(r)
    w(f"| all-reduce bus bandwidth, sizes >= 1 MiB, 2 ranks | allreduce_np2.json | "
      f"{fmt(allreduce_ratio(d, 'allreduce_np2.json'))} of raw `MPI_Allreduce` | raw MPI | |")
    w(f"| reduce-scatter + all-gather (rs-ag, ZeRO's collectives), average, >= 1 MiB, 2 ranks | "
      f"allreduce_np2_rsag.json | {fmt(allreduce_ratio(d, 'allreduce_np2_rsag.json'))} of raw "
      f"`MPI_Allreduce` | raw MPI | |")
    zs = read_text(d, "zero_step_time.txt")
    z0 = grep(zs, r"^median zero 0\s+([0-9.]+)")
    z3 = grep(zs, r"^median zero 3\s+([0-9.]+)")
    z3n = grep(zs, r"^median zero 3 --no-prefetch\s+([0-9.]+)")
    if z0 and z3:
        zrow = (f"ZeRO-3 {z3 / z0:.2f}x DDP's step ({z3:.0f} / {z0:.0f} ms)"
                + (f"; without prefetch {z3n / z0:.2f}x" if z3n else ""))
    else:
        zrow = MISSING
    w(f"| gpt2-shaped (124M), T 128, 2 ranks: step time | zero_step_time.txt | {zrow} | DDP | <= 1.3x |")
    zm = read_text(d, "zero_memory.txt") or ""
    states, peaks = [], []
    for z in range(4):
        m = re.search(rf"^zero {z}\s+start.*?\| peak MiB r0 ([0-9.]+) \(state ([0-9.]+)\+([0-9.]+)\+([0-9.]+)\)",
                      zm, re.M)
        v = [num(m.group(i)) for i in (1, 2, 3, 4)] if m else [None]
        if None not in v:
            states.append(f"{sum(v[1:]):.0f}")
            peaks.append(f"{v[0]:.0f}")
    w(f"| ZeRO 0 / 1 / 2 / 3, gpt2-shaped, 2 ranks: model state per rank, peak resident (MiB) | "
      f"zero_memory.txt | {' / '.join(states) or MISSING}; peak {' / '.join(peaks) or '-'} | | |")
    gl = read_text(d, "zero_gpt2_large.txt") or ""
    m = re.search(r"^gpt2-large.*\| loss ([0-9. ]+)$", gl, re.M)
    w(f"| gpt2-large (774M) at 2 ranks, `--zero 3 --recompute`: loss per step | zero_gpt2_large.txt | "
      f"{' -> '.join(m.group(1).split()) if m else MISSING} | | |")
    hf = read_text(d, "hf_interop.txt") or ""
    diffs = [x for x in map(num, re.findall(r"max \|logit difference\| ([0-9.e+-]+)", hf))
             if x is not None]
    eq = re.findall(r"arg max equal at (\d+) of (\d+)", hf)
    alleq = eq and all(a == b for a, b in eq)
    w(f"| Hugging Face interop (transformers), {len(diffs)} loads both ways: max abs logit difference | "
      f"hf_interop.txt | {f'{max(diffs):.2e}' if diffs else MISSING}"
      f"{', arg max equal everywhere' if alleq else ''} | transformers | |")
    for m_ in ("mlp", "cnn"):
        t = read_text(d, f"comm_yield_{m_}.txt")
        r = grep(t, r"yield/spin ([0-9.]+)")
        w(f"| the comm thread yielding against spinning, {m_}, 2 ranks | comm_yield_{m_}.txt | "
          f"{fmt(r)}x samples/s | spinning | |")
    # Element rate of the bfloat16 all-reduce against float32's at the largest common size.
    jf, jb = load_json(d, "allreduce_np2_float.json"), load_json(d, "allreduce_np2_bfloat16.json")
    fb = {r.get("bytes"): r for r in records(jf, "rows")}
    common = [r for r in records(jb, "rows") if r.get("bytes") in fb]
    try:
        r = common[-1]
        f = fb[r["bytes"]]
        el = 2 * r["out_of_place"]["busbw_gbps"] / f["out_of_place"]["busbw_gbps"]
        w(f"| bfloat16 all-reduce (rounded once) at {r['bytes'] >> 20} MiB: elements/s against "
          f"float32's; against raw MPI's bfloat16 `MPI_Op` | allreduce_np2_{{float,bfloat16}}.json | "
          f"{el:.2f}x; {r['ratio_out_of_place']:.2f} / {r['ratio_in_place']:.2f} (out-of-place / "
          f"in-place) | float32; raw MPI | |")
    except BAD:  # either file missing or damaged, or no size in common: no row
        pass
    gm = read_text(d, "gemm_gpt_mini.txt")
    gt = read_text(d, "gemm_gpt_mini_torch.txt")
    ours = grep(gm, r"^# step \(fwdb.*Linear.* mpt [0-9.]+ ms ([0-9.]+) GFLOP/s")
    theirs = grep(gt, r"^# step \(fwd.*Linear.* torch [0-9.]+ ms ([0-9.]+) GFLOP/s")
    w(f"| gpt-mini's Linear GEMMs (M 2048), one thread: GFLOP/s | gemm_gpt_mini.txt, "
      f"gemm_gpt_mini_torch.txt | {fmt(ours, 1)} (mpt_op_gemm) | PyTorch 2.x (MKL): {fmt(theirs, 1)} | |")
    ga = read_text(d, "gemm_gpt_mini_avx2.txt")
    if ga:
        x = grep(ga, r"^# step \(fwdb.*Linear.* mpt [0-9.]+ ms [0-9.]+ GFLOP/s \(x([0-9.]+)\)")
        v = grep(ga, r"^# step \(fwdb.*Linear.* mpt [0-9.]+ ms ([0-9.]+) GFLOP/s")
        w(f"| gpt-mini's Linear GEMMs, one thread, AVX2 forced: mpt_op_gemm against OpenBLAS | "
          f"gemm_gpt_mini_avx2.txt | {fmt(v, 1)} GFLOP/s, {fmt(x)}x | OpenBLAS | |")
    for name, isa in (("gemm_mlp.txt", "the CPU's ISA"), ("gemm_mlp_avx2.txt", "AVX2 forced")):
        t = read_text(d, name)
        x = grep(t, r"^# step \(fwdb.* mpt [0-9.]+ ms [0-9.]+ GFLOP/s \(x([0-9.]+)\)")
        w(f"| the mlp's GEMMs (M 64), one thread, {isa}: mpt_op_gemm against OpenBLAS | {name} | "
          f"{fmt(x)}x | OpenBLAS | |")
    tune = read_text(d, "gemm_tune.txt") or ""
    tr = re.findall(r"^(\w+) isa (\w+): median auto [0-9.]+, tune [0-9.]+ samples/s: tune/auto ([0-9.]+)",
                    tune, re.M)
    w(f"| `--gemm tune` against `--gemm auto`, samples/s, 2 ranks | gemm_tune.txt | "
      f"{'; '.join(f'{m} {i} {x}x' for m, i, x in tr) or MISSING} | `--gemm auto` | |")
    at = read_text(d, "attn_fused.txt") or ""
    ar = re.findall(r"^\s+[0-9.]+\s+[0-9.]+\s+([0-9.]+)\s+[0-9.]+\s+[0-9.]+\s+([0-9.]+)\s+(\w+)\s+(\w+)", at, re.M)
    w(f"| the fused causal attention (gpt-mini's layer), 1 / 2 threads: reference time / fused | "
      f"attn_fused.txt | {' / '.join(f'{a}x' for a, _, _, _ in ar) or MISSING} (wall)"
      f"{', the same bits' if ar and all(y == 'same' and q == 'same' for _, _, y, q in ar) else ''} | "
      f"the unfused layer | |")
    fr = read_text(d, "flight_recorder_cost.txt")
    fr_step = fmt(grep(fr, r"^median on/off \(gpt-mini step\): ([0-9.]+)"), 3)
    fr_ar = fmt(grep(fr, r"^median on-off \(8-byte all-reduce\): ([0-9.+-]+)"), 3)
    w(f"| the flight recorder on / off: gpt-mini step ratio; 8-byte all-reduce | "
      f"flight_recorder_cost.txt | {fr_step}; {fr_ar} us | off | |")
    w("")
    if any(re.search(r"\b1[0-9][0-9] % of the SGEMM peak", line) for line in out):
        w("The SGEMM peak is the trainer's own probe (src/train/report.c, measure_sgemm_peak: "
          "one square product on the library the GEMM rule picks for it); where a row reads above 100 % that probe under-read the "
          "rate the model's own products reached in the step (their rate is in the file's "
          "--profile tables; bench/README.md, compare_gpt.sh).")
        w("")
    pngs = sorted(f for f in os.listdir(d) if f.endswith(".png"))
    if pngs:
        w("## Plots")
        w("")
        for p in pngs:
            w(f"![{p[:-4]}]({p})")
            w("")
    w("## Files")
    w("")
    w("Commands as run from the source folder (`./mpitrain`, `./mpt_*`: the build folder; "
      "RESULTS: this folder; RUNS: run_all.sh's folder of logs). s: the seconds the command took. "
      "Load: the 1-minute load average when the command started; it still counts the previous "
      "command's own processes (2 ranks keep it near 2), so read it against that.")
    w("")
    w("| file | start (UTC) | s | load | commit | command |")
    w("|---|---|---|---|---|---|")
    for f, start, secs, load, commit, cmd in manifest:
        cmd = cmd.replace("|", "\\|").replace("\t", " ")
        code = f"`` {cmd} ``" if "`" in cmd else f"`{cmd}`"  # a backtick inside stays inside
        w(f"| [{f}]({f}) | {start} | {secs} | {load} | {commit} | {code} |"
          if not cmd.startswith("(") else f"| [{f}]({f}) | {start} | | | {commit} | {cmd} |")
    print("\n".join(out))


if __name__ == "__main__":
    main()
