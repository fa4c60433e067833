"""The PyTorch oracle for mpitrain's cross-entropy at large logits (run by
tests/test_xent_torch.sh).

Usage: xent_torch.py DIR   (DIR holds what tests/xent_torch_helper wrote; see that file)

At logits of magnitude 1e1, 1e2, 1e3 and 1e4 (a diverging run, a model with a large output
scale), compares mpitrain's fused cross-entropy over a padded vocabulary
(mpt_nn_cross_entropy_vocab), fed by LayerNorm and a linear head, and its unfused
mpt_nn_cross_entropy with PyTorch's F.cross_entropy in float64. Exit status 0 when all agree, 1
otherwise (each failure printed); each comparison's error is printed with its bound.

The reference is computed on mpitrain's own float32 logits, widened to float64: a softmax at
|logit| = s moves by s 2^-24 relative when a logit moves by one rounding, so two float32
forwards of the layer (different summation orders) would disagree by that much at s = 1e4 for
reasons that have nothing to do with the loss. With the same logits, what is left is the
rounding of mpitrain's float32 arithmetic. g = 1 / N is the largest |dlogit| (dloss = 1).

- loss (fused and unfused): within 1e-6 relative (a double sum rounded to float);
- dlogits: within 1e-6 g per element (a probability carries a few float roundings: exp within
  2 ulp, the products by 1 / sum and by g; 4e-7 g at most), exactly 0 in the padding columns;
  each row sums to 0 within 2e-6 g (those roundings summed). A row statistic kept as a float
  (the logsumexp) moves every probability by up to s 2^-24: row sums then miss 0 by 3e-5 g at
  s = 1e3 and 5e-4 g at 1e4;
- the logits (LayerNorm and the head in float32 against float64 from the same parameters):
  within 1e-5 of the largest |logit| (a few roundings of a 16-term dot product);
- gradients through the layer: PyTorch's float64 backward of LayerNorm + head, driven by the
  float64 dlogits of mpitrain's logits, against mpitrain's; per tensor, max |diff| within 1e-5
  of the tensor's largest |term| (for dW the largest |dlogit| |h|, else the largest entry of
  |dlogits| |W| times the LayerNorm factors; a GEMM over 64 columns and LayerNorm's row sums
  in float32, a few 1e-7 of those terms). A probability error of the row-sum kind above is
  carried to dLayerNorm's bias unattenuated (every column gets the row's sum times W's
  column), which is how the flaw showed in training (a LayerNorm bias gradient 15x too large).
  The padding rows of dW are exactly 0.
PyTorch's own float32 result on the same logits is printed for comparison (not checked).
"""
import sys

import numpy as np
import torch
import torch.nn.functional as F

N, C, V, VP = 16, 16, 50, 64
SCALES = [1e1, 1e2, 1e3, 1e4]

failures = 0


def load(d, si, name, shape, dtype=np.float32):
    a = np.fromfile(f"{d}/s{si}_{name}.bin", dtype=dtype)
    want = int(np.prod(shape))
    if a.size != want:
        raise SystemExit(f"FAIL: s{si}_{name}.bin holds {a.size} values, want {want}")
    return torch.from_numpy(a.reshape(shape).copy())


def check(what, err, bound):
    """Prints err against bound; counts a failure when err > bound (or is NaN)."""
    global failures
    ok = err <= bound
    print(f"  {'ok  ' if ok else 'FAIL'} {what}: {err:.3g} (bound {bound:.3g})")
    if not ok:
        failures += 1


