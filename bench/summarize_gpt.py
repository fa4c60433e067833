#!/usr/bin/python3
"""Summary of bench/compare_gpt.sh (python3 standard library only).

    summarize_gpt.py --manifest M [--build DIR] [--json FILE]

The manifest has one JSON object per run (mpitrain or torch_gpt_ref.py). From mpitrain's log:
each step's tokens/s line (--log-every 1), of which the steps after the warm-up give the timed
tokens/s (S * tokens per step / the sum of those steps' times); the parameter count; the SGEMM
peak the trainer measured at the end; the per-step forward / backward / optimizer times and the
DDP line (all-reduce per step, share hidden behind backward, exposed wait, buckets: means over
all steps, the warm-up included); the peak resident memory per rank (its memory report at the
end). From torch_gpt_ref.py: its
JSON. Runs of one configuration are reduced to medians; ratios mpitrain / torch are given as
the ratio of the medians and as the median of the ratios of runs made in the same round.
Fraction of peak = FLOPs per token (6 N + 6 L C T) x tokens/s / the median SGEMM peak of the
mpitrain runs with the same ranks and threads. Exit status 1 when no mpitrain run of some
configuration worked (skipped --precision bf16 runs do not count), else 0.
"""
import argparse
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from summarize import fmt, load_json, machine_info, median, read_manifest  # noqa: E402

GOAL_RATIO = 1.25  # the goal: ahead of the faster PyTorch by 1.25x, in fp32
GOAL_PEAK = 0.80   # and 80 % of the SGEMM peak on gpt-mini at 2 ranks and gpt2 in one process

STEP = re.compile(r"step +(\d+)/(\d+) +loss ([0-9.naif]+) .* ([0-9.]+) tokens/s")
PARAMS = re.compile(r"model (?:gpt|llama)[^:]*: (\d+) parameters;")
PEAK = re.compile(r"SGEMM peak measured now on these ranks: ([0-9.]+) GFLOP/s")
DONE = re.compile(r"per step on rank 0: forward ([0-9.]+) ms, backward \(all-reduce included\) "
                  r"([0-9.]+) ms, clip \+ optimizer ([0-9.]+) ms")
DDP = re.compile(r"all-reduce ([0-9.]+) ms per step in (\d+) bucket\(s\), ([0-9.]+) % of it "
                 r"hidden behind backward; exposed \(waited after backward\) ([0-9.]+) ms")
RSS = re.compile(r"peak resident memory per rank \(MiB, rank 0 first\): ([0-9. ]+)")
# the trainer's memory report at the end, one line per rank (src/cli/train_zero.c)
RSS_RANK = re.compile(r"memory at the end, rank (\d+): .*peak resident ([0-9.]+) MiB")


def parse_mpitrain(run):
    try:
        with open(run["log"]) as f:
            text = f.read()
    except OSError:
        return None
    steps = [(int(a), float(d), float(c)) for a, _, c, d in STEP.findall(text)]
    timed = [(k, rate) for k, rate, _ in steps if k > run["warmup"]]
    if not timed or len(timed) != run["steps"] or any(r <= 0 for _, r in timed):
        return None
    per_step = run["batch_size"] * run["seq_len"] * run["np"]
    seconds = sum(per_step / r for _, r in timed)
    res = {"tokens_per_sec": len(timed) * per_step / seconds,
           "step_ms": [1e3 * per_step / r for _, r in timed],
           "losses": [c for _, _, c in steps]}
    m = PARAMS.search(text)
    res["params"] = int(m.group(1)) if m else None
    m = PEAK.search(text)
    res["sgemm_peak_gflops"] = float(m.group(1)) if m else None
    m = DONE.search(text)
    if m:
        res["forward_ms"], res["backward_ms"], res["optimizer_ms"] = map(float, m.groups())
    m = DDP.search(text)
    if m:
        res["allreduce_ms"], res["buckets"] = float(m.group(1)), int(m.group(2))
        res["hidden_fraction"] = float(m.group(3)) / 100
        res["exposed_comm_ms"] = float(m.group(4))
    ranks = {int(r): float(v) for r, v in RSS_RANK.findall(text)}
    m = RSS.search(text)  # the line of the first version of the report
    res["peak_rss_mib"] = ([ranks[r] for r in sorted(ranks)] if ranks else
                           [float(v) for v in m.group(1).split()] if m else None)
    return res


def config_key(r):
    return (r["model"], r["np"], r["batch_size"], r["seq_len"], r["threads"], r["precision"],
            float(r["bucket_cap_mb"]), r["overlap"], r["warmup"], r["steps"])


