"""The PyTorch oracle for mpitrain's GPT model (run by tests/test_gpt_torch.sh).

Usage: gpt_torch.py DIR   (DIR holds what tests/gpt_torch_helper wrote; see that file)

Builds GPT-2 as an nn.Module of its own (written here from the paper's and llm.c's formulas,
not from mpitrain's code), loads the llm.c model file mpitrain wrote, runs the same token
batch, and compares with mpitrain: the logits, the loss, every parameter's gradient, then the
gradient norms, the losses and the parameters over 10 steps of clip_grad_norm_ + AdamW (betas
0.9 / 0.95, eps 1e-8, weight decay 0.1 on the 2-D tensors only). Everything is float32 on the
CPU, as mpitrain's side. Exit status 0 when all agree, 1 otherwise (each failure printed).

Two orders: the model file is read in llm.c's per-kind order (file_tensors), while mpitrain's
gradients and final parameters come as its flat buffer, in its registration order, which must
be the order in which this module registers its parameters (wte, wpe, then each block's ln1,
qkv, attproj, ln2, fc, fcproj weight and bias, then lnf): model_order() spells it out, it is
checked to be model.parameters(), and the buffer is split along it.

Tolerances, and why they are tight enough: both sides compute the same float32 formulas in
different summation orders (BLAS blocking, PyTorch's reductions vs mpitrain's), which changes
results by a few ulps, ~1e-7 relative to the magnitudes summed, growing mildly through two
blocks (measured: logits 1.2e-7, gradients <= 6e-8 absolute, i.e. <= 4e-6 of each tensor's
largest, parameters after 10 steps <= 2e-6). So:
- logits: max |diff| <= 1e-5 * max |logit| (+ 1e-6); a wrong op (a missing scale, a shifted
  mask, LayerNorm's eps or biased variance, the GELU variant) moves logits by 1e-3 relative or
  more;
- loss: |diff| <= 1e-6 * loss;
- gradients, per tensor: max |diff| <= 1e-5 * max |grad of that tensor| (+ 1e-9): a wrong
  backward term is off by percents; the padded wte rows must be exactly 0 on both sides;
- gradient norms and losses over the 10 steps: 1e-5 relative (clipping must be active);
- after 10 AdamW steps, per tensor: max |diff| <= 1e-5 + 2e-4 * max |change of the tensor|
  (about 4e-5), while a wrong decay group, beta, eps, bias correction or clipping factor changes
  the parameters by ~1e-3 and more (a tenth of the ~1e-2 per-step move).
  Except the key biases (channels [C, 2C) of qkvb): their gradient is exactly zero in exact
  arithmetic (q . b_k adds the same constant to every score of a softmax row), so both sides
  hold rounding noise there, which AdamW's m / (sqrt(v) + eps) turns into steps of up to lr in
  either direction (measured: 9e-5 apart). They are only checked to within 10 lr.
"""
import math
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

NAMES = ["wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb", "ln2w", "ln2b",
         "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"]


def shapes(T, V, L, H, C, Vp):
    """The 16 tensors of the llm.c model file, in its order."""
    return [(Vp, C), (T, C), (L, C), (L, C), (L, 3 * C, C), (L, 3 * C), (L, C, C), (L, C),
            (L, C), (L, C), (L, 4 * C, C), (L, 4 * C), (L, C, 4 * C), (L, C), (C,), (C,)]


