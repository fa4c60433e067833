"""Oracle for mpitrain's safetensors GPT-2 reader, written from the format and transformers'
tensor names alone (struct + json, no safetensors package): `write DIR` writes DIR/config.json
and DIR/model.safetensors of a 1-layer GPT-2 (T 16, V 256, C 8, H 2) with known values, the
names prefixed "transformer." as a full GPT2LMHeadModel saves them, wpe and the attention
weights in BF16, the rest F32, plus lm_head.weight and h.0.attn.bias; `check DIR FILE` checks
that the llm.c model file FILE holds exactly those values, in llm.c's order, with transformers'
Conv1D weights ([in, out]) transposed to [out, in]; `bf16 F32FILE BF16FILE` checks that every
tensor of BF16FILE is F32FILE's rounded to nearest even, bit for bit (rounding written here from
the definition); `same FILE DIR` checks that the sharded model DIR (model.safetensors.index.json
and the shards it names) holds exactly FILE's tensors; `llama DIR` writes a Llama as transformers'
LlamaForCausalLM names it, in BF16, of Llama 3.2 1B's structure (16 layers, 32 query and 8
key/value heads, vocabulary 128256, rope_theta 500000, tied: no lm_head.weight) at width 128
(MLP 512; `llama DIR full`: 2048 and 8192, the whole shape), its config.json as transformers
writes Llama 3.2's (rope_scaling null); `llama-check
DIR FILE` checks that the F32 safetensors FILE holds exactly those values under the same names
and shapes (Linear weights [out, in]: no transposes)."""
import json
import struct
import sys

T, V, C, L, H = 16, 256, 8, 1, 2


def shapes():
    """(name, file shape, transposed) in llm.c's order for one layer."""
    return [("wte.weight", [V, C], False), ("wpe.weight", [T, C], False),
            ("h.0.ln_1.weight", [C], False), ("h.0.ln_1.bias", [C], False),
            ("h.0.attn.c_attn.weight", [C, 3 * C], True), ("h.0.attn.c_attn.bias", [3 * C], False),
            ("h.0.attn.c_proj.weight", [C, C], True), ("h.0.attn.c_proj.bias", [C], False),
            ("h.0.ln_2.weight", [C], False), ("h.0.ln_2.bias", [C], False),
            ("h.0.mlp.c_fc.weight", [C, 4 * C], True), ("h.0.mlp.c_fc.bias", [4 * C], False),
            ("h.0.mlp.c_proj.weight", [4 * C, C], True), ("h.0.mlp.c_proj.bias", [C], False),
            ("ln_f.weight", [C], False), ("ln_f.bias", [C], False)]


def values(k, n):
    """n values of tensor k, multiples of 1/64 in [-1, 1): exact in BF16 and F32."""
    return [((i * 37 + k * 11) % 128 - 64) / 64.0 for i in range(n)]


