#!/usr/bin/python3
"""Scaling model of mpitrain's DDP step (python3 standard library only).

From a measured one-process run (its --trace: forward / backward / optimizer per step) and the
model's bucket plan, predict the DDP step time and the weak-scaling efficiency
step(1) / step(W) (batch per rank fixed) for W = 8 .. 1024 ranks on named interconnects, with
and without overlap; and check the model against what this machine measures at 2 ranks (a
2-rank --trace and an mpt_allreduce_bench --json from the same machine).

Model of one step on W ranks:
  - compute is what one process measured: forward F, backward B, optimizer O, other X (the rest
    of the step period: loader, zero_grad, loss bookkeeping), scaled by --compute-scale (e.g.
    0.01 for an accelerator 100x faster than this CPU);
  - buckets follow the DDP plan (ddp.c): parameters in reverse registration order, a bucket
    closes once it holds >= its cap (first 1 MiB, then --bucket-cap-mb), never after the last
    parameter; bucket i is ready when backward has done the work of the layers it covers, taken
    as the fraction of backward FLOPs (2 GEMMs per layer, one for the first layer) done by then;
  - all-reduce of S bytes: ring, 2 (W-1)/W * S / B + 2 (W-1) * alpha, where B and alpha are the
    slowest link of the ring (NVLink within a node of --gpus-per-node ranks; InfiniBand between
    nodes, whose rings run over the node's NICs in parallel: B = min(B_nvlink, nics * B_nic)).
    The hierarchical variant (reduce-scatter in the node, ring across nodes on 1/g of the data,
    all-gather in the node) is given too. "this-machine" interpolates the measured all-reduce
    times of the benchmark JSON (log-log in size) instead, valid for the ranks it was run with;
  - buckets run one at a time in index order on the comm stream: start_i = max(ready_i, end_{i-1})
    with overlap, all after backward without; exposed = max(0, end_last - B);
    step = F + B + exposed + O + X.

    scaling_model.py --trace1 t1.json --model mlp [--trace2 t2.json --allreduce ar.json] [--json out]
"""
import argparse
import bisect
import json
import math
import statistics
import sys

MIB = 1048576.0

# Named interconnects: per-link effective bandwidth (bytes/s) and per-step latency (s).
INTERCONNECTS = {
    "nvlink-ib400x8": {"gpus_per_node": 8, "nics_per_node": 8,
                       "nvlink_gbps": 370.0, "nvlink_alpha_us": 1.0,
                       "nic_gbps": 48.0, "nic_alpha_us": 4.0,
                       "about": "8 GPUs per node on NVLink 4 (H100 SXM: ~370 GB/s achievable "
                                "per GPU), eight 400 Gb/s InfiniBand NDR NICs per node (~48 GB/s "
                                "each), as in a DGX H100 cluster"},
    "nvlink-ib400x1": {"gpus_per_node": 8, "nics_per_node": 1,
                       "nvlink_gbps": 370.0, "nvlink_alpha_us": 1.0,
                       "nic_gbps": 48.0, "nic_alpha_us": 4.0,
                       "about": "8 GPUs per node on NVLink 4, one 400 Gb/s InfiniBand NIC per node"},
}


# ---- the model's parameters and the bucket plan --------------------------------------------

def model_layers(name, hidden, batch):
    """Layers in registration order: (name, [param counts in registration order], backward
    FLOPs of the layer with dX, backward FLOPs without dX)."""
    layers = []
    if name == "mlp":
        sizes = [784] + hidden + [10]
        for i in range(len(sizes) - 1):
            fin, fout = sizes[i], sizes[i + 1]
            g = 2.0 * batch * fin * fout
            layers.append(("fc%d" % (i + 1), [fout * fin, fout], 2 * g, g))
    elif name == "cnn":
        h = w = 28
        cin = 1
        for i, cout in enumerate((16, 32)):
            g = 2.0 * batch * h * w * cout * cin * 25
            layers.append(("conv%d" % (i + 1), [cout * cin * 25, cout], 2 * g, g))
            cin, h, w = cout, h // 2, w // 2
        for i, (fin, fout) in enumerate(((32 * 7 * 7, 128), (128, 10))):
            g = 2.0 * batch * fin * fout
            layers.append(("fc%d" % (i + 1), [fout * fin, fout], 2 * g, g))
    else:
        raise SystemExit("unknown model %r (mlp or cnn)" % name)
    return layers


