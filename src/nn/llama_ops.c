/* The Llama ops of include/mpitrain/llama.h: token embedding, RMSNorm, RoPE, the fused SwiGLU
 * layer and grouped-query causal attention. Written through the public op API
 * (mpitrain/autograd.h) as the GPT's ops are; the arithmetic is in the core ops
 * (mpitrain/ops_llama.h, ops_gpt.h, mpt_op_gemm_ex) on the tape's stream. The attention's
 * packing of q, k and v into the [B, T, 3C] input of mpt_nn_causal_attention, and its reverse,
 * are copies and sums on the host: the ops run on the CPU only (the core ops of ops_llama.h
 * exist there only), and refuse other devices with MPT_ENOTSUP. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mpitrain/autograd.h"
#include "mpitrain/llama.h"
#include "mpitrain/ops.h"
#include "mpitrain/ops_bf16.h"
#include "mpitrain/ops_gpt.h"
#include "mpitrain/ops_llama.h"
#include "mpitrain/transformer.h"

#define SHAPE(v, buf) mpt_shape_str(mpt_var_value(v)->ndim, mpt_var_value(v)->shape, buf, sizeof buf)
#define VAL(v) ((float *)mpt_var_value(v)->data)

/* MPT_EINVAL unless `v` is a float32 var with data. */
static mpt_status check_var(const char *op, const char *what, const mpt_var *v) {
  if (!v) return MPT_FAIL(MPT_EINVAL, "%s: %s is NULL", op, what);
  const mpt_tensor *t = mpt_var_value(v);
  if (t->dtype != MPT_F32)
    return MPT_FAIL(MPT_EINVAL, "%s: %s is %s, want float32", op, what, mpt_dtype_name(t->dtype));
  if (t->count > 0 && !t->data) return MPT_FAIL(MPT_EINVAL, "%s: %s has no data", op, what);
  return MPT_OK;
}

/* MPT_ENOTSUP unless `v` lives on the CPU (the ops whose host loops read it). */
static mpt_status check_cpu(const char *op, const mpt_var *v) {
  if (mpt_var_value(v)->device.type != MPT_DEVICE_CPU)
    return MPT_FAIL(MPT_ENOTSUP, "%s: not available on the cuda backend (the Llama ops run on "
                    "the CPU only)", op);
  return MPT_OK;
}

/* ---- token embedding ---- */

typedef struct embed_ctx {
  const int32_t *tokens; /* [B, T], the caller's */
  int64_t b, t, c, vocab;
} embed_ctx;
_Static_assert(sizeof(embed_ctx) <= MPT_NODE_CTX_BYTES, "embed_ctx too large");

static mpt_status embed_backward(mpt_tape *tape, mpt_node *node) {
  const embed_ctx *k = mpt_node_ctx(node);
  float *dw = NULL;
  MPT_RETURN_IF(mpt_var_grad_acc(tape, mpt_node_input(node, 0), &dw));
  if (!dw) return MPT_OK;
  return mpt_op_embedding_gpt_backward(mpt_tape_stream(tape), k->tokens, k->b, k->t, k->c,
                                       k->vocab, mpt_node_grad_output(node), dw, NULL);
}

mpt_status mpt_nn_embedding(mpt_tape *tape, const mpt_tensor *tokens, int64_t vocab_size,
                            mpt_var *weight, mpt_var **y) {
  static const char op[] = "embedding";
  if (!tape || !tokens || !y) return MPT_FAIL(MPT_EINVAL, "%s: NULL tape, tokens or output", op);
  *y = NULL;
  MPT_RETURN_IF(check_var(op, "weight", weight));
  const mpt_tensor *w = mpt_var_value(weight);
  char ts[128], ws[128];
  if (tokens->ndim != 2 || w->ndim != 2 || w->shape[1] < 1)
    return MPT_FAIL(MPT_ESHAPE, "%s: tokens %s, weight %s (want [B, T] and [V, C], C >= 1)", op,
                    mpt_shape_str(tokens->ndim, tokens->shape, ts, sizeof ts), SHAPE(weight, ws));
  if (vocab_size < 1 || vocab_size > w->shape[0])
    return MPT_FAIL(MPT_EINVAL, "%s: vocab_size %lld outside [1, %lld] (the rows of weight)", op,
                    (long long)vocab_size, (long long)w->shape[0]);
  if (tokens->dtype != MPT_I32)
    return MPT_FAIL(MPT_EINVAL, "%s: tokens are %s, want int32", op,
                    mpt_dtype_name(tokens->dtype));
  if (tokens->device.type != w->device.type)
    return MPT_FAIL(MPT_EINVAL, "%s: tokens are on another device than the weight", op);
  if (tokens->count > 0 && !tokens->data) return MPT_FAIL(MPT_EINVAL, "%s: tokens have no data", op);
  const int64_t nb = tokens->shape[0], nt = tokens->shape[1], c = w->shape[1];
  const int64_t shape[3] = {nb, nt, c};
  mpt_stream *s = mpt_tape_stream(tape);
  mpt_var *o = NULL;
  float *zeros = NULL; /* the GPT op's position table, all zero: y = weight[token] + 0 exactly */
  MPT_RETURN_IF(mpt_tape_new_var(tape, 3, shape, MPT_F32, &o));
  if (nb * nt > 0) {
    MPT_RETURN_IF(mpt_tape_scratch(tape, (size_t)(nt * c) * sizeof(float), (void **)&zeros));
    MPT_RETURN_IF(mpt_op_fill(s, zeros, nt * c, 0.0f));
    MPT_RETURN_IF(mpt_op_embedding_gpt(s, tokens->data, nb, nt, c, vocab_size, w->data, zeros,
                                       VAL(o)));
  }
  if (mpt_tape_needs_grad(tape, &weight, 1)) {
    mpt_node *node = NULL;
    MPT_RETURN_IF(mpt_tape_record(tape, op, embed_backward, &weight, 1, o, &node));
    *(embed_ctx *)mpt_node_ctx(node) =
        (embed_ctx){.tokens = tokens->data, .b = nb, .t = nt, .c = c, .vocab = vocab_size};
  }
  *y = o;
  return MPT_OK;
}