class Block(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.H = H
        self.ln1 = nn.LayerNorm(C, eps=1e-5)
        self.qkv = nn.Linear(C, 3 * C)
        self.attproj = nn.Linear(C, C)
        self.ln2 = nn.LayerNorm(C, eps=1e-5)
        self.fc = nn.Linear(C, 4 * C)
        self.fcproj = nn.Linear(4 * C, C)

    def attention(self, x):
        B, T, C = x.shape
        hs = C // self.H
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (z.view(B, T, self.H, hs).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        return (att @ v).transpose(1, 2).reshape(B, T, C)

    def forward(self, x):
        x = x + self.attproj(self.attention(self.ln1(x)))
        return x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, T, V, L, H, C, Vp):
        super().__init__()
        self.V = V
        self.wte = nn.Parameter(torch.zeros(Vp, C))
        self.wpe = nn.Parameter(torch.zeros(T, C))
        self.blocks = nn.ModuleList([Block(C, H) for _ in range(L)])
        self.lnf = nn.LayerNorm(C, eps=1e-5)

    def forward(self, tokens, targets):
        T = tokens.shape[1]
        x = self.wte[tokens] + self.wpe[:T]
        for blk in self.blocks:
            x = blk(x)
        logits = self.lnf(x) @ self.wte.t()  # the head tied to wte
        loss = F.cross_entropy(logits[..., :self.V].reshape(-1, self.V), targets.reshape(-1))
        return logits, loss

    def file_tensors(self):
        """For each of the 16 file tensors, the list of parameters it is made of (per layer)."""
        b = self.blocks
        per = lambda f: [f(blk) for blk in b]
        return [[self.wte], [self.wpe], per(lambda k: k.ln1.weight), per(lambda k: k.ln1.bias),
                per(lambda k: k.qkv.weight), per(lambda k: k.qkv.bias),
                per(lambda k: k.attproj.weight), per(lambda k: k.attproj.bias),
                per(lambda k: k.ln2.weight), per(lambda k: k.ln2.bias),
                per(lambda k: k.fc.weight), per(lambda k: k.fc.bias),
                per(lambda k: k.fcproj.weight), per(lambda k: k.fcproj.bias),
                [self.lnf.weight], [self.lnf.bias]]

    def model_order(self):
        """mpitrain's registration order: layer-major."""
        order = [self.wte, self.wpe]
        for k in self.blocks:
            for mod in (k.ln1, k.qkv, k.attproj, k.ln2, k.fc, k.fcproj):
                order += [mod.weight, mod.bias]
        return order + [self.lnf.weight, self.lnf.bias]


def by_kind(model, buf):
    """mpitrain's flat buffer `buf` (model order) as one array per file tensor kind, each the
    concatenation over its layers (the grouping of file_tensors)."""
    order = model.model_order()
    assert [id(p) for p in order] == [id(p) for p in model.parameters()], \
        "model_order() is not the module's registration order"
    part, off = {}, 0
    for p in order:
        part[id(p)] = buf[off:off + p.numel()]
        off += p.numel()
    assert off == buf.size, f"buffer of {buf.size} floats, the model has {off}"
    return [np.concatenate([part[id(p)] for p in parts]) for parts in model.file_tensors()]


def flat(tensors):
    return np.concatenate([t.detach().numpy().reshape(-1) for t in tensors])


def main():
    d = sys.argv[1]
    raw = np.fromfile(d + "/model.bin", dtype="<i4", count=256)
    assert raw[0] == 20240326 and raw[1] == 3, "not an llm.c fp32 model file"
    T, V, L, H, C, Vp = (int(x) for x in raw[2:8])
    params = np.fromfile(d + "/model.bin", dtype="<f4", offset=1024)
    torch.manual_seed(0)
    model = GPT(T, V, L, H, C, Vp)
    off = 0
    with torch.no_grad():
        for kind, (parts, shape) in enumerate(zip(model.file_tensors(),
                                                  shapes(T, V, L, H, C, Vp))):
            n = int(np.prod(shape))
            src = torch.from_numpy(params[off:off + n].copy()).view(shape)
            off += n
            for layer, p in enumerate(parts):  # kinds 2..13 have one part per layer
                p.copy_(src[layer] if 2 <= kind <= 13 else src)
    assert off == params.size, "file size does not match its header"
    window = torch.from_numpy(np.fromfile(d + "/tokens.bin", dtype="<i4").astype(np.int64))
    window = window.view(-1, T + 1)
    tokens, targets = window[:, :T], window[:, 1:]
    failures = []

    def check(what, got, want, tol):
        err = float(np.max(np.abs(got - want))) if got.size else 0.0
        ok = err <= tol
        print(f"{'ok  ' if ok else 'FAIL'} {what}: max |diff| {err:.3g} (tolerance {tol:.3g})")
        if not ok:
            failures.append(what)

    logits, loss = model(tokens, targets)
    loss.backward()
    m_logits = np.fromfile(d + "/logits.bin", dtype="<f4").reshape(logits.shape)
    t_logits = logits.detach().numpy()
    check("logits", m_logits, t_logits, 1e-5 * float(np.max(np.abs(t_logits))) + 1e-6)
    m_loss = float(np.fromfile(d + "/loss.bin", dtype="<f4")[0])
    check("loss", np.array([m_loss]), np.array([loss.item()]), 1e-6 * abs(loss.item()))
    m_grads = np.fromfile(d + "/grads.bin", dtype="<f4")
    for name, parts, got in zip(NAMES, model.file_tensors(), by_kind(model, m_grads)):
        g = flat([p.grad for p in parts])
        check("grad " + name, got, g, 1e-5 * float(np.max(np.abs(g))) + 1e-9)
    pad = m_grads[V * C:Vp * C]  # wte comes first in both orders
    if np.any(pad != 0) or np.any(model.wte.grad[V:].numpy() != 0):
        failures.append("padded wte rows have a gradient")

    # 10 steps of clipping + AdamW on the same batch, from the file's parameters again
    start = flat([p for parts in model.file_tensors() for p in parts])
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-2, betas=(0.9, 0.95), eps=1e-8)
    norms, losses = [], []
    model.zero_grad()
    for _ in range(10):
        opt.zero_grad()
        _, loss = model(tokens, targets)
        losses.append(loss.item())
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)))
        opt.step()
    m_norms = np.fromfile(d + "/norms.bin", dtype="<f4")
    m_losses = np.fromfile(d + "/losses.bin", dtype="<f4")
    check("gradient norms (10 steps)", m_norms, np.array(norms), 1e-5 * max(norms))
    check("losses (10 steps)", m_losses, np.array(losses), 1e-5 * max(losses))
    clipped = sum(1 for n in norms if n > 0.5)
    print(f"     clipping was active in {clipped} of 10 steps (norms {min(norms):.3g}.."
          f"{max(norms):.3g})")
    if clipped == 0:
        failures.append("clipping never active: the test would not see it")
    m_params = np.fromfile(d + "/params.bin", dtype="<f4")
    off = 0
    for name, parts, got in zip(NAMES, model.file_tensors(), by_kind(model, m_params)):
        p = flat(parts)
        keep = np.ones(p.size, dtype=bool)
        if name == "qkvb":  # the key biases: see the module comment
            keep.reshape(L, 3 * C)[:, C:2 * C] = False
            check("params after 10 steps qkvb (key part, within 10 steps of lr)", got[~keep],
                  p[~keep], 10 * 1e-2)
        moved = float(np.max(np.abs(p - start[off:off + p.size])))
        check("params after 10 steps " + name, got[keep], p[keep], 1e-5 + 2e-4 * moved)
        off += p.size
    if failures:
        print("FAILED: " + ", ".join(failures))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
