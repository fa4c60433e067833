/* mpitrain Llama-style language models (Touvron et al., 2023, "LLaMA"; Llama 2 and 3): the
 * layers as differentiable ops on the tape, and the model with the parameter names of Hugging
 * Face's LlamaForCausalLM.
 *
 * A decoder-only transformer like GPT-2 (transformer.h), with RMSNorm in place of LayerNorm
 * (Zhang & Sennrich, 2019), rotary position embeddings on the queries and keys instead of a
 * learned position embedding (RoPE: Su et al., 2021, in the half-split "rotate_half" layout of
 * Hugging Face's Llama), a SwiGLU MLP (Shazeer, 2020), grouped-query attention (Ainslie et al.,
 * 2023: n_kv_heads key/value heads, each shared by n_heads / n_kv_heads query heads), no biases
 * and, by default, an output head of its own (untied from the token embedding).
 *
 * The ops follow the conventions of transformer.h: each is written through the public op API
 * (mpitrain/autograd.h) on the core ops of mpitrain/ops_llama.h, ops_gpt.h and mpt_op_gemm;
 * checks its inputs (MPT_EINVAL for a NULL argument or a value outside its range, MPT_ESHAPE
 * naming the op and the shapes); records a node only when gradients are enabled and an input
 * needs one; and backward ACCUMULATES into the inputs' gradients in a fixed order (no atomics),
 * so a pass is bit-reproducible. Row-major float32; B sequences of T positions; a Linear's
 * weight is [out, in] (y = x W^T); head h of a [B, T, H * hd] tensor is channels
 * [h hd, (h + 1) hd).
 *
 * Devices: the core ops of ops_llama.h exist on the CPU only, so these ops and the model run on
 * the CPU; on another device the model refuses to be built and the ops return MPT_ENOTSUP. */
#ifndef MPITRAIN_LLAMA_H
#define MPITRAIN_LLAMA_H

#include "mpitrain/core.h"
#include "mpitrain/nn.h"
#include "mpitrain/ops_llama.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------------------ */
/* Ops (src/nn/llama_ops.c)                                                                   */

/* Token embedding without positions (a Llama's positions are in RoPE): y[b, t, :] =
 * weight[tokens[b, t], :]. tokens: int32 [B, T] on the weight's device (not a var; valid until
 * backward has run), each in [0, vocab_size); weight [V, C] with V >= vocab_size. y [B, T, C].
 * Backward: dweight[tokens[b, t], :] += dy[b, t, :] in the order b, t (mpt_op_embedding_gpt's).
 * Errors: MPT_EINVAL (a token outside [0, vocab_size), naming its position; vocab_size outside
 * [1, V]; tokens not int32 on the weight's device), MPT_ESHAPE, MPT_ENOTSUP, MPT_ENOMEM. */
MPT_API mpt_status mpt_nn_embedding(mpt_tape *tape, const mpt_tensor *tokens,
                                    int64_t vocab_size, mpt_var *weight, mpt_var **y);

/* RMSNorm over the last dimension C of x [..., C] (Zhang & Sennrich, 2019; Hugging Face's
 * LlamaRMSNorm in float32): rstd = 1 / sqrt(mean_c x^2 + eps), y = x * rstd * weight,
 * weight [C]; rstd of each row is saved for backward (mpt_op_rmsnorm_backward):
 *   dx += rstd (g - xhat mean_c(g xhat)), g = dy weight, xhat = x rstd;
 *   dweight += sum over rows of dy xhat.
 * Errors: MPT_EINVAL (eps < 0 or not finite), MPT_ESHAPE (x of rank 0 or C = 0; weight not
 * [C]), MPT_ENOTSUP, MPT_ENOMEM. */
MPT_API mpt_status mpt_nn_rmsnorm(mpt_tape *tape, mpt_var *x, mpt_var *weight, float eps,
                                  mpt_var **y);

/* Rotary position embedding (Su et al., 2021) of x [B, T, n_heads * hd] (hd even): the token
 * at position t (its index in T) has, for i in [0, hd/2), the angle a = t theta^(-2i/hd), and
 * each head's pair (x[i], x[i + hd/2]) is rotated by a: y[i] = x[i] cos a - x[i + hd/2] sin a,
 * y[i + hd/2] = x[i + hd/2] cos a + x[i] sin a (Hugging Face's rotate_half; mpt_op_rope). y is
 * a new var; backward rotates dy back by -a and adds it to dx.
 * Errors: MPT_EINVAL (n_heads < 1; theta not finite or <= 1), MPT_ESHAPE (x not [B, T, C] with
 * C = n_heads * hd, hd even and >= 2), MPT_ENOTSUP, MPT_ENOMEM. */
