#!/usr/bin/env python3
"""bench/torch_gemm.py: the fp32 GEMMs of one GPT training step timed in PyTorch, the products
that mpt_gemm_bench (bench/gemm_bench.c) times in mpitrain, to compare the two GEMM libraries
(PyTorch's: MKL in the PyPI wheels; mpitrain's: oneDNN's sgemm) on the same shapes.

For each Linear of the model (qkv C -> 3C, attproj C -> C, fc C -> 4C, fcproj 4C -> C, the head
C -> Vp, tied), M = B*T rows:
  fwd  Y = F.linear(X, W, b)           [M, out] (no bias for the head)
  dx   dX = dY @ W                     [M, in]
  dw   dW += dY^T @ X                  [out, in] (addmm_, beta 1)
each the median of --reps timed calls after one untimed call, wall clock; the footer weighs
them as one step issues them (L per layer kind, 1 for the head), as mpt_gemm_bench's does.

  bench/.venv/bin/python bench/torch_gemm.py --model gpt-mini --threads 1
"""
import argparse
import statistics
import time

import torch

MODELS = {"gpt-mini": (384, 256, 6), "gpt2": (768, 50304, 12)}  # C, Vp, L


def median_ms(fn, reps):
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=sorted(MODELS), default="gpt-mini")
    ap.add_argument("--rows", type=int, default=2048, help="M = B*T (default 2048)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=7)
    a = ap.parse_args()
    if a.rows < 1 or a.threads < 1 or a.reps < 1:
        ap.error("--rows, --threads and --reps must be >= 1")
    torch.set_num_threads(a.threads)
    c, vp, layers = MODELS[a.model]
    m = a.rows
    kinds = [("qkv", 3 * c, c, layers), ("attproj", c, c, layers), ("fc", 4 * c, c, layers),
             ("fcproj", c, 4 * c, layers), ("head", vp, c, 1)]
    print(f"# torch_gemm: torch {torch.__version__} (BLAS: "
          f"{'MKL' if torch.backends.mkl.is_available() else 'not MKL'}), model {a.model} "
          f"(C {c}, Vp {vp}, L {layers}), M {m}, threads {torch.get_num_threads()}, "
          f"reps {a.reps} (median), wall clock")
    print("# layer    prod      m      n      k    GFLOP/s")
    g = torch.Generator().manual_seed(1)
    step_ms = step_flop = 0.0
    for name, out, inp, count in kinds:
        x = torch.randn(m, inp, generator=g)
        w = torch.randn(out, inp, generator=g)
        b = None if name == "head" else torch.randn(out, generator=g)
        dy = torch.randn(m, out, generator=g)
        dw = torch.zeros(out, inp)
        prods = [("fwd", (m, out, inp), lambda: torch.nn.functional.linear(x, w, b)),
                 ("dx", (m, inp, out), lambda: dy.mm(w)),
                 ("dw", (out, inp, m), lambda: dw.addmm_(dy.t(), x))]
        for prod, (pm, pn, pk), fn in prods:
            ms = median_ms(fn, a.reps)
            flop = 2.0 * pm * pn * pk
            step_ms += count * ms
            step_flop += count * flop
            print(f"  {name:8s} {prod:4s} {pm:6d} {pn:6d} {pk:6d} {flop / ms * 1e-6:10.1f}")
    print(f"# step (fwd + dx + dw of every Linear, {step_flop * 1e-9:.1f} GFLOP): torch "
          f"{step_ms:.1f} ms {step_flop / step_ms * 1e-6:.1f} GFLOP/s")


if __name__ == "__main__":
    main()
