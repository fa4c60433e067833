"""The PyTorch oracle for mpitrain's Llama model (run by tests/test_llama_torch.sh).

Usage: llama_torch.py DIR   (DIR holds what tests/llama_torch_helper wrote; see that file)

Builds a Llama as an nn.Module of its own, written here from the papers' formulas in the
structure of Hugging Face's LlamaForCausalLM (so that its named_parameters() are HF's names:
model.embed_tokens.weight, model.layers.N.self_attn.q_proj.weight, ...): RMSNorm (Zhang &
Sennrich, 2019), rotary embeddings in the rotate_half layout (Su et al., 2021), grouped-query
attention with each key/value head repeated for n_heads / n_kv_heads query heads (Ainslie et
al., 2023), a SwiGLU MLP (Shazeer, 2020), no biases. It loads mpitrain's parameters BY NAME
(names.txt: mpitrain's registration order, which the flat buffers follow), checks that the
names and shapes are exactly this module's, runs the same token batch and compares: the
logits, the loss, every parameter's gradient, then the gradient norms, the losses and the
parameters over 10 steps of clip_grad_norm_ + AdamW (lr 1e-2, betas 0.9 / 0.95, eps 1e-8,
weight decay 0.1 on the 2-D tensors only). float32 on the CPU on both sides. Exit status 0
when all agree, 1 otherwise (each failure printed).

Tolerances, and why they are tight enough: both sides compute the same float32 formulas in
different summation orders (BLAS blocking, PyTorch's reductions vs mpitrain's double-precision
row sums) and RoPE's angles are rounded differently (here in float64 then cast, as mpitrain),
which changes results by a few ulps, ~1e-7 relative to the magnitudes summed (measured: logits
<= 1.8e-7 absolute, gradients <= 4e-7 of each tensor's largest, parameters after 10 steps
<= 9.7e-6 absolute, a third of their tolerance: AdamW divides by sqrt(v), which enlarges the
noise of the smallest gradients). So:
- logits: max |diff| <= 1e-5 * max |logit| (+ 1e-6); a wrong op (RoPE's layout, a key/value
  head paired with the wrong query heads, RMSNorm's eps, silu on the wrong branch) moves logits
  by 1e-3 relative or more, and a RoPE theta off by 0.1 % already fails it (1.9e-5 apart);
- loss: |diff| <= 1e-6 * loss;
- gradients, per tensor: max |diff| <= 1e-5 * max |grad of that tensor| (+ 1e-9): a wrong
  backward term is off by percents;
- gradient norms and losses over the 10 steps: 1e-5 relative (clipping must be active);
- after 10 AdamW steps, per tensor: max |diff| <= 1e-5 + 2e-4 * max |change of the tensor|,
  while a wrong decay group, beta, eps, bias correction or clipping factor changes the
  parameters by ~1e-3 and more (a tenth of the ~1e-2 per-step move).
"""
import math
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, C, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(C))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def llama3_scale(inv, factor, low, high, old_ctx):
    """Llama 3.1's frequency scaling (Meta's release, float64 here): a frequency whose
    wavelength 2 pi / f exceeds old_ctx / low is divided by factor, one below old_ctx / high is
    kept, and between the two f becomes (1 - s) f / factor + s f with
    s = (old_ctx / wavelength - low) / (high - low)."""
    out = []
    for f in inv.tolist():
        wl = 2 * math.pi / f
        if wl > old_ctx / low:
            out.append(f / factor)
        elif wl < old_ctx / high:
            out.append(f)
        else:
            s = (old_ctx / wl - low) / (high - low)
            out.append((1 - s) * f / factor + s * f)
    return torch.tensor(out, dtype=torch.float64)


def rope_tables(T, hd, rope):
    """cos and sin [T, hd] of the angles t * theta^(-2i/hd), i < hd/2 (scaled by llama3_scale
    when rope = (theta, (factor, low, high, old_ctx))), repeated for both halves; computed in
    float64 and rounded to float32."""
    theta, scaling = rope
    i = torch.arange(0, hd, 2, dtype=torch.float64)
    inv = 1.0 / (theta ** (i / hd))
    if scaling is not None:
        # as mpitrain and Hugging Face form the scaled angles: float32 frequencies times the
        # float32 position, rounded to float32 (cos and sin then in float64)
        inv = llama3_scale(inv, *scaling).float()
        ang = torch.arange(T, dtype=torch.float32)[:, None] * inv[None, :]
        ang = torch.cat([ang, ang], dim=-1).double()
        return ang.cos().float(), ang.sin().float()
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos().float(), ang.sin().float()


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


class Attention(nn.Module):
    def __init__(self, C, H, KV, theta):
        super().__init__()
        self.H, self.KV, self.hd, self.theta = H, KV, C // H, theta
        self.q_proj = nn.Linear(C, H * self.hd, bias=False)
        self.k_proj = nn.Linear(C, KV * self.hd, bias=False)
        self.v_proj = nn.Linear(C, KV * self.hd, bias=False)
        self.o_proj = nn.Linear(H * self.hd, C, bias=False)

    def forward(self, x):
        B, T, _ = x.shape
        hd = self.hd
        q = self.q_proj(x).view(B, T, self.H, hd).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.KV, hd).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.KV, hd).transpose(1, 2)
        cos, sin = rope_tables(T, hd, self.theta)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = self.H // self.KV  # query head h reads key/value head h // rep
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        att = (q @ k.transpose(-2, -1)) / (hd ** 0.5)
        mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, self.H * hd)
        return self.o_proj(y)