def bucket_plan(layers, first_cap_mb, cap_mb):
    """[(bytes, ready fraction of backward)] in launch order, as ddp.c plans them."""
    params = []  # (count, layer index) in registration order
    for li, (_, counts, _, _) in enumerate(layers):
        for c in counts:
            params.append((c, li))
    # Backward FLOPs done once layer li's backward has run (layers run last to first; the first
    # layer computes no input gradient).
    flops = [(l[3] if i == 0 else l[2]) for i, l in enumerate(layers)]
    total = sum(flops)
    done_after = {}
    acc = 0.0
    for li in range(len(layers) - 1, -1, -1):
        acc += flops[li]
        done_after[li] = acc / total
    buckets = []
    cap = first_cap_mb * MIB
    nbytes, last_layer = 0.0, None
    for p in range(len(params) - 1, -1, -1):
        count, li = params[p]
        nbytes += 4.0 * count
        last_layer = li
        if nbytes >= cap and p > 0:
            buckets.append((nbytes, done_after[li]))
            nbytes, cap = 0.0, cap_mb * MIB
    if nbytes > 0:
        buckets.append((nbytes, done_after[last_layer]))
    return buckets


# ---- traces --------------------------------------------------------------------------------

def read_trace(path, skip):
    """Per-step medians (ms) of one trace: forward, backward, optimizer, period (forward start to
    the next forward start), per-bucket all-reduce durations, and allreduce start relative to
    backward start; steps < skip are left out. Ranks: the slowest rank's median."""
    with open(path) as f:
        events = [e for e in json.load(f) if e.get("ph") == "X"]
    dp = sorted({e["name"] for e in events if e.get("name", "").startswith("dp ")})
    if dp:
        # DataParallel's step (scatter, one replica per device thread, gather, reduce onto the
        # first device) is not the DDP step this model is built on: its forward and backward
        # lanes overlap and there is no all-reduce per bucket to time.
        sys.exit(f"scaling_model.py: {path} is a DataParallel trace (--mode dp: events "
                 f"{', '.join(repr(n) for n in dp)}); the scaling model reads DDP traces: "
                 f"record one process and mpirun -np N runs without --mode dp")
    if not events:
        sys.exit(f"scaling_model.py: {path} holds no timed events (not an mpitrain --trace?)")
    ranks = sorted({e["pid"] for e in events})
    per_rank = []
    for r in ranks:
        ev = [e for e in events if e["pid"] == r]
        fw = sorted((e for e in ev if e["name"] == "forward"), key=lambda e: e["ts"])
        steps = [e["args"]["n"] for e in fw]
        top = max(steps) if steps else 0
        skip_r = min(skip, top // 2) if skip >= 0 else (top + 1) // 2
        def med(name):
            v = [e["dur"] / 1e3 for e in ev if e["name"] == name and e["args"]["n"] >= skip_r]
            return statistics.median(v) if v else 0.0
        starts = [e["ts"] for e in fw if e["args"]["n"] >= skip_r]
        periods = [(b - a) / 1e3 for a, b in zip(starts, starts[1:])]
        t_skip = starts[0] if starts else 0
        ar = {}
        for e in ev:
            if e["name"] == "allreduce" and e["ts"] >= t_skip:
                ar.setdefault(e["args"]["n"], []).append(e["dur"] / 1e3)
        # allreduce start after the start of the backward it belongs to
        bw = sorted(((e["ts"], e["dur"]) for e in ev if e["name"] == "backward" and e["ts"] >= t_skip))
        lag = {}
        for e in ev:
            if e["name"] != "allreduce" or e["ts"] < t_skip:
                continue
            i = bisect.bisect_right([b[0] for b in bw], e["ts"]) - 1
            if i >= 0:
                lag.setdefault(e["args"]["n"], []).append((e["ts"] - bw[i][0]) / 1e3)
        per_rank.append({
            "forward_ms": med("forward"), "backward_ms": med("backward"),
            "optimizer_ms": med("optimizer"),
            "period_ms": statistics.median(periods) if periods else 0.0,
            "allreduce_ms": {k: statistics.median(v) for k, v in sorted(ar.items())},
            "allreduce_start_after_backward_start_ms":
                {k: statistics.median(v) for k, v in sorted(lag.items())},
            "steps": len(starts)})
    slow = max(per_rank, key=lambda x: x["period_ms"])
    slow = dict(slow)
    slow["ranks"] = len(ranks)
    # With several ranks, a rank's all-reduce also waits for the last rank to arrive. The k-th
    # all-reduce of bucket i on every rank is the same collective: its transfer time is counted
    # from the latest start to the earliest end.
    if len(ranks) > 1:
        occ = {}
        for r in ranks:
            t_skip = min((e["ts"] for e in events if e["pid"] == r and e["name"] == "forward"
                          and e["args"]["n"] >= (skip if skip >= 0 else 0)), default=0)
            if skip < 0:
                fw = sorted(e["ts"] for e in events if e["pid"] == r and e["name"] == "forward")
                t_skip = fw[len(fw) // 2] if fw else 0
            seen = {}
            for e in sorted((e for e in events if e["pid"] == r and e["name"] == "allreduce"),
                            key=lambda e: e["ts"]):
                k = seen.get(e["args"]["n"], 0)
                seen[e["args"]["n"]] = k + 1
                if e["ts"] >= t_skip:
                    occ.setdefault((e["args"]["n"], k), []).append((e["ts"], e["ts"] + e["dur"]))
        xfer, wait = {}, {}
        for (i, k), spans in occ.items():
            if len(spans) != len(ranks):
                continue
            last_start = max(a for a, _ in spans)
            first_start = min(a for a, _ in spans)
            end = min(b for _, b in spans)
            xfer.setdefault(i, []).append(max(0.0, end - last_start) / 1e3)
            wait.setdefault(i, []).append((last_start - first_start) / 1e3)
        slow["allreduce_transfer_ms"] = {i: statistics.median(v) for i, v in sorted(xfer.items())}
        slow["allreduce_skew_ms"] = {i: statistics.median(v) for i, v in sorted(wait.items())}
    return slow


# ---- all-reduce cost -------------------------------------------------------------------------

def ring_time(nbytes, w, gbps, alpha_us):
    if w <= 1:
        return 0.0
    return 2.0 * (w - 1) / w * nbytes / (gbps * 1e9) + 2.0 * (w - 1) * alpha_us * 1e-6


def allreduce_time(nbytes, w, ic, algorithm):
    g = ic["gpus_per_node"]
    if w <= g:
        return ring_time(nbytes, w, ic["nvlink_gbps"], ic["nvlink_alpha_us"])
    nodes = math.ceil(w / g)
    if algorithm == "ring":
        b = min(ic["nvlink_gbps"], ic["nics_per_node"] * ic["nic_gbps"])
        return ring_time(nbytes, w, b, ic["nic_alpha_us"])
    # hierarchical: reduce-scatter + all-gather in the node, ring across nodes on S / g, with
    # the node's NICs shared by its g shards.
    intra = ring_time(nbytes, g, ic["nvlink_gbps"], ic["nvlink_alpha_us"])
    per_shard_gbps = ic["nics_per_node"] * ic["nic_gbps"] / g
    inter = ring_time(nbytes / g, nodes, per_shard_gbps, ic["nic_alpha_us"])
    return intra + inter


class Measured:
    """All-reduce time against size from mpt_allreduce_bench --json (log-log interpolation)."""

    def __init__(self, path, which):
        with open(path) as f:
            j = json.load(f)
        self.world = j["world_size"]
        self.pts = sorted((r["bytes"], r[which]["time_us"] * 1e-6) for r in j["rows"])
        # least-squares fit of T = 2 (n-1) alpha + 2 (n-1)/n S / B on sizes >= 64 KiB
        n = self.world
        xs = [2.0 * (n - 1) / n * s for s, _ in self.pts if s >= 65536]
        ys = [t for s, t in self.pts if s >= 65536]
        if len(xs) >= 2 and n > 1:
            mx, my = statistics.mean(xs), statistics.mean(ys)
            sxx = sum((x - mx) ** 2 for x in xs)
            slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
            self.fit = {"gbps": 1.0 / slope / 1e9 if slope > 0 else None,
                        "alpha_us": max(0.0, (my - slope * mx) / (2.0 * (n - 1))) * 1e6}
        else:
            self.fit = None

    def time(self, nbytes):
        pts = self.pts
        if nbytes <= pts[0][0]:
            return pts[0][1]
        for (s0, t0), (s1, t1) in zip(pts, pts[1:]):
            if nbytes <= s1:
                f = math.log(nbytes / s0) / math.log(s1 / s0)
                return math.exp(math.log(t0) + f * (math.log(t1) - math.log(t0)))
        s0, t0 = pts[-1]
        return t0 * nbytes / s0


def simulate(c, buckets, times, overlap):
    """Step time (ms) and exposed communication (ms) for compute c and bucket times (s)."""
    b = c["backward_ms"]
    end = 0.0
    for (nbytes, frac), t in zip(buckets, times):
        ready = frac * b if overlap else b
        start = max(ready, end)
        end = start + t * 1e3
    exposed = max(0.0, end - b) if buckets else 0.0
    step = c["forward_ms"] + b + exposed + c["optimizer_ms"] + c["other_ms"]
    return step, exposed


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--trace1", required=True, help="Chrome trace of a one-process run")
    p.add_argument("--trace2", help="Chrome trace of a 2-rank DDP run (validation)")
    p.add_argument("--allreduce", help="mpt_allreduce_bench --json of this machine (validation)")
    p.add_argument("--allreduce-variant", default="in_place",
                   choices=["in_place", "out_of_place", "raw_in_place", "raw_out_of_place"],
                   help="which column of the all-reduce JSON models this machine (DDP: in_place)")
    p.add_argument("--model", default="mlp", choices=["mlp", "cnn"])
    p.add_argument("--hidden", default="512,512")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--bucket-cap-mb", type=float, default=25.0)
    p.add_argument("--first-bucket-cap-mb", type=float, default=1.0)
    p.add_argument("--skip", type=int, default=-1,
                   help="warm-up steps left out of the traces (default: the first half)")
    p.add_argument("--compute-scale", type=float, default=1.0)
    p.add_argument("--ranks", default="8,16,32,64,128,256,512,1024")
    p.add_argument("--interconnect", default="nvlink-ib400x8,nvlink-ib400x1")
    p.add_argument("--json")
    a = p.parse_args()

    layers = model_layers(a.model, [int(x) for x in a.hidden.split(",")], a.batch_size)
    buckets = bucket_plan(layers, a.first_bucket_cap_mb, a.bucket_cap_mb)
    t1 = read_trace(a.trace1, a.skip)
    c = {k: t1[k] * a.compute_scale for k in ("forward_ms", "backward_ms", "optimizer_ms")}
    c["other_ms"] = max(0.0, t1["period_ms"] - t1["forward_ms"] - t1["backward_ms"] -
                        t1["optimizer_ms"]) * a.compute_scale
    step1 = c["forward_ms"] + c["backward_ms"] + c["optimizer_ms"] + c["other_ms"]
    out = {"model": a.model, "batch_size_per_rank": a.batch_size, "compute_scale": a.compute_scale,
           "buckets": [{"bytes": b, "ready_fraction_of_backward": f} for b, f in buckets],
           "one_process": {"trace": t1, "compute_ms": c, "step_ms": step1},
           "predictions": {}, "validation": None}
    print("model %s, batch %d per rank: %d bucket(s): %s" % (
        a.model, a.batch_size, len(buckets),
        ", ".join("%.2f MiB ready at %.0f%% of backward" % (b / MIB, 100 * f) for b, f in buckets)))
    print("one process (median over %d steps%s): forward %.3f  backward %.3f  optimizer %.3f  "
          "other %.3f  step %.3f ms" % (t1["steps"], ", compute x %g" % a.compute_scale
                                        if a.compute_scale != 1 else "",
                                        c["forward_ms"], c["backward_ms"], c["optimizer_ms"],
                                        c["other_ms"], step1))

    ranks = [int(x) for x in a.ranks.split(",")]
    for name in a.interconnect.split(","):
        ic = INTERCONNECTS[name]
        print("\n%s: %s" % (name, ic["about"]))
        print("%6s %6s %12s %12s %8s %12s %8s %14s %8s" % (
            "ranks", "nodes", "allreduce ms", "step ovl ms", "eff ovl", "step no-ovl", "eff",
            "hier step ovl", "eff"))
        rows = []
        for w in ranks:
            tr = [allreduce_time(b, w, ic, "ring") for b, _ in buckets]
            th = [allreduce_time(b, w, ic, "hierarchical") for b, _ in buckets]
            s_on, e_on = simulate(c, buckets, tr, True)
            s_off, e_off = simulate(c, buckets, tr, False)
            s_h, e_h = simulate(c, buckets, th, True)
            row = {"ranks": w, "nodes": math.ceil(w / ic["gpus_per_node"]),
                   "allreduce_ms": 1e3 * sum(tr), "step_overlap_ms": s_on,
                   "exposed_overlap_ms": e_on, "efficiency_overlap": step1 / s_on,
                   "step_no_overlap_ms": s_off, "efficiency_no_overlap": step1 / s_off,
                   "hierarchical_allreduce_ms": 1e3 * sum(th), "hierarchical_step_overlap_ms": s_h,
                   "hierarchical_efficiency_overlap": step1 / s_h}
            rows.append(row)
            print("%6d %6d %12.3f %12.3f %8.3f %12.3f %8.3f %14.3f %8.3f" % (
                w, row["nodes"], row["allreduce_ms"], s_on, row["efficiency_overlap"], s_off,
                row["efficiency_no_overlap"], s_h, row["hierarchical_efficiency_overlap"]))
        out["predictions"][name] = {"interconnect": ic, "rows": rows}

    if a.trace2 and a.allreduce:
        m = Measured(a.allreduce, a.allreduce_variant)
        t2 = read_trace(a.trace2, a.skip)
        w = m.world
        tm = [m.time(b) for b, _ in buckets]
        c1 = {k: t1[k] for k in ("forward_ms", "backward_ms", "optimizer_ms")}
        c1["other_ms"] = max(0.0, t1["period_ms"] - sum(c1.values()))
        s_on, e_on = simulate(c1, buckets, tm, True)
        s_off, e_off = simulate(c1, buckets, tm, False)
        meas_ar = [t2["allreduce_ms"].get(i) for i in range(len(buckets))]
        meas_x = [t2.get("allreduce_transfer_ms", {}).get(i) for i in range(len(buckets))]
        meas_skew = [t2.get("allreduce_skew_ms", {}).get(i) for i in range(len(buckets))]
        val = {"world": w, "allreduce_fit": m.fit, "allreduce_variant": a.allreduce_variant,
               "predicted_allreduce_ms": [1e3 * t for t in tm], "measured_allreduce_ms": meas_ar,
               "measured_allreduce_transfer_ms": meas_x, "measured_allreduce_skew_ms": meas_skew,
               "predicted_step_overlap_ms": s_on, "predicted_step_no_overlap_ms": s_off,
               "measured_step_ms": t2["period_ms"], "measured": t2,
               "error_overlap": s_on / t2["period_ms"] - 1 if t2["period_ms"] else None,
               "error_no_overlap": s_off / t2["period_ms"] - 1 if t2["period_ms"] else None}
        out["validation"] = val
        print("\nthis machine, %d ranks (all-reduce from %s, %s%s):" % (
            w, a.allreduce, a.allreduce_variant,
            "; fit alpha %.1f us, B %.2f GB/s" % (m.fit["alpha_us"], m.fit["gbps"])
            if m.fit and m.fit["gbps"] else ""))
        f3 = lambda v: "%.3f" % v if v is not None else "-"
        for i, (b, _) in enumerate(buckets):
            print("  bucket %d (%.2f MiB): all-reduce predicted %.3f ms; in training %s ms per "
                  "rank, of which %s ms waiting for the other rank to start (skew), %s ms from "
                  "the last start" % (i, b / MIB, 1e3 * tm[i], f3(meas_ar[i]), f3(meas_skew[i]),
                                      f3(meas_x[i])))
        print("  measured 2-rank step %.3f ms (forward %.3f, backward %.3f, optimizer %.3f); "
              "1 rank %.3f ms" % (t2["period_ms"], t2["forward_ms"], t2["backward_ms"],
                                  t2["optimizer_ms"], t1["period_ms"]))
        print("  predicted: %.3f ms with overlap (%+.0f%%), %.3f ms without (%+.0f%%)" % (
            s_on, 100 * val["error_overlap"], s_off, 100 * val["error_no_overlap"]))
        print("  at 1 rank the model is the measurement itself (no communication): step %.3f ms"
              % t1["period_ms"])
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
