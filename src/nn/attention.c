/* Causal multi-head self-attention (include/mpitrain/transformer.h). On a float32 tape whose
 * backend has the fused op (mpt_op_causal_attention_available, ops_gpt.h: the CPU) the layer is
 * that op, which keeps only each row's softmax max and 1 / sum ([B, H, T, 2]) for backward
 * instead of the attention matrix, and gives the same bits as the reference below
 * (src/core/cpu/attn_cpu.c). Elsewhere (CUDA; bf16 tapes: attention_bf16.c), and for
 * mpt__causal_attention_reference (the tests' oracle) and with the environment variable
 * MPT_ATTENTION=reference (for side-by-side measurements), the reference version that materialises
 * the attention matrix [B, H, T, T]:
 *
 * For each sequence b and head h the q, k, v of the head are strided views into qkv [B, T, 3C]
 * (leading dimension 3C), and the output of the head is a strided view into y [B, T, C]
 * (leading dimension C), so every product is a GEMM through mpt_op_gemm without a copy:
 *   forward:  S = Q K^T * scale, A = rowwise softmax over t2 <= t (exactly 0 above the
 *             diagonal), Y_h = A V.
 *   backward: dA = dY_h V^T;  dV += A^T dY_h;  dS = A * (dA - rowsum(A * dA)) (0 above the
 *             diagonal, since A is);  dQ += scale dS K;  dK += scale dS^T Q.
 * Causality halves the work: the products run over blocks of BLOCK rows (or columns) and stop
 * at the diagonal block, so only the lower block triangle of the T x T matrices is computed
 * (5/8 of the full products at T = 256, 17/32 at T = 1024); what lies above it is never read:
 * the masked softmax and its backward write the zeros there. A is saved in the arena for
 * backward (4 B H T^2 bytes); dA / dS use one T x T scratch allocated per backward. The masked
 * softmax and its backward are core ops (ops_gpt.h); all work goes on the tape's stream. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mpitrain/ops.h"
#include "mpitrain/ops_bf16.h"
#include "mpitrain/ops_gpt.h"
#include "mpitrain/transformer.h"
#include "nn/gpt_ops.h"

/* Rows per block of the triangular products. */
#define BLOCK 64

typedef struct attn_ctx {
  const float *att; /* [B, H, T, T] softmax, 0 above the diagonal, in the arena */
  const float *stats; /* [B, H, T, 2] the fused op's row max and 1 / sum (att is NULL) */
  const uint16_t *x16, *a16; /* bf16 qkv, att (attention_bf16.c) when the products are bf16 */
  int64_t b, t, c, nh;
} attn_ctx;
_Static_assert(sizeof(attn_ctx) <= MPT_NODE_CTX_BYTES, "attn_ctx too large");

