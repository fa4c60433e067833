#!/usr/bin/python3
"""Reference: GPT-2 and Llama training throughput in PyTorch, for side-by-side runs with mpitrain
(bench/compare_gpt.sh).

--model llama-mini: the Llama oracle's module (tests/llama_torch.py: Hugging Face's
LlamaForCausalLM structure, RMSNorm, RoPE, SwiGLU, grouped-query attention), initialised as
Hugging Face does (N(0, 0.02), norm weights 1), with F.scaled_dot_product_attention on the
repeated keys and values where the version has it; the rest as below.

The model is the test oracle's own nn.Module (tests/gpt_torch.py: GPT-2 written from the paper
and llm.c's formulas, head tied to wte, vocabulary padded to a multiple of 128, the loss over
the first V columns), imported, not copied. By default its attention is PyTorch's fused
F.scaled_dot_product_attention(is_causal=True) where the version has it (>= 2.0; what a
PyTorch user would run), else the module's own materialised [B, H, T, T] softmax (--attn
manual forces that one). Initialisation as GPT-2 (N(0, 0.02), the residual projections scaled by
1/sqrt(2 L), biases 0). Optimizer as mpitrain's GPT trainer: AdamW betas (0.9, 0.95), eps 1e-8,
weight decay 0.1 on the >= 2-D tensors only, clip_grad_norm_ 1.0 on the (averaged) gradients.

Data: llm.c token shards (--shards GLOB, the files mpitrain trains on): windows of B T + 1
tokens (inputs, next-token targets), shuffled from the seed, dealt to the ranks as
DistributedSampler does. One process, or DDP over gloo with --np processes started by
torch.multiprocessing.spawn (torchrun is broken in Debian's build), default 25 MiB buckets.
Each process uses --threads intra-op threads.

--autocast bf16 runs the forward (and the loss) under torch.autocast("cpu",
dtype=torch.bfloat16); backward and the optimizer stay as autocast leaves them (fp32 master
parameters).

Timing: --warmup steps, a barrier, --steps timed steps, a barrier. Prints one line
`torch tokens_per_sec=<all ranks' timed tokens / timed seconds> ...` and writes --json:
tokens/s, per-step times of rank 0, FLOPs per token as llm.c counts them (6 N + 6 L C T, N the
parameter count including the padded rows of wte), the losses, and every rank's peak resident
memory (getrusage ru_maxrss). --profile prints rank 0's torch.profiler table of the timed steps (by self
CPU time), to set beside mpitrain's `--profile`.
"""
import argparse
import glob
import json
import math
import os
import resource
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "tests"))
import gpt_torch  # noqa: E402  (tests/gpt_torch.py: the oracle's GPT module)
import llama_torch  # noqa: E402  (tests/llama_torch.py: the oracle's Llama module)

PRESETS = {"gpt-mini": dict(L=6, H=6, C=384, T=256, V=256),
           "gpt2": dict(L=12, H=12, C=768, T=1024, V=50257),
           "llama-mini": dict(L=6, H=6, KV=2, C=384, F=1024, T=256, V=256, llama=True)}


class SdpaBlock(gpt_torch.Block):
    """The oracle's block with PyTorch's fused causal attention (same parameters, same maths)."""

    def attention(self, x):
        B, T, C = x.shape
        hs = C // self.H
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (z.view(B, T, self.H, hs).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return y.transpose(1, 2).reshape(B, T, C)


class SdpaAttention(llama_torch.Attention):
    """The Llama oracle's attention with PyTorch's fused causal attention (same maths)."""

    def forward(self, x):
        B, T, _ = x.shape
        hd = self.hd
        q = self.q_proj(x).view(B, T, self.H, hd).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.KV, hd).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.KV, hd).transpose(1, 2)
        cos, sin = llama_torch.rope_tables(T, hd, self.theta)
        q = q * cos + llama_torch.rotate_half(q) * sin
        k = k * cos + llama_torch.rotate_half(k) * sin
        rep = self.H // self.KV
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, self.H * hd))


def build_llama(cfg, attn, seed):
    L, H, KV, C, Fd, V = cfg["L"], cfg["H"], cfg["KV"], cfg["C"], cfg["F"], cfg["V"]
    torch.manual_seed(seed)
    model = llama_torch.LlamaForCausalLM(V, C, L, H, KV, Fd, (10000.0, None), 1e-5, 0)
    if attn == "sdpa":
        for layer in model.model.layers:
            sdpa = SdpaAttention(C, H, KV, (10000.0, None))
            sdpa.load_state_dict(layer.self_attn.state_dict())
            layer.self_attn = sdpa
    with torch.no_grad():  # Hugging Face's initialisation: N(0, 0.02), norm weights 1
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.02)
            else:
                p.fill_(1.0)
    return model


def build_model(cfg, attn, seed):
    if cfg.get("llama"):
        return build_llama(cfg, attn, seed)
    L, H, C, T, V = cfg["L"], cfg["H"], cfg["C"], cfg["T"], cfg["V"]
    Vp = (V + 127) // 128 * 128
    torch.manual_seed(seed)
    model = gpt_torch.GPT(T, V, L, H, C, Vp)
    if attn == "sdpa":
        model.blocks = nn.ModuleList([SdpaBlock(C, H) for _ in range(L)])
    with torch.no_grad():  # GPT-2's initialisation
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * L) if name.endswith(("attproj.weight",
                                                                 "fcproj.weight")) else 0.02
                p.normal_(0.0, std)
            elif name.endswith("bias"):  # LayerNorm weights stay 1
                p.zero_()
        model.wte[V:].zero_()
    return model


