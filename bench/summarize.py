#!/usr/bin/python3
"""Summaries of the training benchmarks (python3 standard library only).

    summarize.py train   --manifest M [--cpus N] [--build DIR] [--json FILE]
    summarize.py compare --manifest M [--build DIR] [--json FILE]

A manifest is one JSON object per line, written by bench/train_bench.sh or bench/compare_torch.sh:
one line per run with its configuration, exit status and the path of its metrics JSON. Runs of
the same configuration are reduced to their median (each figure separately). `train` adds the
scaling efficiency samples/s(W) / (W * samples/s(1)) against the one-process run of the same
model, batch, threads and steps; `compare` prints the ratio mpitrain / PyTorch of samples/s, both
as the ratio of the medians and as the median of the ratios of runs made back to back.
"""
import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time

FIELDS = ["forward_ms", "backward_ms", "exposed_comm_ms", "optimizer_ms", "total_ms",
          "allreduce_ms", "hidden_fraction"]


def read_manifest(path):
    runs = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                runs.append(json.loads(line))
    return runs


def load_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def run_text(cmd):
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        return (out.stdout or out.stderr).strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def machine_info(build=None):
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    info = {"hostname": platform.node(), "cpus": os.cpu_count(), "cpu_model": cpu,
            "kernel": platform.release(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    try:
        with open("/etc/debian_version") as f:
            info["debian"] = f.read().strip()
    except OSError:
        pass
    try:
        info["load_average"] = os.getloadavg()
    except OSError:
        pass
    versions = {"open_mpi": run_text(["mpirun", "--version"]).splitlines()[0:1]}
    versions["open_mpi"] = versions["open_mpi"][0] if versions["open_mpi"] else ""
    if build:
        versions["mpitrain"] = run_text([os.path.join(build, "mpitrain"), "--version"]).split("\n")[0]
    return info, versions


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def fmt(v, spec):
    return format(v, spec) if isinstance(v, (int, float)) else "-"


# ---- train ------------------------------------------------------------------------------------

def train_key(r):
    return (r["model"], r["mode"], r["np"], r["devices"], r["batch_size"], r["bucket_cap_mb"],
            r["overlap"], r["threads"], r["steps"], r["data"], r.get("extra", ""))


def buckets_of(log):
    """The number of DDP buckets the trainer logged ("DDP: N bucket(s)")."""
    try:
        with open(log) as f:
            m = re.search(r"DDP: (\d+) bucket", f.read())
        return int(m.group(1)) if m else None
    except (OSError, TypeError):
        return None


def world_of(r):
    if r["mode"] == "dp":
        m = re.match(r"cpu:(\d+)$", r["devices"])
        return int(m.group(1)) if m else 1
    return int(r["np"])


def summarize_train(args):
    runs = read_manifest(args.manifest)
    groups = {}
    for r in runs:
        groups.setdefault(train_key(r), []).append(r)
    results = []
    for key, rs in groups.items():
        first = rs[0]
        ok = []
        for r in rs:
            m = load_json(r["metrics"]) if r["rc"] == 0 else None
            if m and m.get("epochs"):
                ok.append(m)
        res = {"model": first["model"], "mode": first["mode"], "world": world_of(first),
               "devices": first["devices"], "batch_size": first["batch_size"],
               "bucket_cap_mb": None if first["bucket_cap_mb"] == "-" else float(first["bucket_cap_mb"]),
               "overlap": None if first["overlap"] == "-" else first["overlap"] == "on",
               "threads": first["threads"], "steps": first["steps"], "data": first["data"],
               "extra": first.get("extra", ""), "buckets": buckets_of(first.get("log")),
               "runs": len(rs), "runs_ok": len(ok), "command": first["command"],
               "oversubscribed": world_of(first) * first["threads"] > (args.cpus or 1 << 30)}
        if first["mode"] == "dp" and not ok:
            res["skipped"] = "the trainer rejected --mode dp (not available in this build)"
        sps = [m["epochs"][-1]["samples_per_sec"] for m in ok]
        res["samples_per_sec"] = median(sps)
        res["samples_per_sec_runs"] = sps
        res["breakdown"] = {f: median([m.get("breakdown", {}).get(f) for m in ok]) for f in FIELDS}
        results.append(res)

    def base_of(res):
        for b in results:
            if (b["mode"] == "single" and b["model"] == res["model"] and
                    b["batch_size"] == res["batch_size"] and b["threads"] == res["threads"] and
                    b["steps"] == res["steps"] and b["data"] == res["data"] and
                    b["extra"] == res["extra"]):
                return b
        return None

    for res in results:
        b = base_of(res)
        if b and b["samples_per_sec"] and res["samples_per_sec"]:
            res["scaling_efficiency"] = res["samples_per_sec"] / (res["world"] * b["samples_per_sec"])
            res["speedup"] = res["samples_per_sec"] / b["samples_per_sec"]
        else:
            res["scaling_efficiency"] = None
            res["speedup"] = None
    results.sort(key=lambda r: (r["model"], r["mode"] != "single", r["world"],
                                r["bucket_cap_mb"] or 0, not r["overlap"]))

    print("%-5s %-6s %5s %8s %3s %7s %10s %8s %8s %8s %8s %8s %8s %7s %6s" %
          ("model", "mode", "world", "cap(MiB)", "bkt", "overlap", "samples/s", "fwd(ms)", "bwd(ms)",
           "expo(ms)", "opt(ms)", "step(ms)", "ar(ms)", "hidden", "eff"))
    for r in results:
        b = r["breakdown"]
        print("%-5s %-6s %5d %8s %3s %7s %10s %8s %8s %8s %8s %8s %8s %7s %6s%s" % (
            r["model"], r["mode"], r["world"], fmt(r["bucket_cap_mb"], "g"), fmt(r["buckets"], "d"),
            "-" if r["overlap"] is None else ("on" if r["overlap"] else "off"),
            fmt(r["samples_per_sec"], ".0f"), fmt(b["forward_ms"], ".3f"),
            "in fwd" if r["mode"] == "dp" else fmt(b["backward_ms"], ".3f"),
            fmt(b["exposed_comm_ms"], ".3f"),
            fmt(b["optimizer_ms"], ".3f"), fmt(b["total_ms"], ".3f"), fmt(b["allreduce_ms"], ".3f"),
            fmt(100 * b["hidden_fraction"], ".0f") + "%" if b["hidden_fraction"] is not None else "-",
            fmt(r["scaling_efficiency"], ".2f"),
            "  (oversubscribed)" if r["oversubscribed"] else
            ("  (" + r["skipped"] + ")" if r.get("skipped") else "")))
    if args.json:
        machine, versions = machine_info(args.build)
        with open(args.json, "w") as f:
            json.dump({"benchmark": "train", "machine": machine, "versions": versions,
                       "method": "mpitrain train --epochs 2 --max-steps N: epoch 1 warms up, "
                                 "samples/s is epoch 2's; breakdown = trainer's mean over all "
                                 "steps (slowest rank); median over repeats",
                       "results": results}, f, indent=1)
            f.write("\n")
    failed = [r for r in runs if r["rc"] != 0 and r["mode"] != "dp"]
    return 1 if failed else 0


# ---- compare ----------------------------------------------------------------------------------

def summarize_compare(args):
    runs = read_manifest(args.manifest)
    groups = {}
    for r in runs:
        key = (r["model"], r["np"], r["batch_size"], r["threads"], r["steps"], r["data"])
        g = groups.setdefault(key, {"mpitrain": {}, "torch": {}})
        sps = None
        if r["rc"] == 0:
            j = load_json(r["result"])
            if j:
                sps = j["epochs"][-1]["samples_per_sec"] if r["impl"] == "mpitrain" else j["samples_per_sec"]
                if r["impl"] == "torch":
                    g["torch_version"] = j.get("version")
        g[r["impl"]][r["repeat"]] = sps
    goals = {"mlp": 2.0, "cnn": 1.5}
    results = []
    print("%-5s %3s %6s %8s %14s %14s %8s %10s %6s" % ("model", "np", "batch", "threads",
                                                        "mpitrain (s/s)", "torch (s/s)",
                                                        "ratio", "pair-ratio", "goal"))
    for key, g in sorted(groups.items()):
        model, np_, batch, threads, steps, data = key
        m = [v for v in g["mpitrain"].values() if v]
        t = [v for v in g["torch"].values() if v]
        pairs = [g["mpitrain"][k] / g["torch"][k] for k in g["mpitrain"]
                 if g["mpitrain"].get(k) and g["torch"].get(k)]
        mm, tm = median(m), median(t)
        ratio = mm / tm if mm and tm else None
        res = {"model": model, "np": np_, "batch_size": batch, "threads": threads, "steps": steps,
               "data": data, "mpitrain_samples_per_sec": mm, "torch_samples_per_sec": tm,
               "mpitrain_runs": m, "torch_runs": t, "ratio": ratio,
               "pair_ratio_median": median(pairs), "pair_ratios": pairs,
               "goal": goals.get(model), "torch_version": g.get("torch_version")}
        res["meets_goal"] = (ratio is not None and res["goal"] is not None and ratio >= res["goal"])
        results.append(res)
        print("%-5s %3d %6d %8d %14s %14s %8s %10s %6s" % (
            model, np_, batch, threads, fmt(mm, ".0f"), fmt(tm, ".0f"), fmt(ratio, ".2f"),
            fmt(res["pair_ratio_median"], ".2f"),
            (">=%g %s" % (res["goal"], "ok" if res["meets_goal"] else "MISS")) if res["goal"] else ""))
    if args.json:
        machine, versions = machine_info(args.build)
        tv = [r["torch_version"] for r in results if r["torch_version"]]
        if tv:
            versions["torch"] = tv[0]
        with open(args.json, "w") as f:
            json.dump({"benchmark": "compare_torch", "machine": machine, "versions": versions,
                       "method": "alternating runs, median over repeats; mpitrain: epoch 2 of "
                                 "--epochs 2 --max-steps N (epoch 1 warms up); torch_ref.py: "
                                 "--warmup N --steps N; both 1 BLAS/intra-op thread per rank",
                       "results": results}, f, indent=1)
            f.write("\n")
    return 0 if all(r["ratio"] for r in results) else 1


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("what", choices=["train", "compare"])
    p.add_argument("--manifest", required=True)
    p.add_argument("--cpus", type=int, default=os.cpu_count())
    p.add_argument("--build")
    p.add_argument("--json")
    args = p.parse_args()
    return summarize_train(args) if args.what == "train" else summarize_compare(args)


if __name__ == "__main__":
    sys.exit(main())