static mpt_status attn_backward(mpt_tape *tape, mpt_node *node) {
  const attn_ctx *k = mpt_node_ctx(node);
  mpt_var *qkv = mpt_node_input(node, 0);
  float *dqkv = NULL, *ds = NULL, beta = 1.0f;
  /* each element of dqkv gets exactly one product below: with beta 0 (dqkv new) it is written */
  MPT_RETURN_IF(mpt_var_grad_beta(tape, qkv, &dqkv, &beta));
  if (!dqkv) return MPT_OK;
  mpt_stream *s = mpt_tape_stream(tape);
  const int64_t nt = k->t, c = k->c, c3 = 3 * c, hs = c / k->nh;
  const float scale = (float)(1.0 / sqrt((double)hs));
  const float *dy = mpt_node_grad_output(node), *x = mpt_var_value(qkv)->data;
  if (k->stats)
    return mpt_op_causal_attention_backward(s, x, k->stats, dy, k->b, nt, c, k->nh, beta, dqkv);
  if (k->x16) return mpt__attn_backward_bf16(tape, k->x16, k->a16, k->att, dy, k->b, nt, c,
                                             k->nh, beta, dqkv);
  MPT_RETURN_IF(mpt_tape_alloc(tape, (size_t)(nt * nt) * sizeof(float), (void **)&ds));
  for (int64_t b = 0; b < k->b; b++)
    for (int64_t h = 0; h < k->nh; h++) {
      const float *q = x + b * nt * c3 + h * hs, *kk = q + c, *v = q + 2 * c;
      float *dq = dqkv + b * nt * c3 + h * hs, *dk = dq + c, *dv = dq + 2 * c;
      const float *a = k->att + (b * k->nh + h) * nt * nt, *g = dy + b * nt * c + h * hs;
      for (int64_t r0 = 0; r0 < nt; r0 += BLOCK) {
        const int64_t rows = nt - r0 < BLOCK ? nt - r0 : BLOCK, cols = r0 + rows;
        /* dA [rows, cols] = dY_h [rows, hs] V[0, cols)^T */
        MPT_RETURN_IF(mpt_op_gemm(s, 0, 1, rows, cols, hs, 1.0f, g + r0 * c, c, v, c3, 0.0f,
                                  ds + r0 * nt, nt));
        /* dV[r0, +rows) += A[r0.., r0, +rows)^T dY_h[r0..] (rows of A from the diagonal on) */
        MPT_RETURN_IF(mpt_op_gemm(s, 1, 0, rows, hs, nt - r0, 1.0f, a + r0 * nt + r0, nt,
                                  g + r0 * c, c, beta, dv + r0 * c3, c3));
      }
      /* dS = A * (dA - rowsum(A * dA)), 0 above the diagonal */
      MPT_RETURN_IF(mpt_op_causal_softmax_backward(s, a, ds, 1, nt));
      for (int64_t r0 = 0; r0 < nt; r0 += BLOCK) {
        const int64_t rows = nt - r0 < BLOCK ? nt - r0 : BLOCK, cols = r0 + rows;
        /* dQ[r0, +rows) += scale dS[rows, cols] K[0, cols) */
        MPT_RETURN_IF(mpt_op_gemm(s, 0, 0, rows, hs, cols, scale, ds + r0 * nt, nt, kk, c3,
                                  beta, dq + r0 * c3, c3));
        /* dK[r0, +rows) += scale dS[r0.., r0, +rows)^T Q[r0..] */
        MPT_RETURN_IF(mpt_op_gemm(s, 1, 0, rows, hs, nt - r0, scale, ds + r0 * nt + r0, nt,
                                  q + r0 * c3, c3, beta, dk + r0 * c3, c3));
      }
    }
  return MPT_OK;
}

/* 0 with MPT_ATTENTION=reference: the reference everywhere (to measure one against the other) */
static int fused_wanted(void) {
  const char *env = getenv("MPT_ATTENTION");
  return !(env && strcmp(env, "reference") == 0);
}

/* Whether attention() takes bf16 products / the fused op on this stream and precision. */
static int bf16_used(mpt_stream *s, mpt_precision precision) {
  return precision == MPT_PRECISION_BF16 && mpt_op_bf16_rounded_available(s);
}

static int fused_used(mpt_stream *s, mpt_precision precision, int fused) {
  return fused && !bf16_used(s, precision) && mpt_op_causal_attention_available(s);
}

/* The layer; `fused`: through mpt_op_causal_attention where the tape is float32 and the backend
 * has it. */
