#!/bin/sh
# bench/plot.sh: PNG plots of the benchmark JSON files with gnuplot (Debian: apt-get install
# gnuplot-nox). Each plot is drawn when its input is given (or found in --in DIR under the
# names bench/run_all.sh gives them):
#   busbw_vs_size.png      busbw against message size, mpitrain and raw MPI, out-of-place and
#                          in-place, with the ratio on the right axis   (--allreduce FILE,
#                          from mpt_allreduce_bench --json; default allreduce_np2.json)
#   step_vs_bucket.png     step time and exposed communication against the bucket cap, overlap
#                          on and off        (--buckets FILE, train_bench.sh --sweep-buckets;
#                          default train_buckets.json)
#   samples_vs_ranks.png   samples/s against ranks with the ideal line W * samples/s(1)
#                          (--ranks FILE, train_bench.sh --sweep-ranks; default train_ranks.json)
#   step_breakdown.png     stacked per-step forward / backward / exposed comm / optimizer /
#                          other (--breakdown FILE: any train_bench.sh JSON; default: the ranks
#                          file, then the buckets file)
#
#   bench/plot.sh --in bench/results --out bench/results
set -u
. "$(dirname "$0")/bench_lib.sh"

indir="" outdir="" allreduce="" buckets="" ranks="" breakdown=""
while [ $# -gt 0 ]; do
  case $1 in
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) [ $# -ge 2 ] || bench_die "$1 needs a value (see --help)" ;;
  esac
  case $1 in
    --in) indir=$2 ;;
    --out) outdir=$2 ;;
    --allreduce) allreduce=$2 ;;
    --buckets) buckets=$2 ;;
    --ranks) ranks=$2 ;;
    --breakdown) breakdown=$2 ;;
    *) bench_die "unknown option '$1' (see --help)" ;;
  esac
  shift 2
done
command -v gnuplot >/dev/null 2>&1 || bench_die "gnuplot not found (apt-get install gnuplot-nox)"
[ -n "$indir" ] || indir=.
[ -n "$outdir" ] || outdir=$indir
mkdir -p "$outdir" || bench_die "cannot create $outdir"
pick() { # given default
  if [ -n "$1" ]; then echo "$1"; elif [ -f "$indir/$2" ]; then echo "$indir/$2"; fi
}
allreduce=$(pick "$allreduce" allreduce_np2.json)
buckets=$(pick "$buckets" train_buckets.json)
ranks=$(pick "$ranks" train_ranks.json)
[ -n "$breakdown" ] || breakdown=${ranks:-$buckets}
PY=$(bench_python)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mpt_plot.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# JSON -> whitespace-separated tables for gnuplot.
"$PY" - "$tmp" "$allreduce" "$buckets" "$ranks" "$breakdown" <<'EOF' || bench_die "cannot read the JSON inputs"
import json, sys
tmp, allreduce, buckets, ranks, breakdown = sys.argv[1:6]
def load(p):
    return json.load(open(p)) if p else None
a = load(allreduce)
if a:
    with open(tmp + "/allreduce.dat", "w") as f:
        f.write("# bytes mpt_oop mpt_ip raw_oop raw_ip ratio_oop ratio_ip\n")
        for r in a["rows"]:
            f.write("%d %g %g %g %g %g %g\n" % (r["bytes"], r["out_of_place"]["busbw_gbps"],
                    r["in_place"]["busbw_gbps"], r["raw_out_of_place"]["busbw_gbps"],
                    r["raw_in_place"]["busbw_gbps"], r["ratio_out_of_place"], r["ratio_in_place"]))
    with open(tmp + "/allreduce.title", "w") as f:
        f.write("all-reduce %s %s, %d ranks, %s backend (%s)" % (a["config"]["dtype"],
                a["config"]["op"], a["world_size"], a["backend"], a["mpi_library"]))
    with open(tmp + "/allreduce.raw", "w") as f:
        f.write(a["config"].get("raw", "MPI_Allreduce"))
