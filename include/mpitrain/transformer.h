/* mpitrain transformer ops: the layers of a GPT-2 language model (Radford et al., "Language
 * Models are Unsupervised Multitask Learners", 2019), as differentiable ops on the tape.
 *
 * Each op is written through the public op API (mpitrain/autograd.h): it checks its inputs
 * (MPT_EINVAL for a NULL argument, a wrong dtype or a tensor on another device; MPT_ESHAPE for
 * shapes, naming the op and the shapes), computes its output in a new arena var, and records a
 * node when gradients are enabled and an input needs one. Backward ACCUMULATES into the inputs'
 * gradients in a fixed order (no atomics), so a pass is bit-reproducible and a parameter used
 * twice (the tied token embedding and output head) gets the sum of both gradients; its
 * grad-ready hook fires once, after its last use.
 *
 * The layouts and formulas are those of GPT-2 as llm.c (Karpathy, train_gpt2.c) writes them:
 * row-major float32, B sequences of T positions of C channels, weights of a Linear [OC, C]
 * (y = x W^T + b), the qkv projection's output [B, T, 3C] holding q, k, v one after the other,
 * head h using channels [h*C/H, (h+1)*C/H) of each. The vocabulary V may be padded to Vp >= V
 * columns (llm.c rounds 50257 up to 50304); the padding rows of the token embedding are never
 * looked up and the padding columns of the logits are excluded from the softmax.
 *
 * Devices: the arithmetic is in core ops (mpitrain/ops_gpt.h) and mpt_op_gemm (oneDNN's or
 * OpenBLAS's sgemm on the CPU, cuBLAS on CUDA), enqueued on the tape's stream, so the ops run on
 * the model's device; MPT_ENOTSUP where that backend lacks a core op. Token and target ids are
 * range-checked on the CPU only (ops_gpt.h); the data loaders check them when they read. */
#ifndef MPITRAIN_TRANSFORMER_H
#define MPITRAIN_TRANSFORMER_H

