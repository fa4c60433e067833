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
 * Devices: the arithmetic is in core ops (mpitrain/ops_gpt.h) and mpt_op_gemm (OpenBLAS
 * cblas_sgemm on the CPU, cuBLAS on CUDA), enqueued on the tape's stream, so the ops run on
 * the model's device; MPT_ENOTSUP where that backend lacks a core op. Token and target ids are
 * range-checked on the CPU only (ops_gpt.h); the data loaders check them when they read. */
#ifndef MPITRAIN_TRANSFORMER_H
#define MPITRAIN_TRANSFORMER_H

#include "mpitrain/core.h"
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
 *   dx += rstd * (g - mean_c(g) - xhat * mean_c(g * xhat)),  g = dy * weight, xhat = (x - mean) * rstd
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

/* Causal multi-head self-attention (Vaswani et al., 2017) as GPT-2: qkv [B, T, 3C] is the output
 * of the qkv projection (q = channels [0, C), k = [C, 2C), v = [2C, 3C)); with n_head heads of
 * hs = C / n_head channels, for each b, head h and position t:
 *   att[b, h, t, t2] = softmax over t2 <= t of (q[b, t, h] . k[b, t2, h]) / sqrt(hs), 0 for t2 > t
 *   y[b, t, h*hs + i] = sum_t2 att[b, h, t, t2] v[b, t2, h*hs + i],   y [B, T, C].
 * A reference implementation: the scores are materialised ([B, H, T, T], saved for backward;
 * 4 B H T^2 bytes) and the products are GEMMs per (b, h) over blocks of rows that stop at the
 * diagonal (the part above it is never computed). Backward is the chain rule through
 * the softmax (datt = dy v^T; dpre = att * (datt - rowsum(att * datt)); dq += dpre k / sqrt(hs);
 * dk += dpre^T q / sqrt(hs); dv += att^T dy).
 * Errors: MPT_EINVAL (n_head < 1), MPT_ESHAPE (qkv not [B, T, 3C], or C not a multiple of
 * n_head), MPT_ENOTSUP. */
MPT_API mpt_status mpt_nn_causal_attention(mpt_tape *tape, mpt_var *qkv, int n_head,
                                           mpt_var **y);

/* Fused softmax cross-entropy over a (padded) vocabulary: logits [B, T, Vp] (or [N, Vp]),
 * targets int32 [B, T] (or [N]; on the model's device, valid until backward has run), each in
 * [0, vocab_size), vocab_size <= Vp. Only columns [0, vocab_size) take part in the softmax (the
 * padding columns get no probability and a zero gradient):
 *   loss = mean over the N = B*T positions of (logsumexp_{j < V} logits[n, j] - logits[n, target]),
 * a scalar in nats, summed in double. Saves logsumexp [N] only, and recomputes the
 * probabilities in backward: dlogits[n, j] += dloss / N * (p[n, j] - [j == target]) for j < V.
 * Errors: MPT_EINVAL (a target outside [0, vocab_size), naming its position, on the CPU;
 * vocab_size outside [1, Vp]), MPT_ESHAPE (targets' shape is not that of logits without its last dimension; no
 * position), MPT_ENOTSUP. */
MPT_API mpt_status mpt_nn_cross_entropy_vocab(mpt_tape *tape, mpt_var *logits,
                                              const mpt_tensor *targets, int64_t vocab_size,
                                              mpt_var **loss);

#ifdef __cplusplus
}
#endif

#endif /* MPITRAIN_TRANSFORMER_H */