b = load(buckets)
if b:
    for ov in ("on", "off"):
        rows = [r for r in b["results"] if r["mode"] == "ddp" and r["bucket_cap_mb"] is not None
                and r["overlap"] == (ov == "on") and r["samples_per_sec"]]
        rows.sort(key=lambda r: r["bucket_cap_mb"])
        with open(tmp + "/buckets_%s.dat" % ov, "w") as f:
            f.write("# cap_mb total_ms exposed_ms allreduce_ms samples_per_sec\n")
            for r in rows:
                bd = r["breakdown"]
                f.write("%g %g %g %g %g\n" % (r["bucket_cap_mb"], bd["total_ms"],
                        bd["exposed_comm_ms"], bd["allreduce_ms"], r["samples_per_sec"]))
    m = b["results"][0]
    with open(tmp + "/buckets.title", "w") as f:
        f.write("%s, batch %d per rank, %d ranks" % (m["model"], m["batch_size"],
                max(r["world"] for r in b["results"])))
r = load(ranks)
if r:
    rows = [x for x in r["results"] if x["mode"] in ("single", "ddp") and x["samples_per_sec"]
            and x["overlap"] in (None, True)]
    rows.sort(key=lambda x: x["world"])
    base = [x for x in rows if x["world"] == 1]
    s1 = base[0]["samples_per_sec"] if base else None
    with open(tmp + "/ranks.dat", "w") as f:
        f.write("# world samples_per_sec ideal efficiency oversubscribed\n")
        for x in rows:
            f.write("%d %g %g %g %d\n" % (x["world"], x["samples_per_sec"],
                    x["world"] * s1 if s1 else 0, x["scaling_efficiency"] or 0,
                    1 if x["oversubscribed"] else 0))
    with open(tmp + "/ranks.cpus", "w") as f:
        f.write("%d" % r["machine"]["cpus"])
    with open(tmp + "/ranks.title", "w") as f:
        f.write("%s, batch %d per rank, %d CPU(s)" % (rows[0]["model"], rows[0]["batch_size"],
                r["machine"]["cpus"]) if rows else "")
d = load(breakdown)
if d:
    with open(tmp + "/breakdown.dat", "w") as f:
        f.write("# label forward backward exposed optimizer other\n")
        for x in d["results"]:
            bd = x["breakdown"]
            if bd["total_ms"] is None:
                continue
            label = x["mode"] if x["mode"] == "single" else "%s-W%d" % (x["mode"], x["world"])
            if x["bucket_cap_mb"] is not None:
                label += "-%gMiB" % x["bucket_cap_mb"]
            if x["overlap"] is False:
                label += "-noovl"
            parts = [bd["forward_ms"], bd["backward_ms"], bd["exposed_comm_ms"], bd["optimizer_ms"]]
            other = max(0.0, bd["total_ms"] - sum(parts))
            f.write("%s %g %g %g %g %g\n" % (label, *parts, other))
EOF

made=""
if [ -f "$tmp/allreduce.dat" ]; then
  gnuplot <<EOF || bench_die "gnuplot failed on busbw_vs_size.png"
set terminal pngcairo size 900,560 font ",10" noenhanced
set output "$outdir/busbw_vs_size.png"
set title "$(cat "$tmp/allreduce.title")"
set logscale x 2
set format x "%.0b%B"
set xlabel "message size (bytes)"
set ylabel "bus bandwidth (GB/s)"
set y2label "busbw ratio mpitrain / raw"
set y2range [0:*]
set y2tics
set ytics nomirror
set grid
set key top left
plot "$tmp/allreduce.dat" u 1:2 w lp pt 7 lc rgb "#1f77b4" t "mpitrain out-of-place", \
     "" u 1:3 w lp pt 5 lc rgb "#17becf" t "mpitrain in-place", \
     "" u 1:4 w lp pt 6 lc rgb "#d62728" t "raw $(cat "$tmp/allreduce.raw") out-of-place", \
     "" u 1:5 w lp pt 4 lc rgb "#ff7f0e" t "raw $(cat "$tmp/allreduce.raw") in-place", \
     "" u 1:(0.5*(\$6+\$7)) axes x1y2 w l dt 2 lw 2 lc rgb "#2ca02c" t "ratio (mean of both)", \
     0.95 axes x1y2 w l dt 3 lc rgb "gray" t "goal 0.95"