static mpt_status attention(mpt_tape *tape, mpt_var *qkv, int n_head, int fused, mpt_var **y) {
  static const char op[] = "causal_attention";
  if (!tape || !y) return MPT_FAIL(MPT_EINVAL, "%s: NULL tape or output", op);
  *y = NULL;
  MPT_RETURN_IF(mpt__gpt_check_var(op, "qkv", qkv));
  if (n_head < 1) return MPT_FAIL(MPT_EINVAL, "%s: n_head %d must be >= 1", op, n_head);
  const mpt_tensor *xt = mpt_var_value(qkv);
  char xs[128];
  if (xt->ndim != 3 || xt->shape[2] < 3 || xt->shape[2] % (3 * (int64_t)n_head) != 0)
    return MPT_FAIL(MPT_ESHAPE, "%s: qkv %s with %d heads (want [B, T, 3C], C a multiple of "
                    "the heads)", op, mpt_shape_str(xt->ndim, xt->shape, xs, sizeof xs), n_head);
  const int64_t nb = xt->shape[0], nt = xt->shape[1], c = xt->shape[2] / 3, c3 = 3 * c;
  const int64_t nh = n_head, hs = c / nh;
  const int64_t shape[3] = {nb, nt, c};
  mpt_var *o = NULL;
  float *att = NULL, *stats = NULL;
  mpt_stream *s = mpt_tape_stream(tape);
  MPT_RETURN_IF(mpt_tape_new_var(tape, 3, shape, MPT_F32, &o));
  const float scale = (float)(1.0 / sqrt((double)hs));
  const float *x = xt->data;
  float *out = mpt_var_value(o)->data;
  const uint16_t *x16 = NULL, *a16 = NULL;
  const int bf16 = bf16_used(s, mpt_tape_precision(tape));
  if (fused_used(s, mpt_tape_precision(tape), fused)) {
    MPT_RETURN_IF(mpt_tape_alloc(tape, (size_t)(nb * nh * nt * 2) * sizeof(float),
                                 (void **)&stats));
    MPT_RETURN_IF(mpt_op_causal_attention(s, x, nb, nt, c, nh, out, stats));
  } else {
    MPT_RETURN_IF(mpt_tape_alloc(tape, (size_t)(nb * nh * nt * nt) * sizeof(float),
                                 (void **)&att));
  }
  /* bf16 products where the backend takes bf16 operands (attention_bf16.c); else float32 */
  if (bf16) MPT_RETURN_IF(mpt__attn_forward_bf16(tape, x, nb, nt, c, nh, att, out, &x16, &a16));
  for (int64_t b = 0; att && !x16 && b < nb; b++)
    for (int64_t h = 0; h < nh; h++) {
      const float *q = x + b * nt * c3 + h * hs, *kk = q + c, *v = q + 2 * c;
      float *a = att + (b * nh + h) * nt * nt;
      /* S[r0, +rows) [rows, cols] = scale Q[r0, +rows) K[0, cols)^T, then the causal softmax */
      for (int64_t r0 = 0; r0 < nt; r0 += BLOCK) {
        const int64_t rows = nt - r0 < BLOCK ? nt - r0 : BLOCK, cols = r0 + rows;
        MPT_RETURN_IF(mpt_op_gemm(s, 0, 1, rows, cols, hs, scale, q + r0 * c3, c3, kk, c3, 0.0f,
                                  a + r0 * nt, nt));
      }
      MPT_RETURN_IF(mpt_op_causal_softmax(s, a, 1, nt));
      /* Y_h[r0, +rows) = A[rows, cols] V[0, cols) */
      for (int64_t r0 = 0; r0 < nt; r0 += BLOCK) {
        const int64_t rows = nt - r0 < BLOCK ? nt - r0 : BLOCK, cols = r0 + rows;
        MPT_RETURN_IF(mpt_op_gemm(s, 0, 0, rows, hs, cols, 1.0f, a + r0 * nt, nt, v, c3, 0.0f,
                                  out + (b * nt + r0) * c + h * hs, c));
      }
    }
  if (mpt_tape_needs_grad(tape, &qkv, 1)) {
    mpt_node *node = NULL;
    MPT_RETURN_IF(mpt_tape_record(tape, op, attn_backward, &qkv, 1, o, &node));
    *(attn_ctx *)mpt_node_ctx(node) =
        (attn_ctx){.att = att, .stats = stats, .x16 = x16, .a16 = a16, .b = nb, .t = nt,
                   .c = c, .nh = nh};
  }
  *y = o;
  return MPT_OK;
}

mpt_status mpt_nn_causal_attention(mpt_tape *tape, mpt_var *qkv, int n_head, mpt_var **y) {
  return attention(tape, qkv, n_head, fused_wanted(), y);
}

void mpt_nn_causal_attention_memory(mpt_stream *stream, mpt_precision precision, int64_t b,
                                    int64_t t, int64_t nh, int threads, double *saved,
                                    double *scratch) {
  const double rows = (double)b * (double)nh * (double)t;
  const int fused = fused_used(stream, precision, fused_wanted());
  double team = threads < 1 ? 1 : threads;
  if (team > (double)b * (double)nh) team = (double)b * (double)nh;
  if (saved) *saved = fused ? 8 * rows : 4 * rows * (double)t; /* stats [b, nh, t, 2] : att */
  if (scratch) *scratch = fused ? team * 8 * (double)t * (double)t : 0; /* 2 t^2 floats */
}

mpt_status mpt__causal_attention_reference(mpt_tape *tape, mpt_var *qkv, int n_head,
                                           mpt_var **y) {
  return attention(tape, qkv, n_head, 0, y);
}