/* ---- RMSNorm ---- */

typedef struct rms_ctx {
  const float *rstd; /* [rows], in the arena */
  int64_t rows, c;
} rms_ctx;
_Static_assert(sizeof(rms_ctx) <= MPT_NODE_CTX_BYTES, "rms_ctx too large");

static mpt_status rms_backward(mpt_tape *tape, mpt_node *node) {
  const rms_ctx *k = mpt_node_ctx(node);
  mpt_var *x = mpt_node_input(node, 0), *w = mpt_node_input(node, 1);
  float *dx = NULL, *dw = NULL;
  MPT_RETURN_IF(mpt_var_grad_acc(tape, x, &dx));
  MPT_RETURN_IF(mpt_var_grad_acc(tape, w, &dw));
  return mpt_op_rmsnorm_backward(mpt_tape_stream(tape), mpt_node_grad_output(node), VAL(x),
                                 k->rows, k->c, VAL(w), k->rstd, dx, dw);
}

mpt_status mpt_nn_rmsnorm(mpt_tape *tape, mpt_var *x, mpt_var *weight, float eps, mpt_var **y) {
  static const char op[] = "rmsnorm";
  if (!tape || !y) return MPT_FAIL(MPT_EINVAL, "%s: NULL tape or output", op);
  *y = NULL;
  MPT_RETURN_IF(check_var(op, "x", x));
  MPT_RETURN_IF(check_var(op, "weight", weight));
  if (!(eps >= 0.0f) || !isfinite(eps))
    return MPT_FAIL(MPT_EINVAL, "%s: eps %g must be finite and >= 0", op, (double)eps);
  const mpt_tensor *xt = mpt_var_value(x), *wt = mpt_var_value(weight);
  char xs[128], ws[128];
  const int64_t c = xt->ndim >= 1 ? xt->shape[xt->ndim - 1] : 0;
  if (c < 1 || wt->ndim != 1 || wt->shape[0] != c)
    return MPT_FAIL(MPT_ESHAPE, "%s: x %s, weight %s (want [..., C] and [C], C >= 1)", op,
                    SHAPE(x, xs), SHAPE(weight, ws));
  const int64_t rows = xt->count / c;
  mpt_var *o = NULL;
  float *rstd = NULL;
  MPT_RETURN_IF(mpt_tape_new_var(tape, xt->ndim, xt->shape, MPT_F32, &o));
  MPT_RETURN_IF(mpt_tape_alloc(tape, (size_t)(rows > 0 ? rows : 1) * sizeof(float),
                               (void **)&rstd));
  MPT_RETURN_IF(mpt_op_rmsnorm(mpt_tape_stream(tape), xt->data, rows, c, wt->data, eps, VAL(o),
                               rstd));
  mpt_var *inputs[2] = {x, weight};
  if (mpt_tape_needs_grad(tape, inputs, 2)) {
    mpt_node *node = NULL;
    MPT_RETURN_IF(mpt_tape_record(tape, op, rms_backward, inputs, 2, o, &node));
    *(rms_ctx *)mpt_node_ctx(node) = (rms_ctx){.rstd = rstd, .rows = rows, .c = c};
  }
  *y = o;
  return MPT_OK;
}

/* ---- RoPE ---- */

typedef struct rope_ctx {
  int64_t b, t, heads, hd;
  float theta;
} rope_ctx;
_Static_assert(sizeof(rope_ctx) <= MPT_NODE_CTX_BYTES, "rope_ctx too large");

static mpt_status rope_backward(mpt_tape *tape, mpt_node *node) {
  const rope_ctx *k = mpt_node_ctx(node);
  float *dx = NULL, *tmp = NULL, beta = 1.0f;
  MPT_RETURN_IF(mpt_var_grad_beta(tape, mpt_node_input(node, 0), &dx, &beta));
  if (!dx) return MPT_OK;
  mpt_stream *s = mpt_tape_stream(tape);
  const int64_t n = k->b * k->t * k->heads * k->hd;
  if (beta == 0.0f) { /* dx is new: the rotated-back gradient is written into it */
    MPT_RETURN_IF(mpt_op_copy(s, dx, mpt_node_grad_output(node), n));
    return mpt_op_rope_backward(s, dx, k->b, k->t, k->heads, k->hd, k->theta);
  }
  MPT_RETURN_IF(mpt_tape_scratch(tape, (size_t)n * sizeof(float), (void **)&tmp));
  MPT_RETURN_IF(mpt_op_copy(s, tmp, mpt_node_grad_output(node), n));
  MPT_RETURN_IF(mpt_op_rope_backward(s, tmp, k->b, k->t, k->heads, k->hd, k->theta));
  return mpt_op_axpy(s, n, 1.0f, tmp, dx);
}

