#!/usr/bin/python3
"""Writes an llm.c token shard of uniformly random token ids (python3 standard library only).

    make_token_shard.py FILE --tokens N --vocab-size V [--seed S]

The format (as `mpitrain tokenize` writes and mpitrain train --shards reads): a header of 256
little-endian int32 (magic 20240520, version 1, token count, the rest 0), then N uint16 token
ids, each below V (V <= 65536). For throughput benchmarks of a model with a vocabulary that has
no tokenizer here (gpt2's 50257): the loss stays near ln(V), the arithmetic is the same as on
text. Written to FILE.tmp, then renamed.
"""
import argparse
import array
import os
import random
import struct
import sys


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("file")
    p.add_argument("--tokens", type=int, required=True)
    p.add_argument("--vocab-size", type=int, required=True)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    if not 1 <= a.tokens <= (1 << 31) - 1:
        p.error("--tokens must be in [1, 2^31 - 1]")
    if not 1 <= a.vocab_size <= 65536:
        p.error("--vocab-size must be in [1, 65536] (uint16 token ids)")
    rng = random.Random(a.seed)
    tokens = array.array("H", (rng.randrange(a.vocab_size) for _ in range(a.tokens)))
    if sys.byteorder != "little":
        tokens.byteswap()
    header = struct.pack("<256i", 20240520, 1, a.tokens, *([0] * 253))
    tmp = a.file + ".tmp"
    with open(tmp, "wb") as f:
        f.write(header)
        tokens.tofile(f)
    os.replace(tmp, a.file)
    return 0


if __name__ == "__main__":
    sys.exit(main())