#include "mpitrain/core.h"
#include "mpitrain/gpt_config.h"
#include "mpitrain/nn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Token + position embedding: y[b, t, :] = wte[tokens[b, t], :] + wpe[t, :].
 * tokens: int32 [B, T] on the model's device (not a var: it needs no gradient; it must stay
 * valid until backward has run), each in [0, vocab_size); wte [Vp, C] with Vp >= vocab_size;
 * wpe [maxT, C] with maxT >= T. y: [B, T, C].
 * Backward: dwte[tokens[b, t], :] += dy[b, t, :] and dwpe[t, :] += dy[b, t, :], in the order
 * b, t (deterministic: a token seen twice adds up in the same order every time).
 * Errors: MPT_EINVAL (a token outside [0, vocab_size), naming it and its position, on the
 * CPU; vocab_size outside [1, Vp]; tokens not int32 on the model's device), MPT_ESHAPE,
 * MPT_ENOTSUP. */
MPT_API mpt_status mpt_nn_embedding_gpt(mpt_tape *tape, const mpt_tensor *tokens,
                                        int64_t vocab_size, mpt_var *wte, mpt_var *wpe,
                                        mpt_var **y);

/* Layer normalisation (Ba et al., 2016) over the last dimension C of x [..., C]:
 *   mean = sum_c x / C,  rstd = 1 / sqrt(sum_c (x - mean)^2 / C + eps)   (biased variance)
 *   y = (x - mean) * rstd * weight + bias,  weight and bias [C];
 * GPT-2 uses eps = 1e-5 (PyTorch's default). mean and rstd of each row are saved for backward:
 *   dx += rstd * (g - mean_c(g) - xhat * mean_c(g * xhat)),
 *   g = dy * weight, xhat = (x - mean) * rstd
 *   dweight += sum over rows of dy * xhat,  dbias += sum over rows of dy.
 * Errors: MPT_EINVAL (eps < 0 or not finite), MPT_ESHAPE (x of rank 0 or C = 0; weight or
 * bias not [C]), MPT_ENOTSUP. */
MPT_API mpt_status mpt_nn_layernorm(mpt_tape *tape, mpt_var *x, mpt_var *weight, mpt_var *bias,
                                    float eps, mpt_var **y);

/* GELU, the tanh approximation GPT-2 uses (Hendrycks & Gimpel, 2016):
 *   y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), elementwise, any shape.
 * Errors: MPT_EINVAL, MPT_ENOTSUP. */
MPT_API mpt_status mpt_nn_gelu(mpt_tape *tape, mpt_var *x, mpt_var **y);

/* Linear over the last dimension: x [..., C] (rank >= 1), weight [OC, C], bias [OC] (may be
 * NULL) -> y [..., OC] = x W^T + b, one GEMM over all rows (x viewed as [rows, C]).
 * Backward: dx += dy W, dW += dy^T x, db += column sums of dy. The output head of GPT-2 is this
 * op with the token embedding wte [Vp, C] as weight and no bias.
 * Errors: MPT_EINVAL, MPT_ESHAPE, MPT_ENOTSUP. */
MPT_API mpt_status mpt_nn_linear_nd(mpt_tape *tape, mpt_var *x, mpt_var *weight, mpt_var *bias,
                                    mpt_var **y);

/* Fused forms of the compositions GPT-2 uses; each gives the same bits as the unfused ops, in
 * its forward and in every gradient, on the CPU (tests/test_gpt_fused.c).
 *
 * Linear + bias + GELU (the MLP's first layer): y = gelu(x W^T + b), bias required, shapes as
 * mpt_nn_linear_nd. One node: the product x W^T is kept (in the arena) without the bias, the
 * bias and GELU are applied in one pass (mpt_op_bias_gelu); backward computes the
 * pre-activation's gradient and db in one pass (mpt_op_bias_gelu_backward), then dx and dW as
 * linear_nd. Saves two passes over [rows, OC] in forward and one in backward.
 * Errors: MPT_EINVAL (NULL bias too), MPT_ESHAPE, MPT_ENOTSUP. */
MPT_API mpt_status mpt_nn_linear_gelu(mpt_tape *tape, mpt_var *x, mpt_var *weight,
                                      mpt_var *bias, mpt_var **y);

/* Residual add + LayerNorm: *sum = a + b (the residual stream, as mpt_nn_add) and *y =
 * LayerNorm(*sum) (as mpt_nn_layernorm), computed in one pass over the rows
 * (mpt_op_add_layernorm). Recorded as the two nodes of the unfused ops ("add", "layernorm"),
 * so backward is theirs. a and b: the same shape [..., C]; weight, bias [C].
 * Errors: MPT_EINVAL, MPT_ESHAPE, MPT_ENOTSUP. */
MPT_API mpt_status mpt_nn_add_layernorm(mpt_tape *tape, mpt_var *a, mpt_var *b,
                                        mpt_var *weight, mpt_var *bias, float eps,
                                        mpt_var **sum, mpt_var **y);

/* Causal multi-head self-attention (Vaswani et al., 2017) as GPT-2: qkv [B, T, 3C] is the output
 * of the qkv projection (q = channels [0, C), k = [C, 2C), v = [2C, 3C)); with n_head heads of
 * hs = C / n_head channels, for each b, head h and position t:
 *   att[b, h, t, t2] = softmax over t2 <= t of (q[b, t, h] . k[b, t2, h]) / sqrt(hs), 0 for t2 > t
 *   y[b, t, h*hs + i] = sum_t2 att[b, h, t, t2] v[b, t2, h*hs + i],   y [B, T, C].
 * On a float32 tape on the CPU the layer is the fused op mpt_op_causal_attention (ops_gpt.h):
 * per (b, h), split over the CPU threads, the scores live only in a per-thread scratch and
 * backward recomputes them from each row's saved max and 1 / sum ([B, H, T, 2]), with the same
 * results as the reference bit for bit. Elsewhere (CUDA, bf16 tapes) the reference: the scores
 * are materialised ([B, H, T, T], saved for backward; 4 B H T^2 bytes). Both compute GEMMs per
 * (b, h) over blocks of rows that stop at the diagonal (the part above it is never computed).
 * Backward is the chain rule through
 * the softmax (datt = dy v^T; dpre = att * (datt - rowsum(att * datt)); dq += dpre k / sqrt(hs);
 * dk += dpre^T q / sqrt(hs); dv += att^T dy).
 * Errors: MPT_EINVAL (n_head < 1), MPT_ESHAPE (qkv not [B, T, 3C], or C not a multiple of
 * n_head), MPT_ENOMEM (the fused op's scratch, the arena), MPT_ENOTSUP. */
MPT_API mpt_status mpt_nn_causal_attention(mpt_tape *tape, mpt_var *qkv, int n_head,
                                           mpt_var **y);

/* The memory mpt_nn_causal_attention takes for qkv [b, t, 3c] with nh heads on a tape of
 * `precision` whose stream is `stream` (NULL: the CPU), in bytes: *saved, what one layer keeps
 * from forward to backward (the fused op's stats, 8 b nh t bytes; the reference's scores,
 * 4 b nh t^2); *scratch, the most it allocates while it runs and frees before returning (the
 * fused op's per-thread slots: 8 t^2 bytes each in backward, for up to min(`threads`, b nh)
 * threads; 0 for the reference). The choice between the two is the layer's own (the
 * MPT_ATTENTION environment variable included), so a caller can bound a run's memory before
 * allocating it. Either output may be NULL. Thread-safe; no device work. */
MPT_API void mpt_nn_causal_attention_memory(mpt_stream *stream, mpt_precision precision,
                                            int64_t b, int64_t t, int64_t nh, int threads,
                                            double *saved, double *scratch);

/* Fused softmax cross-entropy over a (padded) vocabulary: logits [B, T, Vp] (or [N, Vp]),
 * targets int32 [B, T] (or [N]; on the model's device, valid until backward has run), each in
 * [0, vocab_size), vocab_size <= Vp. Only columns [0, vocab_size) take part in the softmax (the
 * padding columns get no probability and a zero gradient):
 *   loss = mean over the N = B*T positions of (logsumexp_{j < V} logits[n, j] - logits[n, target]),
 * a scalar in nats, summed in double. Saves each row's maximum and 1 / sum of exp(logit - max)
 * ([N, 2]) only, and recomputes the probabilities in backward from them (right at any logit
 * magnitude, mpt_op_xent_vocab): dlogits[n, j] += dloss / N * (p[n, j] - [j == target]), j < V.
 * Errors: MPT_EINVAL (a target outside [0, vocab_size), naming its position, on the CPU;
 * vocab_size outside [1, Vp]), MPT_ESHAPE (targets' shape is not that of logits without its last
 * dimension; no position), MPT_ENOTSUP. */
MPT_API mpt_status mpt_nn_cross_entropy_vocab(mpt_tape *tape, mpt_var *logits,
                                              const mpt_tensor *targets, int64_t vocab_size,
                                              mpt_var **loss);

/* ------------------------------------------------------------------------------------------ */
/* The GPT-2 model (src/nn/gpt.c)                                                             */

/* The presets, by name: "gpt2" (GPT-2 124M: T 1024, V 50257, L 12, H 12, C 768, Vp 50304;
 * 124,475,904 parameters), "gpt2-medium" (350M: L 24, H 16, C 1024; 354,871,296 parameters),
 * "gpt2-large" (774M: L 36, H 20, C 1280; 774,090,240 parameters; both T 1024, V 50257,
 * Vp 50304, llm.c's d24 and d36) and "gpt-mini" (T 256, V 256 (bytes), L 6, H 6, C 384,
 * Vp 256).
 * The config is mpt_gpt_config of gpt_config.h (the model file's header fields).
 * Errors: MPT_EINVAL (NULL arguments, an unknown name). */
MPT_API mpt_status mpt_gpt_config_preset(const char *name, mpt_gpt_config *config);

/* A GPT-2 language model on `device` (Radford et al., 2019, as llm.c's train_gpt2.c):
 *   x = wte[tokens] + wpe[t];  L blocks of
 *     x += attproj(causal_attention(qkv(ln1(x))));  x += fcproj(gelu(fc(ln2(x))));
 *   logits = lnf(x) wte^T  [B, T, Vp]  (the output head is tied to the token embedding);
 * LayerNorm eps 1e-5. The input var holds int32 tokens [B, T] (mpt_tape_input of an I32
 * tensor on the model's device, valid until backward), 1 <= T <= max_seq_len, each in
 * [0, vocab_size); the loss is mpt_nn_cross_entropy_vocab(tape, logits, targets, vocab_size).
 * Parameters (12 L + 4), registered layer-major, as PyTorch's GPT modules register theirs:
 * "wte" [Vp, C], "wpe" [T, C], then for each layer l: "h{l}.ln1w", "h{l}.ln1b" [C],
 * "h{l}.qkvw" [3C, C], "h{l}.qkvb" [3C], "h{l}.attprojw" [C, C], "h{l}.attprojb" [C],
 * "h{l}.ln2w", "h{l}.ln2b" [C], "h{l}.fcw" [4C, C], "h{l}.fcb" [4C], "h{l}.fcprojw" [C, 4C],
 * "h{l}.fcprojb" [C]; then "lnfw", "lnfb" [C]. Index of the k-th tensor (0..11) of layer l:
 * 2 + 12 l + k; lnfw 2 + 12 L, lnfb 3 + 12 L. Why: DDP's buckets are contiguous slices of the
 * flat gradient buffer in reverse registration order, launched in index order, and backward
 * finalises the last layer first, so each bucket is complete early and its all-reduce overlaps
 * the rest of backward (the llm.c file's per-kind order would make the first bucket wait for
 * layer 0: measured on gpt-mini, B 2, T 256, 1 MiB caps, ready at 92 % of backward against 4 %
 * layer-major). So the flat buffer is NOT the file's parameter array: mpt_gpt_params_copy
 * maps the two tensor by tensor (mpt_gpt_load and mpt_gpt_save of gpt_file.h use it).
 * Initialised by mpt_gpt_init_weights from `seed`. A zero padded_vocab_size is taken as
 * mpt_gpt_padded_vocab(vocab_size). Errors: MPT_EINVAL (NULL arguments; the config, as
 * mpt_gpt_layout_compute), MPT_ENOMEM; the forward: MPT_ESHAPE (input not int32 [B, T] with
 * 1 <= T <= max_seq_len), errors of the ops. */
MPT_API mpt_status mpt_model_init_gpt(mpt_model **model, mpt_device device,
                                      const mpt_gpt_config *config, uint64_t seed);
/* mpt_model_init_gpt with the initialisation deferred (nn.h "Initialisation by unit"): the
 * parameters are registered and finalised but not written (they read zero, no page of them is
 * resident); mpt_model_init_unit writes a unit's values (the embeddings, a block, the final
 * LayerNorm), the bytes mpt_model_init_gpt writes for `seed`, and DDP's ZeRO-3 does so unit
 * by unit at mpt_ddp_init, keeping only its shard. The construction walks the random stream
 * once to record where each weight tensor's draws start (about N generator steps, without the
 * normal transform). Host memory only. Errors: those of mpt_model_init_gpt; MPT_ENOTSUP (a device). */
MPT_API mpt_status mpt_model_init_gpt_deferred(mpt_model **model, mpt_device device,
                                               const mpt_gpt_config *config, uint64_t seed);

/* Re-initialises a finalised GPT model of `config` as GPT-2: mpt_model_init_params (biases 0,
 * LayerNorm weights 1, the model's generation is bumped), then the weights wte, wpe, qkvw,
 * attprojw, fcw, fcprojw (in that order, each in its flat order) drawn N(0, 0.02) from one
 * mpt_rng seeded with `seed` (Box-Muller on 53-bit uniforms), the two residual projections
 * attprojw and fcprojw with std 0.02 / sqrt(2 L). The same seed gives bit-identical models.
 * The draws are taken in the model file's order (kind by kind: wte, wpe, then qkvw of layers
 * 0..L-1, attprojw of each layer, ...), not in the registration order, so each named tensor
 * gets the values it had when the registration followed the file's order.
 * Draws on the host; on a device each tensor is copied over. Errors: MPT_EINVAL, MPT_ESHAPE
 * (the model is not a finalised GPT of `config`), MPT_ENOMEM (the host buffer), errors of
 * mpt_model_init_params and of the copies. */
MPT_API mpt_status mpt_gpt_init_weights(mpt_model *model, const mpt_gpt_config *config,
                                        uint64_t seed);

/* Copies the parameters of a GPT model built for `config` between the model and `flat`, the
 * parameters in llm.c's order (gpt_config.h: mpt_gpt_layout's offsets, layout.total floats of
 * host memory): file tensor k of layer l <-> parameter "h{l}.<name k>", one copy per tensor (on
 * a GPU on a stream of its own, synchronised before returning). to_model 1: flat -> model;
 * 0: model -> flat. The model is checked first (its parameters' names and sizes): a NULL
 * `flat` only checks. Does not change the model's generation. mpt_gpt_load and mpt_gpt_save
 * (gpt_file.h) are built on it. Errors: MPT_EINVAL (NULL model or config; the config, as
 * mpt_gpt_layout_compute); MPT_ESHAPE (the model is not a finalised GPT of `config`, `flat`
 * untouched); the errors of the device copies (the destination may then be partly written). */
MPT_API mpt_status mpt_gpt_params_copy(mpt_model *model, const mpt_gpt_config *config,
                                       float *flat, int to_model);

#ifdef __cplusplus
}
#endif

#endif /* MPITRAIN_TRANSFORMER_H */