mpt_status mpt_nn_rope(mpt_tape *tape, mpt_var *x, int n_heads, float theta, mpt_var **y) {
  static const char op[] = "rope";
  if (!tape || !y) return MPT_FAIL(MPT_EINVAL, "%s: NULL tape or output", op);
  *y = NULL;
  MPT_RETURN_IF(check_var(op, "x", x));
  if (n_heads < 1) return MPT_FAIL(MPT_EINVAL, "%s: n_heads %d must be >= 1", op, n_heads);
  if (!isfinite(theta) || !(theta > 1.0f))
    return MPT_FAIL(MPT_EINVAL, "%s: theta %g must be finite and > 1", op, (double)theta);
  const mpt_tensor *xt = mpt_var_value(x);
  char xs[128];
  if (xt->ndim != 3 || xt->shape[2] % n_heads != 0 || (xt->shape[2] / n_heads) % 2 != 0 ||
      xt->shape[2] < 2)
    return MPT_FAIL(MPT_ESHAPE, "%s: x %s with %d heads (want [B, T, heads x hd], hd even and "
                    ">= 2)", op, SHAPE(x, xs), n_heads);
  MPT_RETURN_IF(check_cpu(op, x));
  const int64_t nb = xt->shape[0], nt = xt->shape[1], hd = xt->shape[2] / n_heads;
  mpt_stream *s = mpt_tape_stream(tape);
  mpt_var *o = NULL;
  MPT_RETURN_IF(mpt_tape_new_var(tape, 3, xt->shape, MPT_F32, &o));
  MPT_RETURN_IF(mpt_op_copy(s, VAL(o), xt->data, xt->count));
  MPT_RETURN_IF(mpt_op_rope(s, VAL(o), nb, nt, n_heads, hd, theta));
  if (mpt_tape_needs_grad(tape, &x, 1)) {
    mpt_node *node = NULL;
    MPT_RETURN_IF(mpt_tape_record(tape, op, rope_backward, &x, 1, o, &node));
    *(rope_ctx *)mpt_node_ctx(node) =
        (rope_ctx){.b = nb, .t = nt, .heads = n_heads, .hd = hd, .theta = theta};
  }
  *y = o;
  return MPT_OK;
}

/* ---- Linear + SwiGLU ---- */

typedef struct swiglu_ctx {
  const float *gu; /* [rows, 2f]: each row x Wg^T then x Wu^T, in the arena */
  int64_t rows, c, f;
  mpt_precision precision; /* of the forward: backward's products match */
} swiglu_ctx;
_Static_assert(sizeof(swiglu_ctx) <= MPT_NODE_CTX_BYTES, "swiglu_ctx too large");

static mpt_status swiglu_backward(mpt_tape *tape, mpt_node *node) {
  const swiglu_ctx *k = mpt_node_ctx(node);
  mpt_var *x = mpt_node_input(node, 0), *wg = mpt_node_input(node, 1),
          *wu = mpt_node_input(node, 2);
  mpt_stream *s = mpt_tape_stream(tape);
  const int64_t f = k->f, f2 = 2 * k->f, c = k->c;
  const float *dy = mpt_node_grad_output(node);
  float *dgu = NULL, *dx = NULL, *dwg = NULL, *dwu = NULL, beta_x = 1.0f;
  /* dG and dU [rows, 2f], zeroed (the core op accumulates), laid out as the forward's gu */
  MPT_RETURN_IF(mpt_tape_scratch(tape, (size_t)(k->rows * f2) * sizeof(float), (void **)&dgu));
  MPT_RETURN_IF(mpt_op_fill(s, dgu, k->rows * f2, 0.0f));
  for (int64_t r = 0; r < k->rows; r++) {
    const float *g = k->gu + r * f2;
    float *d = dgu + r * f2;
    MPT_RETURN_IF(mpt_op_swiglu_backward(s, dy + r * f, g, g + f, f, d, d + f));
  }
  MPT_RETURN_IF(mpt_var_grad_beta(tape, x, &dx, &beta_x));
  MPT_RETURN_IF(mpt_var_grad_acc(tape, wg, &dwg));
  MPT_RETURN_IF(mpt_var_grad_acc(tape, wu, &dwu));
  const float *g_w = VAL(wg), *u_w = VAL(wu);
  if (dx && u_w == g_w + f * c) { /* dx [rows, c] = beta_x dx + dGU [Wg; Wu] in one product */
    MPT_RETURN_IF(mpt_op_gemm_ex(s, k->precision, 0, 0, k->rows, c, f2, 1.0f, dgu, f2, g_w, c,
                                 beta_x, dx, c));
  } else if (dx) { /* dx = beta_x dx + dG Wg + dU Wu */
    MPT_RETURN_IF(mpt_op_gemm_ex(s, k->precision, 0, 0, k->rows, c, f, 1.0f, dgu, f2, g_w, c,
                                 beta_x, dx, c));
    MPT_RETURN_IF(mpt_op_gemm_ex(s, k->precision, 0, 0, k->rows, c, f, 1.0f, dgu + f, f2, u_w,
                                 c, 1.0f, dx, c));
  }
  if (dwg && dwu == dwg + f * c) /* [dWg; dWu] [2f, c] += dGU^T x in one product */
    return mpt_op_gemm_ex(s, k->precision, 1, 0, f2, c, k->rows, 1.0f, dgu, f2, VAL(x), c, 1.0f,
                          dwg, c);
  if (dwg) /* dWg [f, c] += dG^T x */
    MPT_RETURN_IF(mpt_op_gemm_ex(s, k->precision, 1, 0, f, c, k->rows, 1.0f, dgu, f2, VAL(x), c,
                                 1.0f, dwg, c));
  if (dwu) /* dWu += dU^T x */
    MPT_RETURN_IF(mpt_op_gemm_ex(s, k->precision, 1, 0, f, c, k->rows, 1.0f, dgu + f, f2,
                                 VAL(x), c, 1.0f, dwu, c));
  return MPT_OK;
}