def main():
    d = sys.argv[1]
    torch.set_grad_enabled(True)
    for si, s in enumerate(SCALES):
        print(f"|logit| ~ {s:g}:")
        x = load(d, si, "x", (N, C)).double()
        lnw = load(d, si, "lnw", (C,)).double()
        lnb = load(d, si, "lnb", (C,)).double()
        w = load(d, si, "w", (VP, C)).double()
        tg = load(d, si, "targets", (N,), np.int32).long()
        logits = load(d, si, "logits", (N, VP))
        loss = load(d, si, "loss", (1,)).double()[0].item()
        dlogits = load(d, si, "dlogits", (N, VP)).double()
        g = 1.0 / N

        # The reference on mpitrain's logits, float64.
        l64 = logits.double()[:, :V].clone().requires_grad_(True)
        ref_loss = F.cross_entropy(l64, tg)
        (ref_dl,) = torch.autograd.grad(ref_loss, [l64])
        ref_loss = ref_loss.item()
        print(f"  (logits: max |logit| {logits.abs().max().item():.4g}, loss {ref_loss:.6g})")
        check("fused loss, relative error", abs(loss - ref_loss) / abs(ref_loss), 1e-6)
        check("fused dlogits, max |diff| / g", (dlogits[:, :V] - ref_dl).abs().max().item() / g,
              1e-6)
        check("fused dlogits, max |row sum| / g", dlogits[:, :V].sum(1).abs().max().item() / g,
              2e-6)
        check("fused dlogits padding columns, max |value|",
              dlogits[:, V:].abs().max().item(), 0.0)

        # PyTorch's float32 on the same logits, for comparison.
        l32 = logits[:, :V].clone().requires_grad_(True)
        t32 = F.cross_entropy(l32, tg)
        (t32_dl,) = torch.autograd.grad(t32, [l32])
        print(f"  (PyTorch float32: loss {abs(t32.item() - ref_loss) / abs(ref_loss):.3g} "
              f"relative, dlogits {(t32_dl.double() - ref_dl).abs().max().item() / g:.3g} g, "
              f"row sums {t32_dl.double().sum(1).abs().max().item() / g:.3g} g)")

        # The layer: forward from the same parameters, backward driven by the reference dlogits.
        xs, ws, bs, Ws = (t.clone().requires_grad_(True) for t in (x, lnw, lnb, w))
        h = F.layer_norm(xs, (C,), ws, bs, eps=1e-5)
        out = h @ Ws.t()
        check("logits against float64, max |diff| / max |logit|",
              (logits.double() - out.detach()).abs().max().item() /
              out.detach().abs().max().item(), 1e-5)
        gout = torch.zeros(N, VP, dtype=torch.float64)
        gout[:, :V] = ref_dl
        ref = torch.autograd.grad(out, [xs, ws, bs, Ws], grad_outputs=gout)
        # Magnitudes: |dlogits| |W| (what dh sums), then LayerNorm's factors per tensor.
        dh_mag = gout.abs() @ w.abs()
        rstd = 1.0 / torch.sqrt(x.var(1, unbiased=False) + 1e-5)
        xhat = (x - x.mean(1, keepdim=True)) * rstd[:, None]
        # dx = rstd (gw - mean(gw) - xhat mean(gw xhat)), gw = dh lnw: per row at most
        # rstd max|gw| (2 + max xhat^2) in absolute terms.
        gw_max = (dh_mag * lnw.abs()).max(1).values
        mags = {
            "dx": (rstd * gw_max * (2 + xhat.pow(2).max(1).values)).max().item(),
            "dlnw": (dh_mag * xhat.abs()).sum(0).max().item(),
            "dlnb": dh_mag.sum(0).max().item(),
            "dw": (gout.abs().t() @ h.detach().abs()).max().item(),
        }
        shapes = {"dx": (N, C), "dlnw": (C,), "dlnb": (C,), "dw": (VP, C)}
        for (name, shape), r in zip(shapes.items(), ref):
            got = load(d, si, name, shape).double()
            check(f"{name} through the layer, max |diff| / largest term",
                  (got - r).abs().max().item() / mags[name], 1e-5)
        dw = load(d, si, "dw", (VP, C))
        check("dw padding rows, max |value|", dw[V:].abs().max().item(), 0.0)

        # The unfused cross-entropy on the same logits.
        loss2 = load(d, si, "loss2", (1,)).double()[0].item()
        dz = load(d, si, "dz", (N, V)).double()
        check("unfused loss, relative error", abs(loss2 - ref_loss) / abs(ref_loss), 1e-6)
        check("unfused dlogits, max |diff| / g", (dz - ref_dl).abs().max().item() / g, 1e-6)
        check("unfused dlogits, max |row sum| / g", dz.sum(1).abs().max().item() / g, 2e-6)
    if failures:
        print(f"FAIL: {failures} comparisons out of bounds")
        return 1
    print("PASS: mpitrain's cross-entropy matches PyTorch (float64) at every scale")
    return 0


if __name__ == "__main__":
    sys.exit(main())
