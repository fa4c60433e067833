"""transformers' side of bench/hf_interop.sh (needs PyPI's torch, transformers, safetensors).

  hf_interop.py compare MODEL_DIR MPT_LOGITS TOKEN...
      loads MODEL_DIR with transformers (LlamaForCausalLM or GPT2LMHeadModel, as its
      config.json says; float32), runs the tokens, and prints the max abs difference between
      its logits and mpitrain's (MPT_LOGITS: raw float32 [T, V] from mpt_st_logits), the
      largest logit magnitude, and the arg max agreement.
  hf_interop.py make llama|llama-tied|llama3|gpt2 DIR
      a model of random weights (transformers' own initialisation, seed 0) saved by
      save_pretrained into DIR; llama3 is llama with Llama 3.1's RoPE scaling (factor 32,
      low/high_freq_factor 1/4, an original context of 64 so that it acts within the compared
      tokens: of the head's frequencies one is kept, one smoothed, six divided by 32).
"""
import json
import sys

if __name__ == "__main__" and (len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help")):
    print(__doc__.strip())
    sys.exit(0 if len(sys.argv) >= 2 else 2)

# after --help: these need the PyPI packages (bench/hf_interop.sh's virtual environment)
import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig,  # noqa: E402
                          LlamaForCausalLM)

transformers.utils.logging.disable_progress_bar()
transformers.utils.logging.set_verbosity_error()


def load(d):
    with open(d + "/config.json") as f:
        cfg = json.load(f)
    cls = LlamaForCausalLM if cfg.get("model_type") == "llama" else GPT2LMHeadModel
    m = cls.from_pretrained(d, dtype=torch.float32, attn_implementation="eager")
    return m.eval(), cls.__name__


def compare(d, mpt_path, tokens):
    m, name = load(d)
    ids = torch.tensor([[int(t) for t in tokens]])
    with torch.no_grad():
        ref = m(ids).logits[0].double().numpy()
    got = np.fromfile(mpt_path, dtype="<f4").reshape(ref.shape).astype(np.float64)
    diff = np.abs(ref - got).max()
    same = int((ref.argmax(-1) == got.argmax(-1)).sum())
    print("%s %s: T %d, V %d: max |logit difference| %.3g (largest |logit| %.3g); arg max "
          "equal at %d of %d positions" % (name, d, ref.shape[0], ref.shape[1], diff,
                                            np.abs(ref).max(), same, ref.shape[0]))
    return diff


def make(kind, d):
    torch.manual_seed(0)
    if kind.startswith("llama"):
        rope = {"rope_type": "default", "rope_theta": 500000.0}
        if kind == "llama3":
            rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
                    "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 64}
        cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=176,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                          max_position_embeddings=128, rope_parameters=rope, rms_norm_eps=1e-5,
                          tie_word_embeddings=kind == "llama-tied", bos_token_id=1,
                          eos_token_id=2)
        m = LlamaForCausalLM(cfg)
    else:
        cfg = GPT2Config(n_layer=2, n_head=4, n_embd=64, n_positions=128, vocab_size=256,
                         bos_token_id=0, eos_token_id=0)
        m = GPT2LMHeadModel(cfg)
    m.save_pretrained(d)
    print("transformers %s, torch %s: %s saved by save_pretrained into %s (%d parameters)"
          % (transformers.__version__, torch.__version__, type(m).__name__, d,
             sum(p.numel() for p in m.parameters())))


if __name__ == "__main__":
    if sys.argv[1] == "compare":
        compare(sys.argv[2], sys.argv[3], sys.argv[4:])
    elif sys.argv[1] == "make":
        make(sys.argv[2], sys.argv[3])
    else:
        sys.exit("usage: hf_interop.py compare DIR LOGITS TOKEN... | make KIND DIR")