mpt_status mpt_nn_linear_swiglu(mpt_tape *tape, mpt_var *x, mpt_var *w_gate, mpt_var *w_up,
                                mpt_var **y) {
  static const char op[] = "linear_swiglu";
  if (!tape || !y) return MPT_FAIL(MPT_EINVAL, "%s: NULL tape or output", op);
  *y = NULL;
  MPT_RETURN_IF(check_var(op, "x", x));
  MPT_RETURN_IF(check_var(op, "w_gate", w_gate));
  MPT_RETURN_IF(check_var(op, "w_up", w_up));
  const mpt_tensor *xt = mpt_var_value(x), *gt = mpt_var_value(w_gate), *ut = mpt_var_value(w_up);
  char xs[128], gs[128], us[128];
  const int64_t c = xt->ndim >= 1 ? xt->shape[xt->ndim - 1] : 0;
  if (c < 1 || gt->ndim != 2 || gt->shape[1] != c || gt->shape[0] < 1 || ut->ndim != 2 ||
      ut->shape[0] != gt->shape[0] || ut->shape[1] != c)
    return MPT_FAIL(MPT_ESHAPE, "%s: x %s, w_gate %s, w_up %s (want [..., C], [F, C], [F, C])",
                    op, SHAPE(x, xs), SHAPE(w_gate, gs), SHAPE(w_up, us));
  MPT_RETURN_IF(check_cpu(op, x));
  const int64_t f = gt->shape[0], f2 = 2 * f, rows = xt->count / c;
  int64_t shape[MPT_MAX_DIMS];
  memcpy(shape, xt->shape, sizeof shape);
  shape[xt->ndim - 1] = f;
  mpt_stream *s = mpt_tape_stream(tape);
  const mpt_precision pr = mpt_tape_precision(tape);
  const float *g_w = gt->data, *u_w = ut->data;
  mpt_var *o = NULL;
  float *gu = NULL;
  MPT_RETURN_IF(mpt_tape_new_var(tape, xt->ndim, shape, MPT_F32, &o));
  MPT_RETURN_IF(mpt_tape_alloc(tape, (size_t)(rows > 0 ? rows * f2 : 1) * sizeof(float),
                               (void **)&gu));
  if (rows > 0 && u_w == g_w + f * c) { /* the weights adjacent (the model's): one product */
    MPT_RETURN_IF(mpt_op_gemm_ex(s, pr, 0, 1, rows, f2, c, 1.0f, xt->data, c, g_w, c, 0.0f, gu,
                                 f2));
  } else if (rows > 0) {
    MPT_RETURN_IF(mpt_op_gemm_ex(s, pr, 0, 1, rows, f, c, 1.0f, xt->data, c, g_w, c, 0.0f, gu,
                                 f2));
    MPT_RETURN_IF(mpt_op_gemm_ex(s, pr, 0, 1, rows, f, c, 1.0f, xt->data, c, u_w, c, 0.0f,
                                 gu + f, f2));
  }
  float *yv = VAL(o);
  for (int64_t r = 0; r < rows; r++)
    MPT_RETURN_IF(mpt_op_swiglu(s, yv + r * f, gu + r * f2, gu + r * f2 + f, f));
  mpt_var *inputs[3] = {x, w_gate, w_up};
  if (mpt_tape_needs_grad(tape, inputs, 3)) {
    mpt_node *node = NULL;
    MPT_RETURN_IF(mpt_tape_record(tape, op, swiglu_backward, inputs, 3, o, &node));
    *(swiglu_ctx *)mpt_node_ctx(node) =
        (swiglu_ctx){.gu = gu, .rows = rows, .c = c, .f = f, .precision = pr};
  }
  *y = o;
  return MPT_OK;
}

/* ---- grouped-query attention: the pack of q, k, v, then mpt_nn_causal_attention ---- */

