#!/usr/bin/python3
"""Reference: the same training in PyTorch 1.13 (Debian's python3-torch), for side-by-side
throughput comparisons with mpitrain.

Trains mlp (784-512-512-10) or cnn (mpitrain's default CNN: conv 5x5 16 -> pool -> conv 5x5 32 ->
pool -> fc 128 -> fc 10) with SGD (momentum 0.9) on Fashion-MNIST from Debian's package (or
synthetic data), one process or DDP with the gloo backend over --np processes started with
torch.multiprocessing.spawn (torchrun is broken in Debian's build). Each process uses --threads
intra-op threads. Prints one line: samples/s over all ranks for the timed steps (warm-up steps
excluded), as `torch samples_per_sec=<value>`, and writes --json when asked.

--device cuda (any PyTorch with CUDA): the model on cuda:<rank> (DDP over NCCL when --np > 1),
plain FP32 (TF32 off in cuBLAS and cuDNN, as mpitrain's cuBLAS GEMMs); the data stays on the
host and each batch is gathered there, pinned and copied to the device every step, as the
mpitrain trainer does; the clock starts and stops after torch.cuda.synchronize().
"""
import argparse
import gzip
import json
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

DATA = "/usr/share/datasets/fashion-mnist"


def read_idx(path):
    with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load(args):
    if args.synthetic:
        g = torch.Generator().manual_seed(args.seed)
        n = 60000
        return (torch.rand(n, 1, 28, 28, generator=g) * 2 - 1,
                torch.randint(0, 10, (n,), generator=g))
    images = read_idx(os.path.join(args.data, "train-images-idx3-ubyte.gz"))
    labels = read_idx(os.path.join(args.data, "train-labels-idx1-ubyte.gz"))
    x = (torch.from_numpy(images.astype(np.float32)) / 255.0 - 0.2860) / 0.3530
    return x.reshape(-1, 1, 28, 28), torch.from_numpy(labels.astype(np.int64))


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 5, padding=2)
        self.conv2 = nn.Conv2d(16, 32, 5, padding=2)
        self.fc1 = nn.Linear(32 * 7 * 7, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))


def make_model(name):
    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512),
                             nn.ReLU(), nn.Linear(512, 10))
    return CNN()


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run(rank, args, result_queue):
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    world = args.np
    cuda = args.device == "cuda"
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    if world > 1:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(args.port))
        dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    x, y = load(args)
    model = make_model(args.model).to(device)
    if world > 1:
        model = nn.parallel.DistributedDataParallel(
            model, bucket_cap_mb=args.bucket_cap_mb, device_ids=[rank] if cuda else None)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9,
                          weight_decay=args.weight_decay)
    n = x.shape[0]
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(args.seed))
    shard = perm[rank::world]
    b = args.batch_size
    total = args.warmup + args.steps
    t0 = None
    loss_sum = 0.0
    for step in range(total):
        if step == args.warmup:
            if world > 1:
                dist.barrier()
            sync(device)
            t0 = time.perf_counter()
        idx = shard[(step * b) % (len(shard) - b):][:b]
        xb, yb = x[idx], y[idx]
        if cuda:
            xb = xb.pin_memory().to(device, non_blocking=True)
            yb = yb.pin_memory().to(device, non_blocking=True)
        opt.zero_grad(set_to_none=False)
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        if args.sync_every_step:
            # Like the mpitrain trainer, which reads each step's loss back to the host (and so
            # waits for the device every step).
            loss_sum += loss.item()
    if world > 1:
        dist.barrier()
    sync(device)
    seconds = time.perf_counter() - t0
    if rank == 0:
        result_queue.put(args.steps * b * world / seconds)
    if world > 1:
        # Teardown can hang in this build: barrier, drop the model, then destroy the group.
        dist.barrier()
        del model, opt
        dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", choices=["mlp", "cnn"], default="mlp")
    p.add_argument("--np", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--sync-every-step", action="store_true",
                   help="read the loss to the host every step, as the mpitrain trainer does "
                        "(with --warmup 0 the figure is then like the trainer's, which counts "
                        "every step of its epoch)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--bucket-cap-mb", type=float, default=25)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--data", default=DATA)
    p.add_argument("--synthetic", action="store_true")
    p.add_argument("--port", type=int, default=29531)
    p.add_argument("--json")
    args = p.parse_args()
    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    if args.np == 1:
        run(0, args, q)
    else:
        mp.spawn(run, args=(args, q), nprocs=args.np, join=True)
    sps = q.get()
    print(f"torch samples_per_sec={sps:.1f} model={args.model} np={args.np} "
          f"batch={args.batch_size} threads={args.threads} device={args.device} "
          f"torch={torch.__version__}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"impl": "torch", "version": torch.__version__, "model": args.model,
                       "np": args.np, "batch_size": args.batch_size, "threads": args.threads,
                       "device": args.device,
                       "steps": args.steps, "samples_per_sec": sps}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