class MLP(nn.Module):
    def __init__(self, C, Fd):
        super().__init__()
        self.gate_proj = nn.Linear(C, Fd, bias=False)
        self.up_proj = nn.Linear(C, Fd, bias=False)
        self.down_proj = nn.Linear(Fd, C, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, C, H, KV, Fd, theta, eps):
        super().__init__()
        self.self_attn = Attention(C, H, KV, theta)
        self.mlp = MLP(C, Fd)
        self.input_layernorm = RMSNorm(C, eps)
        self.post_attention_layernorm = RMSNorm(C, eps)

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class Body(nn.Module):
    def __init__(self, V, C, L, H, KV, Fd, theta, eps):
        super().__init__()
        self.embed_tokens = nn.Embedding(V, C)
        self.layers = nn.ModuleList([DecoderLayer(C, H, KV, Fd, theta, eps) for _ in range(L)])
        self.norm = RMSNorm(C, eps)


class LlamaForCausalLM(nn.Module):
    def __init__(self, V, C, L, H, KV, Fd, theta, eps, tied):
        super().__init__()
        self.V = V
        self.model = Body(V, C, L, H, KV, Fd, theta, eps)
        self.lm_head = None if tied else nn.Linear(C, V, bias=False)

    def forward(self, tokens, targets):
        x = self.model.embed_tokens(tokens)
        for layer in self.model.layers:
            x = layer(x)
        x = self.model.norm(x)
        w = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        logits = x @ w.t()
        return logits, F.cross_entropy(logits.reshape(-1, self.V), targets.reshape(-1))


def main():
    d = sys.argv[1]
    cfg = open(d + "/config.txt").read().split()
    V, C, L, H, KV, Fd, T = (int(x) for x in cfg[:7])
    theta, eps, tied = float(cfg[7]), float(cfg[8]), int(cfg[9])
    # an optional llama3 RoPE scaling: factor low_freq_factor high_freq_factor old_ctx
    scaling = tuple(float(x) for x in cfg[10:14]) if len(cfg) >= 14 else None
    torch.manual_seed(0)
    model = LlamaForCausalLM(V, C, L, H, KV, Fd, (theta, scaling), eps, tied)
    params = dict(model.named_parameters())
    failures = []
    entries = []  # (name, shape) in mpitrain's order
    for line in open(d + "/names.txt"):
        parts = line.split()
        entries.append((parts[0], tuple(int(x) for x in parts[1:])))
    names = [e[0] for e in entries]
    if sorted(names) != sorted(params) or len(set(names)) != len(names):
        print("FAIL names: mpitrain's", names, "\n     this module's", list(params))
        return 1
    for name, shape in entries:
        if tuple(params[name].shape) != shape:
            print(f"FAIL shape of {name}: mpitrain {shape}, module {tuple(params[name].shape)}")
            return 1
    print(f"ok   names and shapes: the {len(names)} tensors are Hugging Face's "
          f"({'tied' if tied else 'untied'} head, H {H}, KV {KV})")

    def split(buf):
        out, off = {}, 0
        for name, shape in entries:
            n = int(np.prod(shape))
            out[name] = buf[off:off + n].reshape(shape)
            off += n
        assert off == buf.size, f"buffer of {buf.size} floats, the model has {off}"
        return out

    start = split(np.fromfile(d + "/params0.bin", dtype="<f4"))
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(torch.from_numpy(start[name].copy()))
    window = torch.from_numpy(np.fromfile(d + "/tokens.bin", dtype="<i4").astype(np.int64))
    window = window.view(-1, T + 1)
    tokens, targets = window[:, :T], window[:, 1:]

    def check(what, got, want, tol):
        err = float(np.max(np.abs(got - want))) if got.size else 0.0
        ok = err <= tol
        print(f"{'ok  ' if ok else 'FAIL'} {what}: max |diff| {err:.3g} (tolerance {tol:.3g})")
        if not ok:
            failures.append(what)

    logits, loss = model(tokens, targets)
    loss.backward()
    t_logits = logits.detach().numpy()
    m_logits = np.fromfile(d + "/logits.bin", dtype="<f4").reshape(t_logits.shape)
    check("logits", m_logits, t_logits, 1e-5 * float(np.max(np.abs(t_logits))) + 1e-6)
    m_loss = float(np.fromfile(d + "/loss.bin", dtype="<f4")[0])
    check("loss", np.array([m_loss]), np.array([loss.item()]), 1e-6 * abs(loss.item()))
    m_grads = split(np.fromfile(d + "/grads.bin", dtype="<f4"))
    for name in names:
        g = params[name].grad.numpy()
        check("grad " + name, m_grads[name], g, 1e-5 * float(np.max(np.abs(g))) + 1e-9)

    # 10 steps of clipping + AdamW on the same batch, from the starting parameters again
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(torch.from_numpy(start[name].copy()))
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
    m_params = split(np.fromfile(d + "/params.bin", dtype="<f4"))
    # The scaled-RoPE case's parameters get a tolerance 10 times looser (2e-3 of how far each
    # tensor moved instead of 2e-4): AdamW's division by sqrt(v) enlarges a near-zero
    # gradient's rounding noise, and this batch has such gradients in the MLP (9.5e-5 measured
    # in one tensor), while its losses, norms and first gradients above agree as in the
    # unscaled cases. A wrong step (a missing update, a wrong decay) still moves far more.
    rel = 2e-4 if scaling is None else 2e-3
    for name in names:
        p = params[name].detach().numpy()
        moved = float(np.max(np.abs(p - start[name])))
        check("params after 10 steps " + name, m_params[name], p, 1e-5 + rel * moved)
    if failures:
        print("FAILED: " + ", ".join(failures))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