typedef struct pack_ctx {
  int64_t b, t, nh, nkv, hd;
  float theta; /* 0: no RoPE */
  mpt_rope_scaling scaling; /* its frequencies' scaling (type MPT_ROPE_DEFAULT: none) */
  /* mpt_nn_llama_attention only: the input's channels and the products' precision */
  int64_t cx;
  mpt_precision precision;
} pack_ctx;
_Static_assert(sizeof(pack_ctx) <= MPT_NODE_CTX_BYTES, "pack_ctx too large");

/* The gradient of one packed part: into g (rows of `ld` floats, the part's heads x hd first)
 * the sum of the n_rep copies of each head of the part at channel `off` of dp [rows, 3C]
 * (heads x n_rep = nh). */
static void unpack_sum(const float *dp, int64_t rows, int64_t c, int64_t off, int64_t heads,
                       int64_t n_rep, int64_t hd, float *g, int64_t ld) {
  for (int64_t r = 0; r < rows; r++) {
    const float *src = dp + r * 3 * c + off;
    float *dst = g + r * ld;
    for (int64_t h = 0; h < heads; h++) {
      const float *s0 = src + h * n_rep * hd;
      float *d = dst + h * hd;
      memcpy(d, s0, (size_t)hd * sizeof(float));
      for (int64_t j = 1; j < n_rep; j++)
        for (int64_t i = 0; i < hd; i++) d[i] += s0[j * hd + i];
    }
  }
}

/* Writes the part `src` (rows of `ld` floats, the part's heads x hd first) into channel `off`
 * of p [rows, 3C], each head repeated n_rep times (heads x n_rep = C / hd). */
static void pack_part(const float *src, int64_t ld, int64_t rows, int64_t c, int64_t off,
                      int64_t heads, int64_t n_rep, int64_t hd, float *p) {
  for (int64_t r = 0; r < rows; r++) {
    const float *sr = src + r * ld;
    float *dst = p + r * 3 * c + off;
    for (int64_t h = 0; h < heads; h++)
      for (int64_t j = 0; j < n_rep; j++)
        memcpy(dst + (h * n_rep + j) * hd, sr + h * hd, (size_t)hd * sizeof(float));
  }
}

/* Copies `width` columns of each of `rows` rows between two row strides. */
static void copy_cols(float *dst, int64_t ldd, const float *src, int64_t lds, int64_t rows,
                      int64_t width) {
  for (int64_t r = 0; r < rows; r++)
    memcpy(dst + r * ldd, src + r * lds, (size_t)width * sizeof(float));
}

/* RoPE (inverse 1: its backward) on x [b, t, heads, hd] with the pack's theta and scaling:
 * the unscaled op, or the scaled inverse frequencies' one. */
static mpt_status pack_rope(mpt_tape *tape, const pack_ctx *k, float *x, int64_t heads,
                            int inverse) {
  mpt_stream *s = mpt_tape_stream(tape);
  if (k->scaling.type == MPT_ROPE_DEFAULT)
    return inverse ? mpt_op_rope_backward(s, x, k->b, k->t, heads, k->hd, k->theta)
                   : mpt_op_rope(s, x, k->b, k->t, heads, k->hd, k->theta);
  float *f = malloc((size_t)(k->hd / 2) * sizeof *f);
  if (!f) return MPT_FAIL(MPT_ENOMEM, "rope: %lld frequencies", (long long)(k->hd / 2));
  mpt_status st = mpt_rope_inv_freq(k->hd, k->theta, &k->scaling, f);
  if (st == MPT_OK)
    st = inverse ? mpt_op_rope_freqs_backward(s, x, k->b, k->t, heads, k->hd, f)
                 : mpt_op_rope_freqs(s, x, k->b, k->t, heads, k->hd, f);
  free(f);
  return st;
}

/* The forward's pack of q, k, v (each rows of its own stride: ldq, ldk, ldv) into p; with RoPE
 * q and k are rotated in `tmp` (rows x H hd floats) first. */
static mpt_status pack_all(mpt_tape *tape, const pack_ctx *k, const float *q, int64_t ldq,
                           const float *kk, int64_t ldk, const float *v, int64_t ldv, float *tmp,
                           float *p) {
  const int64_t rows = k->b * k->t, c = k->nh * k->hd, ckv = k->nkv * k->hd;
  const int64_t n_rep = k->nh / k->nkv;
  if (k->theta > 0.0f) {
    copy_cols(tmp, c, q, ldq, rows, c);
    MPT_RETURN_IF(pack_rope(tape, k, tmp, k->nh, 0));
    pack_part(tmp, c, rows, c, 0, k->nh, 1, k->hd, p);
    copy_cols(tmp, ckv, kk, ldk, rows, ckv);
    MPT_RETURN_IF(pack_rope(tape, k, tmp, k->nkv, 0));
    pack_part(tmp, ckv, rows, c, c, k->nkv, n_rep, k->hd, p);
  } else {
    pack_part(q, ldq, rows, c, 0, k->nh, 1, k->hd, p);
    pack_part(kk, ldk, rows, c, c, k->nkv, n_rep, k->hd, p);
  }
  pack_part(v, ldv, rows, c, 2 * c, k->nkv, n_rep, k->hd, p);
  return MPT_OK;
}

/* The gradient of part `which` (0 q, 1 k, 2 v) from dp, rotated back for q and k, into g (rows
 * of `ld` floats). */