EOF
  made="$made busbw_vs_size.png"
fi
if [ -f "$tmp/buckets_on.dat" ]; then
  gnuplot <<EOF || bench_die "gnuplot failed on step_vs_bucket.png"
set terminal pngcairo size 900,560 font ",10" noenhanced
set output "$outdir/step_vs_bucket.png"
set title "step time against DDP bucket cap: $(cat "$tmp/buckets.title")"
set logscale x 2
set xlabel "bucket cap (MiB)"
set ylabel "time per step (ms)"
set yrange [0:*]
set grid
set key top right
plot "$tmp/buckets_on.dat" u 1:2 w lp pt 7 lc rgb "#1f77b4" t "step, overlap on", \
     "$tmp/buckets_off.dat" u 1:2 w lp pt 6 lc rgb "#d62728" t "step, overlap off", \
     "$tmp/buckets_on.dat" u 1:3 w lp dt 2 pt 7 lc rgb "#1f77b4" t "exposed comm, overlap on", \
     "$tmp/buckets_off.dat" u 1:3 w lp dt 2 pt 6 lc rgb "#d62728" t "exposed comm, overlap off"
EOF
  made="$made step_vs_bucket.png"
fi
if [ -f "$tmp/ranks.dat" ]; then
  gnuplot <<EOF || bench_die "gnuplot failed on samples_vs_ranks.png"
set terminal pngcairo size 900,560 font ",10" noenhanced
set output "$outdir/samples_vs_ranks.png"
set title "training throughput against ranks: $(cat "$tmp/ranks.title")"
set xlabel "ranks (beyond the CPU count: oversubscribed)"
set ylabel "samples/s (all ranks)"
set xtics 1
set xrange [0.5:*]
set arrow from $(cat "$tmp/ranks.cpus").5, graph 0 to $(cat "$tmp/ranks.cpus").5, graph 1 nohead dt 3 lc rgb "gray"
set label "oversubscribed ->" at $(cat "$tmp/ranks.cpus").6, graph 0.05
set yrange [0:*]
set grid
set key top left
plot "$tmp/ranks.dat" u 1:3 w l dt 2 lc rgb "gray" t "ideal: W x samples/s(1)", \
     "" u 1:2 w lp pt 7 ps 1.5 lc rgb "#1f77b4" t "mpitrain (single, then DDP)", \
     "" u 1:2:(sprintf("%.0f%%", 100*\$4)) w labels offset 0,1.2 notitle
EOF
  made="$made samples_vs_ranks.png"
fi
if [ -f "$tmp/breakdown.dat" ]; then
  gnuplot <<EOF || bench_die "gnuplot failed on step_breakdown.png"
set terminal pngcairo size 900,560 font ",10" noenhanced
set output "$outdir/step_breakdown.png"
set title "per-step breakdown (mean, slowest rank)"
set style data histograms
set style histogram rowstacked
set style fill solid 0.85 border -1
set boxwidth 0.7
set ylabel "ms per step"
set yrange [0:*]
set xtics rotate by -30
set grid y
set key outside right noenhanced
plot "$tmp/breakdown.dat" u 2:xtic(1) t "forward" lc rgb "#1f77b4", \
     "" u 3 t "backward" lc rgb "#ff7f0e", \
     "" u 4 t "exposed comm" lc rgb "#d62728", \
     "" u 5 t "optimizer" lc rgb "#2ca02c", \
     "" u 6 t "other (loader, zero_grad, ...)" lc rgb "#7f7f7f"
EOF
  made="$made step_breakdown.png"
fi
[ -n "$made" ] || bench_die "nothing to plot: give --allreduce, --buckets, --ranks or --in DIR"
for p in $made; do echo "$outdir/$p"; done