def count(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def bf16(names):
    return "wpe" in names or "attn" in names


def write(d):
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    tensors = [(k, "transformer." + name, shape) for k, (name, shape, _) in enumerate(shapes())]
    tensors += [(90, "lm_head.weight", [V, C]), (91, "transformer.h.0.attn.bias", [1, 1, T, T])]
    for k, name, shape in tensors:
        vals = values(k, count(shape))
        if bf16(name):
            raw = b"".join(struct.pack("<f", v)[2:] for v in vals)
            dtype = "BF16"
        else:
            raw = struct.pack("<%df" % len(vals), *vals)
            dtype = "F32"
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    text = json.dumps(header).encode()
    with open(d + "/model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    with open(d + "/config.json", "w") as f:
        json.dump({"architectures": ["GPT2LMHeadModel"], "n_layer": L, "n_head": H, "n_embd": C,
                   "n_positions": T, "vocab_size": V, "layer_norm_epsilon": 1e-5,
                   "scale_attn_weights": True, "summary_proj_to_labels": True,
                   "task_specific_params": {"text-generation": {"max_length": 50}}}, f)


def check(path):
    with open(path, "rb") as f:
        data = f.read()
    hdr = struct.unpack("<8i", data[:32])
    want_hdr = (20240326, 3, T, V, L, H, C, V)
    if hdr != want_hdr:
        sys.exit("header %s, want %s" % (hdr, want_hdr))
    pos, wrong = 1024, 0
    for k, (name, shape, transposed) in enumerate(shapes()):
        vals = values(k, count(shape))
        if transposed:  # file [in, out] -> llm.c [out, in]
            rows, cols = shape[1], shape[0]
            vals = [vals[c * rows + r] for r in range(rows) for c in range(cols)]
        got = struct.unpack_from("<%df" % len(vals), data, pos)
        pos += 4 * len(vals)
        bad = [i for i in range(len(vals)) if got[i] != vals[i]]
        if bad:
            wrong += 1
            print("%s: %d of %d values differ, first [%d] %r want %r"
                  % (name, len(bad), len(vals), bad[0], got[bad[0]], vals[bad[0]]))
    if pos != len(data):
        sys.exit("%d bytes, want %d" % (len(data), pos))
    if wrong:
        sys.exit(1)
    print("oracle: %d parameters exact" % ((pos - 1024) // 4))


LLAMA = dict(V=128256, C=128, L=16, H=32, KV=8, F=512)


def llama_tensors():
    """(name, shape) of LlamaForCausalLM's state_dict, tied (no lm_head.weight)."""
    v, c, hd, f = LLAMA["V"], LLAMA["C"], LLAMA["C"] // LLAMA["H"], LLAMA["F"]
    out = [("model.embed_tokens.weight", [v, c])]
    for l in range(LLAMA["L"]):
        p = "model.layers.%d." % l
        out += [(p + "input_layernorm.weight", [c]),
                (p + "self_attn.q_proj.weight", [LLAMA["H"] * hd, c]),
                (p + "self_attn.k_proj.weight", [LLAMA["KV"] * hd, c]),
                (p + "self_attn.v_proj.weight", [LLAMA["KV"] * hd, c]),
                (p + "self_attn.o_proj.weight", [c, LLAMA["H"] * hd]),
                (p + "post_attention_layernorm.weight", [c]),
                (p + "mlp.gate_proj.weight", [f, c]), (p + "mlp.up_proj.weight", [f, c]),
                (p + "mlp.down_proj.weight", [c, f])]
    return out + [("model.norm.weight", [c])]


def llama_raw(k, n, width):
    """Tensor k's n values, multiples of 1/1024 in [-1/16, 1/16) (exact in BF16), as `width`-byte
    little-endian floats (2: BF16, 4: F32); period 128, so built by repetition."""
    block = b"".join(struct.pack("<f", ((i * 37 + k * 11) % 128 - 64) / 1024.0)[4 - width:]
                     for i in range(128))
    return (block * (n // 128 + 1))[:n * width]


def llama_write(d):
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for k, (name, shape) in enumerate(llama_tensors()):
        n = 2 * count(shape)
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [off, off + n]}
        off += n
    text = json.dumps(header).encode()
    with open(d + "/model.safetensors", "wb") as f:  # tensor by tensor: the full width is 2.5 GB
        f.write(struct.pack("<Q", len(text)) + text)
        for k, (name, shape) in enumerate(llama_tensors()):
            f.write(llama_raw(k, count(shape), 2))
    with open(d + "/config.json", "w") as f:
        json.dump({"architectures": ["LlamaForCausalLM"], "attention_bias": False,
                   "attention_dropout": 0.0, "bos_token_id": 128000, "eos_token_id": 128001,
                   "head_dim": LLAMA["C"] // LLAMA["H"], "hidden_act": "silu",
                   "hidden_size": LLAMA["C"], "initializer_range": 0.02,
                   "intermediate_size": LLAMA["F"], "max_position_embeddings": 131072,
                   "mlp_bias": False, "model_type": "llama", "num_attention_heads": LLAMA["H"],
                   "num_hidden_layers": LLAMA["L"], "num_key_value_heads": LLAMA["KV"],
                   "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": None,
                   "rope_theta": 500000.0, "tie_word_embeddings": True,
                   "torch_dtype": "bfloat16", "transformers_version": "4.45.0.dev0",
                   "use_cache": True, "vocab_size": LLAMA["V"]}, f, indent=2)


def llama_check(path):
    got = read_st(path)
    want = llama_tensors()
    if sorted(got) != sorted(n for n, _ in want):
        sys.exit("names differ: %s" % sorted(set(got) ^ set(n for n, _ in want))[:5])
    for k, (name, shape) in enumerate(want):
        dt, sh, raw = got[name]
        if dt != "F32" or sh != shape or raw != llama_raw(k, count(shape), 4):
            sys.exit("%s: %s %s, not the values written" % (name, dt, sh))
    print("oracle: %d Llama tensors exact" % len(want))


def read_st(path):
    """{name: (dtype, shape, raw bytes)} of a safetensors file."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack_from("<Q", data, 0)
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], data[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in header.items()}


def rne(bits):
    """The bfloat16 bits of the float32 of `bits`, rounded to nearest, ties to even."""
    if bits & 0x7FFFFFFF > 0x7F800000:
        return (bits >> 16) | 0x40
    hi, lo = bits >> 16, bits & 0xFFFF
    return hi + 1 if lo > 0x8000 or (lo == 0x8000 and hi & 1) else hi


def bf16_check(f32_path, bf16_path):
    a, b = read_st(f32_path), read_st(bf16_path)
    if sorted(a) != sorted(b):
        sys.exit("tensor names differ")
    for name, (dt, shape, raw) in a.items():
        dt2, shape2, raw2 = b[name]
        if dt != "F32" or dt2 != "BF16" or shape != shape2:
            sys.exit("%s: %s %s -> %s %s" % (name, dt, shape, dt2, shape2))
        words = struct.unpack("<%dI" % (len(raw) // 4), raw)
        want = struct.pack("<%dH" % len(words), *[rne(w) for w in words])
        if want != raw2:
            sys.exit("%s: not rounded to nearest even" % name)
    print("oracle: %d tensors rounded to nearest even" % len(a))


def same(path, d):
    with open(d + "/model.safetensors.index.json") as f:
        wmap = json.load(f)["weight_map"]
    want, got = read_st(path), {}
    for shard in sorted(set(wmap.values())):
        for name, t in read_st(d + "/" + shard).items():
            if name in got or wmap.get(name) != shard:
                sys.exit("%s: in two shards or not in the map's" % name)
            got[name] = t
    if got != want:
        sys.exit("the shards' tensors differ from the file's")
    print("oracle: the shards hold the file's %d tensors, bit for bit" % len(want))


if __name__ == "__main__":
    if sys.argv[1] == "write":
        write(sys.argv[2])
    elif sys.argv[1] == "bf16":
        bf16_check(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "same":
        same(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "llama":
        if sys.argv[3:] == ["full"]:  # Llama 3.2 1B's width too (not run by the tests)
            LLAMA.update(C=2048, F=8192)
        llama_write(sys.argv[2])
    elif sys.argv[1] == "llama-check":
        llama_check(sys.argv[3])
    else:
        check(sys.argv[3])
