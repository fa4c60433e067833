#!/usr/bin/python3
"""The PyTorch side of the GPT stages of bench/gpu-check.sh: GPT-2 training throughput in
PyTorch on one device (the GPU there; the CPU in tests/test_gpu_check.sh), the same run as
`mpitrain train --model gpt-mini|gpt2 --no-shuffle --device D` on one rank.

The model is the test oracle's nn.Module (tests/gpt_torch.py, imported: GPT-2 from the paper's
and llm.c's formulas, head tied to wte, vocabulary padded to a multiple of 128, the loss over
the first V columns) with its attention on the model's device: --attn manual materialises the
[B, H, T, T] scores and their causal softmax, as mpitrain does; --attn sdpa is PyTorch's fused
F.scaled_dot_product_attention(is_causal=True) (PyTorch >= 2.0; exit status 3 without it),
what a PyTorch user runs.
Parameters: --model-file F (an llm.c model file, e.g. mpitrain's --save-model) or GPT-2's
initialisation from --seed (N(0, 0.02), the residual projections 0.02 / sqrt(2 L), biases 0).
Optimizer as mpitrain's GPT trainer: AdamW betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on the
>= 2-D tensors only, constant --lr (no warm-up: give mpitrain --warmup-steps 0 --lr-schedule
constant for equal losses), clip_grad_norm_ 1.0. Plain FP32: TF32 off for matmuls and cuDNN.

Data: llm.c token shards (--shards GLOB, sorted), windows of B T + 1 tokens in order (inputs,
next-token targets; window w of a shard starts at token w B T, none crosses a shard), each step
copied from the host to the device, as the trainer does.

Timing: every step counted, as mpitrain's "tokens/s overall": the clock starts before the first
step and stops after the last one's loss is read back (each step reads its loss: a
synchronisation, as mpitrain's); tokens_per_sec_after_first leaves the first step out (CUDA's
and cuBLAS's lazy set-up). Prints `torch tokens_per_sec=<v> tokens_per_sec_after_first=<v> ...`
and, with --print-losses, each step's loss and gradient norm (`step K loss L norm N`); --json
writes the figures.
"""
import argparse
import glob
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import gpt_torch  # noqa: E402  (tests/gpt_torch.py: the oracle's GPT module)

PRESETS = {"gpt-mini": dict(L=6, H=6, C=384, T=256, V=256),
           "gpt2": dict(L=12, H=12, C=768, T=1024, V=50257)}


class DeviceBlock(gpt_torch.Block):
    """The oracle's block, its causal mask on the input's device, or PyTorch's fused attention."""

    def __init__(self, C, H, attn):
        super().__init__(C, H)
        self.attn = attn

    def attention(self, x):
        B, T, C = x.shape
        hs = C // self.H
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (z.view(B, T, self.H, hs).transpose(1, 2) for z in (q, k, v))
        if self.attn == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            y = att.masked_fill(~mask, float("-inf")).softmax(dim=-1) @ v
        return y.transpose(1, 2).reshape(B, T, C)


def build_model(cfg, args):
    L, H, C, T, V = cfg["L"], cfg["H"], cfg["C"], cfg["T"], cfg["V"]
    Vp = (V + 127) // 128 * 128
    torch.manual_seed(args.seed)
    model = gpt_torch.GPT(T, V, L, H, C, Vp)
    model.blocks = nn.ModuleList([DeviceBlock(C, H, args.attn) for _ in range(L)])
    with torch.no_grad():
        if args.model_file:
            raw = np.fromfile(args.model_file, dtype="<i4", count=256)
            if raw[0] != 20240326 or raw[1] != 3 or list(raw[2:8]) != [T, V, L, H, C, Vp]:
                sys.exit(f"{args.model_file}: not an llm.c fp32 model of {args.model}'s sizes "
                         f"(header {list(raw[:8])})")
            params = np.fromfile(args.model_file, dtype="<f4", offset=1024)
            off = 0
            for kind, (parts, shape) in enumerate(zip(model.file_tensors(),
                                                      gpt_torch.shapes(T, V, L, H, C, Vp))):
                n = int(np.prod(shape))
                src = torch.from_numpy(params[off:off + n].copy()).view(shape)
                off += n
                for layer, p in enumerate(parts):  # kinds 2..13: one part per layer
                    p.copy_(src[layer] if 2 <= kind <= 13 else src)
            if off != params.size:
                sys.exit(f"{args.model_file}: size does not match its header")
        else:  # GPT-2's initialisation
            for name, p in model.named_parameters():
                if p.dim() >= 2:
                    res = name.endswith(("attproj.weight", "fcproj.weight"))
                    p.normal_(0.0, 0.02 / math.sqrt(2 * L) if res else 0.02)
                elif name.endswith("bias"):
                    p.zero_()
            model.wte[V:].zero_()
    return model