MPT_API mpt_status mpt_nn_rope(mpt_tape *tape, mpt_var *x, int n_heads, float theta,
                               mpt_var **y);

/* The SwiGLU MLP's first layer, fused (Shazeer, 2020; Hugging Face's LlamaMLP before its
 * down_proj): y = silu(x Wg^T) * (x Wu^T), silu(a) = a / (1 + exp(-a)); x [..., C],
 * w_gate and w_up [F, C], y [..., F]. One node: the two products G = x Wg^T and U = x Wu^T
 * are kept (in the arena) and the gate is one pass (mpt_op_swiglu); backward forms dG =
 * dy U silu'(G) and dU = dy silu(G) in one pass (mpt_op_swiglu_backward), then
 *   dx += dG Wg + dU Wu,  dWg += dG^T x,  dWu += dU^T x.
 * Errors: MPT_EINVAL, MPT_ESHAPE (x not [..., C], weights not both [F, C]), MPT_ENOTSUP,
 * MPT_ENOMEM. */
MPT_API mpt_status mpt_nn_linear_swiglu(mpt_tape *tape, mpt_var *x, mpt_var *w_gate,
                                        mpt_var *w_up, mpt_var **y);

/* Grouped-query causal self-attention (Ainslie et al., 2023) with RoPE on the queries and keys:
 * q [B, T, H * hd], k and v [B, T, KV * hd], H = n_heads a multiple of KV = n_kv_heads; query
 * head h attends with key/value head h / (H / KV) (Hugging Face's repeat_kv). When
 * rope_theta > 0, q and k are first rotated as mpt_nn_rope (theta rope_theta, which must then
 * be > 1); rope_theta = 0 leaves them as they are. Then, per b and query head h:
 *   att[t, t2] = softmax over t2 <= t of (q[t, h] . k[t2, h / (H / KV)]) / sqrt(hd)
 *   y[b, t, h hd + i] = sum_t2 att[t, t2] v[b, t2, (h / (H / KV)) hd + i],   y [B, T, H * hd].
 * Computed as two nodes: "gqa_pack" writes the packed [B, T, 3 H hd] input of
 * mpt_nn_causal_attention (the rotated q, then each key and value head repeated for the H / KV
 * query heads that share it), then that op (fused on a float32 CPU tape) runs on it. The pack's
 * backward sums the gradients of the H / KV copies of each key and value head (in increasing
 * order of the copies), rotates the query and key gradients back (mpt_op_rope_backward) and
 * adds them to dq, dk and dv. Memory: the packed [B, T, 3 H hd] is kept for backward, as the
 * GPT's qkv is; the pack's own scratch is reused from op to op (mpt_tape_scratch).
 * Errors: MPT_EINVAL (n_kv_heads < 1, n_heads not a multiple of it, a bad rope_theta),
 * MPT_ESHAPE (shapes, an odd hd with RoPE), MPT_ENOTSUP (not on the CPU), MPT_ENOMEM. */
MPT_API mpt_status mpt_nn_gqa_attention(mpt_tape *tape, mpt_var *q, mpt_var *k, mpt_var *v,
                                        int n_heads, int n_kv_heads, float rope_theta,
                                        mpt_var **y);

/* mpt_nn_gqa_attention with RoPE's frequencies scaled: scaling NULL or of type
 * MPT_ROPE_DEFAULT is mpt_nn_gqa_attention itself; MPT_ROPE_LLAMA3 rotates q and k (forward and
 * backward) with mpt_op_rope_freqs and the table of mpt_rope_inv_freq(hd, rope_theta, scaling).
 * Errors: as mpt_nn_gqa_attention; MPT_EINVAL also for a scaling mpt_rope_scaling_check
 * refuses. */
MPT_API mpt_status mpt_nn_gqa_attention_scaled(mpt_tape *tape, mpt_var *q, mpt_var *k,
                                               mpt_var *v, int n_heads, int n_kv_heads,
                                               float rope_theta,
                                               const mpt_rope_scaling *scaling, mpt_var **y);