def read_shards(pattern):
    files = sorted(glob.glob(pattern))
    if not files:
        raise SystemExit(f"torch_gpt_ref.py: no shard matches {pattern}")
    parts = []
    for path in files:
        head = np.fromfile(path, dtype="<i4", count=256)
        if head.size < 256 or head[0] != 20240520 or head[1] != 1:
            raise SystemExit(f"torch_gpt_ref.py: {path} is not an llm.c token shard")
        parts.append(np.fromfile(path, dtype="<u2", offset=1024, count=int(head[2])))
    return np.concatenate(parts).astype(np.int64)


def run(rank, args, cfg, q):
    torch.set_num_threads(args.threads)
    world = args.np
    if world > 1:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(args.port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
    tokens = torch.from_numpy(read_shards(args.shards))
    if int(tokens.max()) >= cfg["V"]:
        raise SystemExit(f"torch_gpt_ref.py: a token id {int(tokens.max())} >= vocabulary "
                         f"{cfg['V']}")
    B, T = args.batch_size, cfg["T"]
    n_windows = (tokens.numel() - 1) // (B * T)
    if n_windows < world:
        raise SystemExit(f"torch_gpt_ref.py: {n_windows} windows of {B * T + 1} tokens for "
                         f"{world} ranks")
    perm = torch.randperm(n_windows, generator=torch.Generator().manual_seed(args.seed))
    mine = perm[rank::world]
    model = build_model(cfg, args.attn, args.seed)
    nparams = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    if world > 1:
        model = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=args.bucket_cap_mb)
    opt_kw = {}
    if args.optim_impl != "default":
        opt_kw[args.optim_impl] = True
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, **opt_kw)
    autocast = (torch.autocast("cpu", dtype=torch.bfloat16) if args.autocast == "bf16"
                else None)
    total = args.warmup + args.steps
    losses, step_s = [], []
    t0 = None
    prof = None  # --profile: torch.profiler over the timed steps, rank 0
    for step in range(total):
        if step == args.warmup:
            if world > 1:
                dist.barrier()
            if args.profile and rank == 0:
                prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
                prof.__enter__()
            t0 = time.perf_counter()
        ts = time.perf_counter()
        w = int(mine[step % mine.numel()])
        win = tokens[w * B * T:w * B * T + B * T + 1]
        x, y = win[:-1].view(B, T), win[1:].view(B, T)
        opt.zero_grad(set_to_none=False)
        if autocast is not None:
            with autocast:
                _, loss = model(x, y)
        else:
            _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        step_s.append(time.perf_counter() - ts)
    if world > 1:
        dist.barrier()
    seconds = time.perf_counter() - t0
    if prof is not None:
        prof.__exit__(None, None, None)
        print(f"# torch.profiler, rank 0, {args.steps} timed steps (self CPU time, the ops that "
              f"did the work; profiling slows the steps):", flush=True)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18), flush=True)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    q.put((rank, rss, seconds, step_s, losses, nparams))
    if world > 1:
        # Teardown can hang in this build: barrier, drop the model, then destroy the group.
        dist.barrier()
        del model, opt
        dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", choices=sorted(PRESETS), default="gpt-mini")
    p.add_argument("--seq-len", type=int, help="T (default: the preset's)")
    p.add_argument("--np", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=8, help="B, per rank")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--bucket-cap-mb", type=float, default=25)
    p.add_argument("--attn", choices=["auto", "sdpa", "manual"], default="auto")
    p.add_argument("--optim-impl", choices=["default", "foreach", "fused"], default="default",
                   help="AdamW implementation (default: the version's own choice)")
    p.add_argument("--autocast", choices=["none", "bf16"], default="none")
    p.add_argument("--shards", required=True, help="glob of llm.c token shards")
    p.add_argument("--port", type=int, default=29561)
    p.add_argument("--json")
    p.add_argument("--profile", action="store_true",
                   help="rank 0: torch.profiler's table of the timed steps (slows them)")
    args = p.parse_args()
    if args.attn == "auto":
        args.attn = "sdpa" if hasattr(F, "scaled_dot_product_attention") else "manual"
    cfg = dict(PRESETS[args.model])
    if args.seq_len:
        cfg["T"] = args.seq_len
    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    if args.np == 1:
        run(0, args, cfg, q)
    else:
        mp.spawn(run, args=(args, cfg, q), nprocs=args.np, join=True)
    got = sorted(q.get() for _ in range(args.np))
    _, _, seconds, step_s, losses, nparams = got[0]
    seconds = max(g[2] for g in got)
    tokens_per_step = args.batch_size * cfg["T"] * args.np
    tps = args.steps * tokens_per_step / seconds
    flops_per_token = 6 * nparams + 6 * cfg["L"] * cfg["C"] * cfg["T"]
    rss = [g[1] for g in got]
    print(f"torch tokens_per_sec={tps:.1f} model={args.model} T={cfg['T']} np={args.np} "
          f"batch={args.batch_size} threads={args.threads} attn={args.attn} "
          f"autocast={args.autocast} gflops={flops_per_token * tps * 1e-9:.1f} "
          f"peak_rss_mib={','.join(f'{r:.0f}' for r in rss)} torch={torch.__version__}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"impl": "torch", "version": torch.__version__, "model": args.model,
                       "n_layer": cfg["L"], "n_head": cfg["H"], "n_embd": cfg["C"],
                       "seq_len": cfg["T"], "vocab_size": cfg["V"], "params": nparams,
                       "np": args.np, "batch_size": args.batch_size, "threads": args.threads,
                       "attn": args.attn, "optim_impl": args.optim_impl,
                       "autocast": args.autocast, "warmup": args.warmup, "steps": args.steps,
                       "tokens_per_sec": tps, "flops_per_token": flops_per_token,
                       "step_ms_rank0": [1e3 * s for s in step_s],
                       "losses_rank0": losses, "peak_rss_mib": rss}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