def summarize(args):
    runs = read_manifest(args.manifest)
    groups = {}
    peaks = {}  # (np, threads) -> SGEMM peaks measured by mpitrain runs
    for r in runs:
        g = groups.setdefault(config_key(r), {"runs": [], "skipped": False})
        impl = "mpitrain" if r["impl"] == "mpitrain" else "torch_" + r["flavor"]
        res = None
        if r["rc"] == 0:
            res = parse_mpitrain(r) if impl == "mpitrain" else load_json(r["result"])
        if r["rc"] == 77:
            g["skipped"] = True
        g["runs"].append((impl, r["repeat"], res, r))
        if impl == "mpitrain" and res and res.get("sgemm_peak_gflops"):
            peaks.setdefault((r["np"], r["threads"]), []).append(res["sgemm_peak_gflops"])
    results = []
    for key, g in groups.items():
        model, np_, b, t, thr, prec, cap, ov, warm, steps = key
        peak = median(peaks.get((np_, thr), []))
        res = {"model": model, "np": np_, "batch_size": b, "seq_len": t, "threads": thr,
               "precision": prec, "bucket_cap_mb": cap, "overlap": ov == "on",
               "warmup": warm, "steps": steps, "tokens_per_step": b * t * np_,
               "sgemm_peak_gflops": peak, "skipped": g["skipped"], "impls": {}}
        for impl in sorted({i for i, _, _, _ in g["runs"]}):
            ok = {rep: x for i, rep, x, _ in g["runs"] if i == impl and x}
            cmds = [r["command"] for i, _, _, r in g["runs"] if i == impl]
            tps = [x["tokens_per_sec"] for x in ok.values()]
            d = {"tokens_per_sec": median(tps), "tokens_per_sec_runs": tps,
                 "runs": sum(1 for i, _, _, _ in g["runs"] if i == impl), "runs_ok": len(ok),
                 "command": cmds[0] if cmds else None, "by_repeat": ok}
            fpt = None
            for x in ok.values():
                if impl == "mpitrain" and x.get("params"):
                    fpt = 6 * x["params"] + 6 * {"gpt-mini": 6 * 384, "gpt2": 12 * 768,
                                                  "llama-mini": 6 * 384}[model] * t
                elif x.get("flops_per_token"):
                    fpt = x["flops_per_token"]
            d["flops_per_token"] = fpt
            d["peak_fraction"] = (fpt * d["tokens_per_sec"] * 1e-9 / peak
                                  if fpt and d["tokens_per_sec"] and peak else None)
            rss = [x["peak_rss_mib"] for x in ok.values() if x.get("peak_rss_mib")]
            d["peak_rss_mib"] = [median(col) for col in zip(*rss)] if rss else None
            if impl == "mpitrain":
                for f in ("forward_ms", "backward_ms", "optimizer_ms", "allreduce_ms",
                          "hidden_fraction", "exposed_comm_ms", "buckets"):
                    d[f] = median([x.get(f) for x in ok.values()])
                d["step_ms"] = (1e3 * res["tokens_per_step"] / d["tokens_per_sec"]
                                if d["tokens_per_sec"] else None)
            else:
                versions = [x.get("version") for x in ok.values()]
                d["torch_version"] = versions[0] if versions else None
                d["attn"] = next((x.get("attn") for x in ok.values()), None)
            res["impls"][impl] = d
        mt = res["impls"].get("mpitrain", {})
        best = None
        for impl, d in res["impls"].items():
            if impl == "mpitrain":
                continue
            m_, t_ = mt.get("tokens_per_sec"), d["tokens_per_sec"]
            d["ratio"] = m_ / t_ if m_ and t_ else None
            pairs = [mt["by_repeat"][k]["tokens_per_sec"] / d["by_repeat"][k]["tokens_per_sec"]
                     for k in d["by_repeat"] if k in mt.get("by_repeat", {})]
            d["pair_ratios"] = pairs
            d["pair_ratio_median"] = median(pairs)
            if t_ and (best is None or t_ > res["impls"][best]["tokens_per_sec"]):
                best = impl
        res["faster_torch"] = best
        res["ratio_vs_faster_torch"] = res["impls"][best]["ratio"] if best else None
        if prec == "fp32":
            res["goal_ratio"] = GOAL_RATIO
            if (model, np_) in (("gpt-mini", 2), ("gpt2", 1)):
                res["goal_peak_fraction"] = GOAL_PEAK
        for d in res["impls"].values():
            d.pop("by_repeat", None)
        results.append(res)
    results.sort(key=lambda r: (r["model"], r["np"], r["precision"], r["bucket_cap_mb"],
                                not r["overlap"]))

    print("# tokens/s (median; % of the SGEMM peak); ratio = mpitrain / torch (median of "
          "back-to-back pairs in brackets)")
    print("%-8s %2s %3s %5s %3s %4s %14s %14s %14s %15s %15s" % (
        "model", "np", "B", "T", "thr", "prec", "mpitrain", "torch-debian", "torch-pypi",
        "ratio debian", "ratio pypi"))
    for r in results:
        if not r["overlap"]:
            continue
        cells = []
        for impl in ("mpitrain", "torch_debian", "torch_pypi"):
            d = r["impls"].get(impl)
            if impl == "mpitrain" and r["skipped"] and not (d and d["tokens_per_sec"]):
                cells.append("skipped")
            elif d and d["tokens_per_sec"]:
                cells.append("%.0f (%s%%)" % (d["tokens_per_sec"],
                                              fmt(100 * d["peak_fraction"], ".0f")
                                              if d["peak_fraction"] else "-"))
            else:
                cells.append("-" if not d else "FAILED")
        ratios = []
        for impl in ("torch_debian", "torch_pypi"):
            d = r["impls"].get(impl)
            ratios.append("%s (%s)" % (fmt(d.get("ratio"), ".2f"),
                                       fmt(d.get("pair_ratio_median"), ".2f")) if d else "-")
        print("%-8s %2d %3d %5d %3d %4s %14s %14s %14s %15s %15s" % (
            r["model"], r["np"], r["batch_size"], r["seq_len"], r["threads"], r["precision"],
            *cells, *ratios))
    ddp = [r for r in results if r["np"] > 1 and r["impls"].get("mpitrain")]
    if ddp:
        print("\n# mpitrain DDP: step = timed steps; fwd/bwd/opt, all-reduce, hidden and exposed"
              " = trainer means over all steps (rank 0); peak RSS per rank")
        print("%-8s %2s %4s %8s %7s %9s %8s %8s %8s %8s %8s %7s %8s %s" % (
            "model", "np", "prec", "cap(MiB)", "overlap", "tokens/s", "step(ms)", "fwd(ms)",
            "bwd(ms)", "opt(ms)", "ar(ms)", "hidden", "expo(ms)", "bkt  peak RSS (MiB)"))
        for r in ddp:
            d = r["impls"]["mpitrain"]
            print("%-8s %2d %4s %8g %7s %9s %8s %8s %8s %8s %8s %7s %8s %3s  %s" % (
                r["model"], r["np"], r["precision"], r["bucket_cap_mb"],
                "on" if r["overlap"] else "off", fmt(d["tokens_per_sec"], ".0f"),
                fmt(d["step_ms"], ".0f"), fmt(d["forward_ms"], ".0f"),
                fmt(d["backward_ms"], ".0f"), fmt(d["optimizer_ms"], ".0f"),
                fmt(d["allreduce_ms"], ".0f"),
                fmt(100 * d["hidden_fraction"], ".0f") + "%" if d["hidden_fraction"] is not None
                else "-", fmt(d["exposed_comm_ms"], ".0f"), fmt(d["buckets"], ".0f"),
                " ".join("%.0f" % v for v in d["peak_rss_mib"]) if d["peak_rss_mib"] else "-"))
    mem = [r for r in results if r["overlap"] and any(d.get("peak_rss_mib")
                                                      for d in r["impls"].values())]
    if mem:
        print("\n# peak resident memory per rank (MiB, median over runs, rank 0 first)")
        for r in mem:
            print("%-8s np %d %s cap %g: %s" % (
                r["model"], r["np"], r["precision"], r["bucket_cap_mb"], "; ".join(
                    "%s %s" % (i, " ".join("%.0f" % v for v in d["peak_rss_mib"]))
                    for i, d in sorted(r["impls"].items()) if d.get("peak_rss_mib"))))
    goals = [r for r in results if r.get("goal_ratio") and r["overlap"] and len(r["impls"]) > 1]
    if goals:
        print("\n# goals (fp32): >= %.2fx the faster PyTorch; >= %.0f%% of the SGEMM "
              "peak on gpt-mini at 2 ranks and gpt2 at 1" % (GOAL_RATIO, 100 * GOAL_PEAK))
        for r in goals:
            d = r["impls"].get("mpitrain", {})
            line = "%-8s np %d: vs faster torch (%s) %s %s" % (
                r["model"], r["np"], r["faster_torch"] or "-", fmt(r["ratio_vs_faster_torch"],
                                                                  ".2f"),
                "-" if r["ratio_vs_faster_torch"] is None else
                ("ok" if r["ratio_vs_faster_torch"] >= GOAL_RATIO else "MISS"))
            if r.get("goal_peak_fraction"):
                pf = d.get("peak_fraction")
                line += "; peak %s%% %s" % (fmt(100 * pf, ".0f") if pf else "-",
                                             "-" if pf is None else
                                             ("ok" if pf >= GOAL_PEAK else "MISS"))
            print(line)
    if args.json:
        machine, versions = machine_info(args.build)
        with open(args.json, "w") as f:
            json.dump({"benchmark": "compare_gpt", "machine": machine, "versions": versions,
                       "method": "rounds of back-to-back runs (order rotating), medians; "
                                 "mpitrain: --max-steps W+S --log-every 1, timed = the S steps "
                                 "after W; torch_gpt_ref.py --warmup W --steps S; FLOPs/token "
                                 "6N + 6LCT; peak = mpitrain's measured SGEMM peak (same ranks, "
                                 "threads)",
                       "results": results}, f, indent=1)
            f.write("\n")
    bad = [r for r in results if not r["skipped"] and
           not r["impls"].get("mpitrain", {}).get("tokens_per_sec")]
    return 1 if bad else 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--manifest", required=True)
    p.add_argument("--build")
    p.add_argument("--json")
    return summarize(p.parse_args())


if __name__ == "__main__":
    sys.exit(main())