/* The attention block of a Llama layer before its output projection, fused: the projections
 * q = x Wq^T, k = x Wk^T, v = x Wv^T of x [B, T, C] (wq [H hd, C], wk and wv [KV hd, C], no
 * bias), then mpt_nn_gqa_attention(q, k, v, n_heads, n_kv_heads, rope_theta). One node
 * ("llama_attention") computes the products, the rotation and the pack; when the three weights
 * lie one after the other in memory (as a model registers them: q_proj, k_proj, v_proj) the
 * products are ONE GEMM over [Wq; Wk; Wv], as the GPT's qkv, and so are backward's dx =
 * dQKV [Wq; Wk; Wv] and, when their gradients lie one after the other too, [dWq; dWk; dWv] +=
 * dQKV^T x; otherwise one GEMM per weight. q, k and v are not kept (backward needs only x and
 * the weights); the packed [B, T, 3 H hd] is, as in mpt_nn_gqa_attention. The results are those
 * of mpt_nn_linear_nd three times then mpt_nn_gqa_attention up to float rounding (the
 * products' summation order; tests/test_llama.c).
 * Errors: as mpt_nn_gqa_attention; MPT_ESHAPE also for x not [B, T, C] or a weight of another
 * shape. */
MPT_API mpt_status mpt_nn_llama_attention(mpt_tape *tape, mpt_var *x, mpt_var *wq, mpt_var *wk,
                                          mpt_var *wv, int n_heads, int n_kv_heads,
                                          float rope_theta, mpt_var **y);

/* mpt_nn_llama_attention with RoPE's frequencies scaled, as mpt_nn_gqa_attention_scaled (the
 * model's attention: mpt_llama_config's rope_scaling). Errors: as mpt_nn_llama_attention;
 * MPT_EINVAL also for a scaling mpt_rope_scaling_check refuses. */
MPT_API mpt_status mpt_nn_llama_attention_scaled(mpt_tape *tape, mpt_var *x, mpt_var *wq,
                                                 mpt_var *wk, mpt_var *wv, int n_heads,
                                                 int n_kv_heads, float rope_theta,
                                                 const mpt_rope_scaling *scaling, mpt_var **y);

/* ------------------------------------------------------------------------------------------ */
/* The Llama model (src/nn/llama.c)                                                           */

/* The sizes of a Llama, Hugging Face's config.json keys in brackets. */
typedef struct mpt_llama_config {
  int vocab_size;      /* V [vocab_size] */
  int dim;             /* C, the residual stream's channels [hidden_size] */
  int n_layers;        /* L [num_hidden_layers] */
  int n_heads;         /* H, query heads [num_attention_heads]; head size hd = dim / n_heads */
  int n_kv_heads;      /* KV, key/value heads [num_key_value_heads]; divides n_heads */
  int ffn_dim;         /* F, the MLP's inner size [intermediate_size] */
  int max_seq_len;     /* the longest T a forward takes [max_position_embeddings] */
  float rope_theta;    /* RoPE's base [rope_theta]: 10000 (Llama 2), 500000 (Llama 3) */
  float norm_eps;      /* RMSNorm's eps [rms_norm_eps] */
  int tied_embeddings; /* 1: the output head is the token embedding [tie_word_embeddings] */
  /* RoPE's frequency scaling [rope_scaling, or rope_parameters in transformers 5]: zeroed (type
   * MPT_ROPE_DEFAULT) for none, MPT_ROPE_LLAMA3 for Llama 3.1 / 3.2's (mpt_rope_inv_freq) */
  mpt_rope_scaling rope_scaling;
} mpt_llama_config;

/* Checks that a model can be built from `config`: every size >= 1 (and below 2^31 / 8 in
 * total extents), n_kv_heads <= n_heads and dividing it, dim a multiple of n_heads, an even
 * head size (RoPE rotates pairs), rope_theta finite and > 1, norm_eps finite and >= 0,
 * tied_embeddings 0 or 1, rope_scaling as mpt_rope_scaling_check. Errors: MPT_EINVAL naming the first field at fault and its value
 * (NULL config too). */
MPT_API mpt_status mpt_llama_config_check(const mpt_llama_config *config);

/* The presets, by name (all byte-level: V 256, as gpt-mini; RoPE theta 10000, eps 1e-5,
 * untied head):
 *   "llama-tiny"  C 64, L 2, H 4, KV 2, F 192, T 64 (tests; 131,392 parameters);
 *   "llama-mini"  C 384, L 6, H 6, KV 2, F 1024, T 256 (about gpt-mini's cost: 9,638,784
 *                 parameters against its 10,844,160).
 * Errors: MPT_EINVAL (NULL arguments, an unknown name, listing the known ones). */
MPT_API mpt_status mpt_llama_config_preset(const char *name, mpt_llama_config *config);

