"""Oracle for mpitrain's safetensors GPT-2 reader, written from the format and transformers'
tensor names alone (struct + json, no safetensors package): `write DIR` writes DIR/config.json
and DIR/model.safetensors of a 1-layer GPT-2 (T 16, V 256, C 8, H 2) with known values, the
names prefixed "transformer." as a full GPT2LMHeadModel saves them, wpe and the attention
weights in BF16, the rest F32, plus lm_head.weight and h.0.attn.bias; `check DIR FILE` checks
that the llm.c model file FILE holds exactly those values, in llm.c's order, with transformers'
Conv1D weights ([in, out]) transposed to [out, in]."""
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


if __name__ == "__main__":
    if sys.argv[1] == "write":
        write(sys.argv[2])
    else:
        check(sys.argv[3])