def windows(pattern, n_tokens, count):
    """The first `count` windows of n_tokens + 1 tokens of the shards, in order."""
    out = []
    for path in sorted(glob.glob(pattern)):
        head = np.fromfile(path, dtype="<i4", count=256)
        if head[0] != 20240520 or head[1] != 1:
            sys.exit(f"{path}: not an llm.c token shard")
        tok = np.fromfile(path, dtype="<u2", offset=1024, count=int(head[2])).astype(np.int64)
        for w in range((tok.size - 1) // n_tokens):
            out.append(tok[w * n_tokens:w * n_tokens + n_tokens + 1])
            if len(out) == count:
                return out
    sys.exit(f"{pattern}: {len(out)} windows of {n_tokens + 1} tokens, {count} needed")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", choices=sorted(PRESETS), default="gpt-mini")
    p.add_argument("--n-layer", type=int, help="L (default: the preset's; smaller for tests)")
    p.add_argument("--n-head", type=int)
    p.add_argument("--n-embd", type=int)
    p.add_argument("--seq-len", type=int)
    p.add_argument("--vocab-size", type=int)
    p.add_argument("--batch-size", type=int, default=8, help="B")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--device", default="cuda")
    p.add_argument("--attn", choices=["manual", "sdpa"], default="manual")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=0, help="intra-op threads (0: PyTorch's)")
    p.add_argument("--model-file")
    p.add_argument("--shards", required=True, help="glob of llm.c token shards")
    p.add_argument("--print-losses", action="store_true")
    p.add_argument("--json")
    args = p.parse_args()
    cfg = dict(PRESETS[args.model])
    for key, val in (("L", args.n_layer), ("H", args.n_head), ("C", args.n_embd),
                     ("T", args.seq_len), ("V", args.vocab_size)):
        if val:
            cfg[key] = val
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if args.attn == "sdpa" and not hasattr(F, "scaled_dot_product_attention"):
        print(f"torch {torch.__version__} has no F.scaled_dot_product_attention (--attn sdpa)")
        return 3
    dev = torch.device(args.device)
    B, T = args.batch_size, cfg["T"]
    data = windows(args.shards, B * T, args.steps)
    model = build_model(cfg, args).to(dev)
    decay = [q for q in model.parameters() if q.dim() >= 2]
    no_decay = [q for q in model.parameters() if q.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    n_params = sum(q.numel() for q in model.parameters())
    losses, norms = [], []
    if dev.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    ends = []
    for w in data:
        win = torch.from_numpy(w)
        x = win[:-1].view(B, T).to(dev)
        y = win[1:].view(B, T).to(dev)
        opt.zero_grad(set_to_none=False)
        _, loss = model(x, y)
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)))
        opt.step()
        losses.append(loss.item())
        ends.append(time.perf_counter())
    if dev.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    tps = args.steps * B * T / elapsed
    tps1 = (args.steps - 1) * B * T / (ends[-1] - ends[0]) if args.steps > 1 else tps
    flops = 6 * n_params + 6 * cfg["L"] * cfg["C"] * T
    if args.print_losses:
        for k, (l, n) in enumerate(zip(losses, norms)):
            print(f"step {k + 1} loss {l:.6f} norm {n:.6f}")
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    print(f"torch tokens_per_sec={tps:.1f} tokens_per_sec_after_first={tps1:.1f} "
          f"model={args.model} B={B} T={T} steps={args.steps} attn={args.attn} device={name} "
          f"params={n_params} gflops_per_sec={flops * tps * 1e-9:.1f} torch={torch.__version__}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"tokens_per_sec": tps, "tokens_per_sec_after_first": tps1,
                       "model": args.model, "batch_size": B, "seq_len": T, "steps": args.steps,
                       "attn": args.attn, "device": name, "params": n_params,
                       "flops_per_token": flops, "losses": losses, "norms": norms,
                       "torch": torch.__version__}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