static mpt_status unpack_part(mpt_tape *tape, const pack_ctx *k, const float *dp, int which,
                              float *g, int64_t ld) {
  const int64_t c = k->nh * k->hd, heads = which ? k->nkv : k->nh;
  unpack_sum(dp, k->b * k->t, c, which * c, heads, k->nh / heads, k->hd, g, ld);
  if (which == 2 || k->theta <= 0.0f) return MPT_OK;
  if (ld == heads * k->hd) /* contiguous: rotated in place */
    return pack_rope(tape, k, g, heads, 1);
  return MPT_FAIL(MPT_ESTATE, "gqa: a strided part to rotate back"); /* not reached */
}

/* Adds (or writes, beta 0) the part's gradient into its input's. */
static mpt_status pack_part_backward(mpt_tape *tape, const pack_ctx *k, mpt_var *in,
                                     const float *dp, int which) {
  float *din = NULL, *g = NULL, beta = 1.0f;
  MPT_RETURN_IF(mpt_var_grad_beta(tape, in, &din, &beta));
  if (!din) return MPT_OK;
  const int64_t heads = which ? k->nkv : k->nh, n = k->b * k->t * heads * k->hd;
  if (beta == 0.0f) {
    g = din; /* new storage: written whole here */
  } else {
    MPT_RETURN_IF(mpt_tape_scratch(tape, (size_t)n * sizeof(float), (void **)&g));
  }
  MPT_RETURN_IF(unpack_part(tape, k, dp, which, g, heads * k->hd));
  return g == din ? MPT_OK : mpt_op_axpy(mpt_tape_stream(tape), n, 1.0f, g, din);
}

static mpt_status pack_backward(mpt_tape *tape, mpt_node *node) {
  const pack_ctx *k = mpt_node_ctx(node);
  const float *dp = mpt_node_grad_output(node);
  for (int which = 0; which < 3; which++)
    MPT_RETURN_IF(pack_part_backward(tape, k, mpt_node_input(node, which), dp, which));
  return MPT_OK;
}

/* The checks of both attention ops: q's channels c (H hd), and k's and v's (KV hd) from the
 * heads; rope_theta 0 or > 1; hd even with RoPE. */
static mpt_status gqa_check_heads(const char *op, int n_heads, int n_kv_heads, float rope_theta,
                                  const mpt_rope_scaling *scaling) {
  if (n_heads < 1 || n_kv_heads < 1 || n_heads % n_kv_heads != 0)
    return MPT_FAIL(MPT_EINVAL, "%s: n_heads %d is not a positive multiple of n_kv_heads %d",
                    op, n_heads, n_kv_heads);
  if (rope_theta != 0.0f && (!isfinite(rope_theta) || !(rope_theta > 1.0f)))
    return MPT_FAIL(MPT_EINVAL, "%s: rope_theta %g must be 0 (no RoPE) or finite and > 1", op,
                    (double)rope_theta);
  return mpt_rope_scaling_check(scaling);
}

mpt_status mpt_nn_gqa_attention(mpt_tape *tape, mpt_var *q, mpt_var *k, mpt_var *v,
                                int n_heads, int n_kv_heads, float rope_theta, mpt_var **y) {
  return mpt_nn_gqa_attention_scaled(tape, q, k, v, n_heads, n_kv_heads, rope_theta, NULL, y);
}

mpt_status mpt_nn_gqa_attention_scaled(mpt_tape *tape, mpt_var *q, mpt_var *k, mpt_var *v,
                                       int n_heads, int n_kv_heads, float rope_theta,
                                       const mpt_rope_scaling *scaling, mpt_var **y) {
  static const char op[] = "gqa_attention";
  if (!tape || !y) return MPT_FAIL(MPT_EINVAL, "%s: NULL tape or output", op);
  *y = NULL;
  MPT_RETURN_IF(check_var(op, "q", q));
  MPT_RETURN_IF(check_var(op, "k", k));
  MPT_RETURN_IF(check_var(op, "v", v));
  MPT_RETURN_IF(gqa_check_heads(op, n_heads, n_kv_heads, rope_theta, scaling));
  const int rope = rope_theta != 0.0f;
  const mpt_tensor *qt = mpt_var_value(q), *kt = mpt_var_value(k), *vt = mpt_var_value(v);
  char qs[128], ks[128], vs[128];
  const int64_t c = qt->ndim == 3 ? qt->shape[2] : 0, hd = c / n_heads;
  int ok = qt->ndim == 3 && c >= 1 && c % n_heads == 0 && (!rope || hd % 2 == 0);
  for (int i = 0; ok && i < 2; i++) {
    const mpt_tensor *t = i ? vt : kt;
    ok = t->ndim == 3 && t->shape[0] == qt->shape[0] && t->shape[1] == qt->shape[1] &&
         t->shape[2] == n_kv_heads * hd;
  }
  if (!ok)
    return MPT_FAIL(MPT_ESHAPE, "%s: q %s, k %s, v %s with %d heads and %d key/value heads "
                    "(want [B, T, H hd], [B, T, KV hd], [B, T, KV hd]%s)", op, SHAPE(q, qs),
                    SHAPE(k, ks), SHAPE(v, vs), n_heads, n_kv_heads,
                    rope ? ", hd even" : "");
  MPT_RETURN_IF(check_cpu(op, q));
  const int64_t nb = qt->shape[0], nt = qt->shape[1], rows = nb * nt, ckv = n_kv_heads * hd;
  const int64_t shape[3] = {nb, nt, 3 * c};
  const pack_ctx pc = {.b = nb, .t = nt, .nh = n_heads, .nkv = n_kv_heads, .hd = hd,
                       .theta = rope ? rope_theta : 0.0f,
                       .scaling = rope && scaling ? *scaling : (mpt_rope_scaling){0}};
  mpt_var *p = NULL;
  float *tmp = NULL;
  MPT_RETURN_IF(mpt_tape_new_var(tape, 3, shape, MPT_F32, &p));
  if (rows > 0) {
    if (rope)
      MPT_RETURN_IF(mpt_tape_scratch(tape, (size_t)(rows * c) * sizeof(float), (void **)&tmp));
    MPT_RETURN_IF(pack_all(tape, &pc, qt->data, c, kt->data, ckv, vt->data, ckv, tmp, VAL(p)));
  }
  mpt_var *inputs[3] = {q, k, v};
  if (mpt_tape_needs_grad(tape, inputs, 3)) {
    mpt_node *node = NULL;
    MPT_RETURN_IF(mpt_tape_record(tape, "gqa_pack", pack_backward, inputs, 3, p, &node));
    *(pack_ctx *)mpt_node_ctx(node) = pc;
  }
  return mpt_nn_causal_attention(tape, p, n_heads, y);
}