/* The number of parameter tensors (9 L + 2, plus 1 for an untied head) and of floats of a
 * model of `config` (0 for a config mpt_llama_config_check refuses). */
MPT_API int mpt_llama_num_tensors(const mpt_llama_config *config);
MPT_API int64_t mpt_llama_param_count(const mpt_llama_config *config);

/* A Llama language model on `device` (the CPU: another device gives MPT_ENOTSUP):
 *   x = embed_tokens[tokens];  L blocks of
 *     x += o_proj(gqa_attention(q_proj(h), k_proj(h), v_proj(h))),  h = input_layernorm(x);
 *     x += down_proj(silu(gate_proj(h)) * up_proj(h)),  h = post_attention_layernorm(x);
 *   logits = norm(x) lm_head^T  [B, T, V]  (lm_head = embed_tokens when tied);
 * RoPE with rope_theta (and rope_scaling) on q and k inside the attention
 * (mpt_nn_llama_attention_scaled: the three
 * projections in one GEMM, rotation and grouped-query attention). The input var
 * holds int32 tokens [B, T] (mpt_tape_input of an I32 tensor on the CPU, valid until
 * backward), 1 <= T <= max_seq_len, each in [0, vocab_size); the loss is
 * mpt_nn_cross_entropy_vocab(tape, logits, targets, vocab_size) (transformer.h).
 * Parameters, no biases, named as Hugging Face's LlamaForCausalLM names them and registered in
 * the order the forward uses them (DDP's buckets then fill in backward's order, as the GPT's):
 *   0 "model.embed_tokens.weight" [V, C]; for each layer l, at 1 + 9 l + k:
 *   k 0 "model.layers.{l}.input_layernorm.weight" [C], 1 "...self_attn.q_proj.weight"
 *   [H hd, C], 2 "...self_attn.k_proj.weight" [KV hd, C], 3 "...self_attn.v_proj.weight"
 *   [KV hd, C], 4 "...self_attn.o_proj.weight" [C, H hd], 5 "...post_attention_layernorm.weight"
 *   [C], 6 "...mlp.gate_proj.weight" [F, C], 7 "...mlp.up_proj.weight" [F, C],
 *   8 "...mlp.down_proj.weight" [C, F]; then 1 + 9 L "model.norm.weight" [C] and, untied,
 *   2 + 9 L "lm_head.weight" [V, C].
 * (Hugging Face's own named_parameters() lists a layer's two norms after its MLP; the names,
 * not the order, are what its files hold.) ZeRO-3's units (mpt_model_set_units): the
 * embedding, each layer, then the final norm with the head. With mpt_tape_recompute each layer
 * is one mpt_tape_checkpoint. Initialised by mpt_llama_init_weights from `seed`.
 * Errors: MPT_EINVAL (NULL arguments; the config, as mpt_llama_config_check), MPT_ENOTSUP (a
 * device other than the CPU), MPT_ENOMEM; the forward: MPT_ESHAPE (input not int32 [B, T] with
 * 1 <= T <= max_seq_len), errors of the ops. */
MPT_API mpt_status mpt_model_init_llama(mpt_model **model, mpt_device device,
                                        const mpt_llama_config *config, uint64_t seed);

/* Re-initialises a finalised Llama of `config` as Hugging Face initialises LlamaForCausalLM
 * (initializer_range 0.02): the norm weights 1, every other tensor drawn N(0, 0.02) in
 * registration order, each in its flat order, from one mpt_rng seeded with `seed` (Box-Muller
 * on 53-bit uniforms, as mpt_gpt_init_weights). The same seed gives bit-identical models; the
 * model's generation is bumped (mpt_model_init_params). Errors: MPT_EINVAL (NULL), MPT_ESHAPE
 * (the model is not a finalised Llama of `config`: its tensors' names and sizes are checked,
 * naming the first that differs), errors of mpt_model_init_params. */
MPT_API mpt_status mpt_llama_init_weights(mpt_model *model, const mpt_llama_config *config,
                                          uint64_t seed);

/* MPT_OK when `model` is a finalised Llama of `config`: 9 L + 2 (+ 1 untied) tensors, each
 * with the name and shape above. Errors: MPT_EINVAL (NULL, a bad config), MPT_ESHAPE naming
 * the first tensor that differs. For readers and writers of model files. */
MPT_API mpt_status mpt_llama_check_model(mpt_model *model, const mpt_llama_config *config);

#ifdef __cplusplus
}
#endif

#endif /* MPITRAIN_LLAMA_H */