/* ---- the attention with its projections ---- */

static mpt_status qkv_backward(mpt_tape *tape, mpt_node *node) {
  const pack_ctx *k = mpt_node_ctx(node);
  mpt_var *x = mpt_node_input(node, 0), *w[3];
  for (int i = 0; i < 3; i++) w[i] = mpt_node_input(node, 1 + i);
  mpt_stream *s = mpt_tape_stream(tape);
  const int64_t rows = k->b * k->t, cq = k->nh * k->hd, ckv = k->nkv * k->hd;
  const int64_t n_all = cq + 2 * ckv, cx = k->cx;
  const int64_t off[3] = {0, cq, cq + ckv}, width[3] = {cq, ckv, ckv};
  const float *dp = mpt_node_grad_output(node);
  float *dqkv = NULL, *tmp = NULL, *dx = NULL, *dw[3] = {NULL, NULL, NULL}, beta_x = 1.0f;
  /* dqkv [rows, n_all] (the products' layout), and a contiguous part to rotate back */
  MPT_RETURN_IF(mpt_tape_scratch(tape, (size_t)(rows * (n_all + cq)) * sizeof(float),
                                 (void **)&dqkv));
  tmp = dqkv + rows * n_all;
  for (int which = 0; which < 3; which++) {
    if (which == 2 || k->theta <= 0.0f) {
      unpack_sum(dp, rows, cq, which * cq, which ? k->nkv : k->nh, which ? k->nh / k->nkv : 1,
                 k->hd, dqkv + off[which], n_all);
    } else {
      MPT_RETURN_IF(unpack_part(tape, k, dp, which, tmp, width[which]));
      copy_cols(dqkv + off[which], n_all, tmp, width[which], rows, width[which]);
    }
  }
  const float *w0 = VAL(w[0]);
  const int adjacent = VAL(w[1]) == w0 + cq * cx && VAL(w[2]) == VAL(w[1]) + ckv * cx;
  MPT_RETURN_IF(mpt_var_grad_beta(tape, x, &dx, &beta_x));
  if (dx && adjacent) { /* dx [rows, cx] = beta_x dx + dQKV [Wq; Wk; Wv] in one product */
    MPT_RETURN_IF(mpt_op_gemm_ex(s, k->precision, 0, 0, rows, cx, n_all, 1.0f, dqkv, n_all, w0,
                                 cx, beta_x, dx, cx));
  } else if (dx) {
    for (int i = 0; i < 3; i++)
      MPT_RETURN_IF(mpt_op_gemm_ex(s, k->precision, 0, 0, rows, cx, width[i], 1.0f,
                                   dqkv + off[i], n_all, VAL(w[i]), cx, i ? 1.0f : beta_x, dx,
                                   cx));
  }
  for (int i = 0; i < 3; i++) MPT_RETURN_IF(mpt_var_grad_acc(tape, w[i], &dw[i]));
  if (dw[0] && dw[1] == dw[0] + cq * cx && dw[2] == dw[1] + ckv * cx) /* one product */
    return mpt_op_gemm_ex(s, k->precision, 1, 0, n_all, cx, rows, 1.0f, dqkv, n_all, VAL(x), cx,
                          1.0f, dw[0], cx);
  for (int i = 0; i < 3; i++) /* dW_i [width_i, cx] += dPart^T x */
    if (dw[i])
      MPT_RETURN_IF(mpt_op_gemm_ex(s, k->precision, 1, 0, width[i], cx, rows, 1.0f,
                                   dqkv + off[i], n_all, VAL(x), cx, 1.0f, dw[i], cx));
  return MPT_OK;
}

mpt_status mpt_nn_llama_attention(mpt_tape *tape, mpt_var *x, mpt_var *wq, mpt_var *wk,
                                  mpt_var *wv, int n_heads, int n_kv_heads, float rope_theta,
                                  mpt_var **y) {
  return mpt_nn_llama_attention_scaled(tape, x, wq, wk, wv, n_heads, n_kv_heads, rope_theta, NULL,
                                       y);
}

mpt_status mpt_nn_llama_attention_scaled(mpt_tape *tape, mpt_var *x, mpt_var *wq, mpt_var *wk,
                                         mpt_var *wv, int n_heads, int n_kv_heads,
                                         float rope_theta, const mpt_rope_scaling *scaling,
                                         mpt_var **y) {
  static const char op[] = "llama_attention";
  if (!tape || !y) return MPT_FAIL(MPT_EINVAL, "%s: NULL tape or output", op);
  *y = NULL;
  MPT_RETURN_IF(check_var(op, "x", x));
  MPT_RETURN_IF(check_var(op, "wq", wq));
  MPT_RETURN_IF(check_var(op, "wk", wk));
  MPT_RETURN_IF(check_var(op, "wv", wv));
  MPT_RETURN_IF(gqa_check_heads(op, n_heads, n_kv_heads, rope_theta, scaling));
  const int rope = rope_theta != 0.0f;
  const mpt_tensor *xt = mpt_var_value(x), *w[3] = {mpt_var_value(wq), mpt_var_value(wk),
                                                     mpt_var_value(wv)};
  char xs[128], qs[128], ks[128], vs[128];
  const int64_t cx = xt->ndim == 3 ? xt->shape[2] : 0;
  const int64_t cq = w[0]->ndim == 2 ? w[0]->shape[0] : 0, hd = cq / n_heads;
  int ok = xt->ndim == 3 && cx >= 1 && cq >= 1 && cq % n_heads == 0 && (!rope || hd % 2 == 0);
  for (int i = 0; ok && i < 3; i++)
    ok = w[i]->ndim == 2 && w[i]->shape[1] == cx && w[i]->shape[0] == (i ? n_kv_heads * hd : cq);
  if (!ok)
    return MPT_FAIL(MPT_ESHAPE, "%s: x %s, wq %s, wk %s, wv %s with %d heads and %d key/value "
                    "heads (want [B, T, C], [H hd, C], [KV hd, C], [KV hd, C]%s)", op,
                    SHAPE(x, xs), SHAPE(wq, qs), SHAPE(wk, ks), SHAPE(wv, vs), n_heads,
                    n_kv_heads, rope ? ", hd even" : "");
  MPT_RETURN_IF(check_cpu(op, x));
  const int64_t nb = xt->shape[0], nt = xt->shape[1], rows = nb * nt, ckv = n_kv_heads * hd;
  const int64_t n_all = cq + 2 * ckv;
  const int64_t shape[3] = {nb, nt, 3 * cq};
  mpt_stream *s = mpt_tape_stream(tape);
  const mpt_precision pr = mpt_tape_precision(tape);
  const pack_ctx pc = {.b = nb, .t = nt, .nh = n_heads, .nkv = n_kv_heads, .hd = hd,
                       .theta = rope ? rope_theta : 0.0f,
                       .scaling = rope && scaling ? *scaling : (mpt_rope_scaling){0},
                       .cx = cx, .precision = pr};
  mpt_var *p = NULL;
  float *qkv = NULL;
  MPT_RETURN_IF(mpt_tape_new_var(tape, 3, shape, MPT_F32, &p));
  if (rows > 0) {
    /* the products [rows, n_all] (q, k, v side by side), then a part to rotate */
    MPT_RETURN_IF(mpt_tape_scratch(tape, (size_t)(rows * (n_all + cq)) * sizeof(float),
                                   (void **)&qkv));
    const float *w0 = w[0]->data;
    if (w[1]->data == w0 + cq * cx && w[2]->data == (const float *)w[1]->data + ckv * cx) {
      /* adjacent weights (the model's): one product over [Wq; Wk; Wv], as the GPT's qkv */
      MPT_RETURN_IF(mpt_op_gemm_ex(s, pr, 0, 1, rows, n_all, cx, 1.0f, xt->data, cx, w0, cx,
                                   0.0f, qkv, n_all));
    } else {
      const int64_t off[3] = {0, cq, cq + ckv}, width[3] = {cq, ckv, ckv};
      for (int i = 0; i < 3; i++)
        MPT_RETURN_IF(mpt_op_gemm_ex(s, pr, 0, 1, rows, width[i], cx, 1.0f, xt->data, cx,
                                     w[i]->data, cx, 0.0f, qkv + off[i], n_all));
    }
    MPT_RETURN_IF(pack_all(tape, &pc, qkv, n_all, qkv + cq, n_all, qkv + cq + ckv, n_all,
                           qkv + rows * n_all, VAL(p)));
  }
  mpt_var *inputs[4] = {x, wq, wk, wv};
  if (mpt_tape_needs_grad(tape, inputs, 4)) {
    mpt_node *node = NULL;
    MPT_RETURN_IF(mpt_tape_record(tape, op, qkv_backward, inputs, 4, p, &node));
    *(pack_ctx *)mpt_node_ctx(node) = pc;
  }
  return mpt_nn_causal_attention(tape, p, n_heads, y);
}
