/* The GPT-2 ops of include/mpitrain/transformer.h other than attention (src/nn/attention.c):
 * token + position embedding, LayerNorm, GELU, Linear over the last dimension, and the fused
 * softmax cross-entropy over a padded vocabulary. Written through the public op API
 * (mpitrain/autograd.h) like the built-in ops; the arithmetic is in the core ops
 * (mpitrain/ops_gpt.h, mpt_op_gemm), enqueued on the tape's stream, so these ops run on every
 * backend that has them (the CPU's are the reference: src/core/cpu/gpt_cpu.c). Backward
 * functions ACCUMULATE (+=) into their inputs' gradients, or write them (beta 0) when they are
 * the first to produce one (mpt_var_grad_beta: no zero-fill). */
#include <math.h>
#include <string.h>

#include "mpitrain/ops.h"
#include "mpitrain/ops_bf16.h"
#include "mpitrain/ops_gpt.h"
#include "mpitrain/transformer.h"
#include "nn/gpt_ops.h"

#define SHAPE(v, buf) mpt_shape_str(mpt_var_value(v)->ndim, mpt_var_value(v)->shape, buf, sizeof buf)
#define VAL(v) ((float *)mpt_var_value(v)->data)

mpt_status mpt__gpt_check_var(const char *op, const char *what, const mpt_var *v) {
  if (!v) return MPT_FAIL(MPT_EINVAL, "%s: %s is NULL", op, what);
  const mpt_tensor *t = mpt_var_value(v);
  if (t->dtype != MPT_F32)
    return MPT_FAIL(MPT_EINVAL, "%s: %s is %s, want float32", op, what, mpt_dtype_name(t->dtype));
  if (t->count > 0 && !t->data) return MPT_FAIL(MPT_EINVAL, "%s: %s has no data", op, what);
  return MPT_OK;
}

/* An int32 index tensor (tokens, targets) with data on `like`'s device. Its range is checked
 * by the core op (on the CPU; see ops_gpt.h). */
static mpt_status check_indices(const char *op, const char *what, const mpt_tensor *t,
                                const mpt_var *like) {
  if (t->dtype != MPT_I32)
    return MPT_FAIL(MPT_EINVAL, "%s: %s are %s, want int32", op, what, mpt_dtype_name(t->dtype));
  if (t->device.type != mpt_var_value(like)->device.type)
    return MPT_FAIL(MPT_EINVAL, "%s: %s are on another device than the values", op, what);
  if (t->count > 0 && !t->data) return MPT_FAIL(MPT_EINVAL, "%s: %s have no data", op, what);
  return MPT_OK;
}

/* ---- token + position embedding ---- */

typedef struct embed_ctx {
  const int32_t *tokens; /* [B, T], the caller's */
  int64_t b, t, c, vocab;
} embed_ctx;
_Static_assert(sizeof(embed_ctx) <= MPT_NODE_CTX_BYTES, "embed_ctx too large");

static mpt_status embed_backward(mpt_tape *tape, mpt_node *node) {
  const embed_ctx *k = mpt_node_ctx(node);
  float *dwte = NULL, *dwpe = NULL;
  MPT_RETURN_IF(mpt_var_grad_acc(tape, mpt_node_input(node, 0), &dwte));
  MPT_RETURN_IF(mpt_var_grad_acc(tape, mpt_node_input(node, 1), &dwpe));
  return mpt_op_embedding_gpt_backward(mpt_tape_stream(tape), k->tokens, k->b, k->t, k->c,
                                       k->vocab, mpt_node_grad_output(node), dwte, dwpe);
}

mpt_status mpt_nn_embedding_gpt(mpt_tape *tape, const mpt_tensor *tokens, int64_t vocab_size,
                                mpt_var *wte, mpt_var *wpe, mpt_var **y) {
  static const char op[] = "embedding_gpt";
  if (!tape || !tokens || !y) return MPT_FAIL(MPT_EINVAL, "%s: NULL tape, tokens or output", op);
  *y = NULL;
  MPT_RETURN_IF(mpt__gpt_check_var(op, "wte", wte));
  MPT_RETURN_IF(mpt__gpt_check_var(op, "wpe", wpe));
  const mpt_tensor *e = mpt_var_value(wte), *p = mpt_var_value(wpe);
  char ts[128], es[128], ps[128];
  if (tokens->ndim != 2 || e->ndim != 2 || p->ndim != 2 || e->shape[1] != p->shape[1] ||
      tokens->shape[1] > p->shape[0] || e->shape[1] < 1)
    return MPT_FAIL(MPT_ESHAPE, "%s: tokens %s, wte %s, wpe %s (want [B, T], [Vp, C], [maxT, C] "
                    "with T <= maxT, C >= 1)", op,
                    mpt_shape_str(tokens->ndim, tokens->shape, ts, sizeof ts), SHAPE(wte, es),
                    SHAPE(wpe, ps));
  if (vocab_size < 1 || vocab_size > e->shape[0])
    return MPT_FAIL(MPT_EINVAL, "%s: vocab_size %lld outside [1, %lld] (the rows of wte)", op,
                    (long long)vocab_size, (long long)e->shape[0]);
  MPT_RETURN_IF(check_indices(op, "tokens", tokens, wte));
  const int64_t nb = tokens->shape[0], nt = tokens->shape[1], c = e->shape[1];
  const int64_t shape[3] = {nb, nt, c};
  mpt_var *o = NULL;
  MPT_RETURN_IF(mpt_tape_new_var(tape, 3, shape, MPT_F32, &o));
  MPT_RETURN_IF(mpt_op_embedding_gpt(mpt_tape_stream(tape), tokens->data, nb, nt, c, vocab_size,
                                     e->data, p->data, VAL(o)));
  mpt_var *inputs[2] = {wte, wpe};
  if (mpt_tape_needs_grad(tape, inputs, 2)) {
    mpt_node *node = NULL;
    MPT_RETURN_IF(mpt_tape_record(tape, op, embed_backward, inputs, 2, o, &node));
    *(embed_ctx *)mpt_node_ctx(node) =
        (embed_ctx){.tokens = tokens->data, .b = nb, .t = nt, .c = c, .vocab = vocab_size};
  }
  *y = o;
  return MPT_OK;
}

/* ---- LayerNorm ---- */

typedef struct ln_ctx {
  const float *mean, *rstd; /* [rows], in the arena */
  int64_t rows, c;
} ln_ctx;
_Static_assert(sizeof(ln_ctx) <= MPT_NODE_CTX_BYTES, "ln_ctx too large");

static mpt_status ln_backward(mpt_tape *tape, mpt_node *node) {
  const ln_ctx *k = mpt_node_ctx(node);
  mpt_var *x = mpt_node_input(node, 0), *w = mpt_node_input(node, 1), *bias = mpt_node_input(node, 2);
  float *dx = NULL, *dw = NULL, *db = NULL;
  MPT_RETURN_IF(mpt_var_grad_acc(tape, x, &dx));
  MPT_RETURN_IF(mpt_var_grad_acc(tape, w, &dw));
  MPT_RETURN_IF(mpt_var_grad_acc(tape, bias, &db));
  return mpt_op_layernorm_backward(mpt_tape_stream(tape), mpt_node_grad_output(node), VAL(x),
                                   k->rows, k->c, VAL(w), k->mean, k->rstd, dx, dw, db);
}

mpt_status mpt_nn_layernorm(mpt_tape *tape, mpt_var *x, mpt_var *weight, mpt_var *bias,
                            float eps, mpt_var **y) {
  static const char op[] = "layernorm";
  if (!tape || !y) return MPT_FAIL(MPT_EINVAL, "%s: NULL tape or output", op);
  *y = NULL;
  MPT_RETURN_IF(mpt__gpt_check_var(op, "x", x));
  MPT_RETURN_IF(mpt__gpt_check_var(op, "weight", weight));
  MPT_RETURN_IF(mpt__gpt_check_var(op, "bias", bias));
  if (!(eps >= 0.0f) || !isfinite(eps))
    return MPT_FAIL(MPT_EINVAL, "%s: eps %g must be finite and >= 0", op, (double)eps);
  const mpt_tensor *xt = mpt_var_value(x), *wt = mpt_var_value(weight), *bt = mpt_var_value(bias);
  char xs[128], ws[128], bs[128];
  const int64_t c = xt->ndim >= 1 ? xt->shape[xt->ndim - 1] : 0;
  if (c < 1 || wt->ndim != 1 || wt->shape[0] != c || bt->ndim != 1 || bt->shape[0] != c)
    return MPT_FAIL(MPT_ESHAPE, "%s: x %s, weight %s, bias %s (want [..., C], [C], [C], C >= 1)",
                    op, SHAPE(x, xs), SHAPE(weight, ws), SHAPE(bias, bs));
  const int64_t rows = xt->count / c;
  mpt_var *o = NULL;
  float *mean = NULL, *rstd = NULL;
  MPT_RETURN_IF(mpt_tape_new_var(tape, xt->ndim, xt->shape, MPT_F32, &o));
  MPT_RETURN_IF(mpt_tape_alloc(tape, (size_t)rows * sizeof(float), (void **)&mean));
  MPT_RETURN_IF(mpt_tape_alloc(tape, (size_t)rows * sizeof(float), (void **)&rstd));
  MPT_RETURN_IF(mpt_op_layernorm(mpt_tape_stream(tape), xt->data, rows, c, wt->data, bt->data,
                                 eps, VAL(o), mean, rstd));
  mpt_var *inputs[3] = {x, weight, bias};
  if (mpt_tape_needs_grad(tape, inputs, 3)) {
    mpt_node *node = NULL;
    MPT_RETURN_IF(mpt_tape_record(tape, op, ln_backward, inputs, 3, o, &node));
    *(ln_ctx *)mpt_node_ctx(node) = (ln_ctx){.mean = mean, .rstd = rstd, .rows = rows, .c = c};
  }
  *y = o;
  return MPT_OK;
}

/* ---- GELU (tanh approximation) ---- */

static mpt_status gelu_backward(mpt_tape *tape, mpt_node *node) {
  mpt_var *x = mpt_node_input(node, 0);
  float *dx = NULL, beta = 1.0f;
  MPT_RETURN_IF(mpt_var_grad_beta(tape, x, &dx, &beta));
  if (!dx) return MPT_OK;
  return mpt_op_gelu_backward_beta(mpt_tape_stream(tape), dx, mpt_node_grad_output(node),
                                   VAL(x), mpt_var_value(x)->count, beta);
}

mpt_status mpt_nn_gelu(mpt_tape *tape, mpt_var *x, mpt_var **y) {
  static const char op[] = "gelu";
  if (!tape || !y) return MPT_FAIL(MPT_EINVAL, "%s: NULL tape or output", op);
  *y = NULL;
  MPT_RETURN_IF(mpt__gpt_check_var(op, "x", x));
  const mpt_tensor *xt = mpt_var_value(x);
  mpt_var *o = NULL;
  MPT_RETURN_IF(mpt_tape_new_var(tape, xt->ndim, xt->shape, MPT_F32, &o));
  MPT_RETURN_IF(mpt_op_gelu(mpt_tape_stream(tape), VAL(o), xt->data, xt->count));
  if (mpt_tape_needs_grad(tape, &x, 1)) MPT_RETURN_IF(mpt_tape_record(tape, op, gelu_backward, &x, 1, o, NULL));
  *y = o;
  return MPT_OK;
}

/* ---- Linear over the last dimension ---- */

typedef struct linnd_ctx {
  int64_t rows, in, out;
  mpt_precision precision; /* of the forward (mpt_tape_set_precision): backward matches */
  const uint16_t *x16, *w16; /* bf16 x [rows, in], W [out, in] (linear_bf16.c), else NULL */
} linnd_ctx;
_Static_assert(sizeof(linnd_ctx) <= MPT_NODE_CTX_BYTES, "linnd_ctx too large");

/* dx (of input x) and dW (of weight w) from dy [rows, out]: the products of linear_nd's and
 * linear_gelu's backward. */
static mpt_status linnd_grads(mpt_tape *tape, const linnd_ctx *k, mpt_var *x, mpt_var *w,
                              const float *dy) {
  mpt_stream *s = mpt_tape_stream(tape);
  float *dx = NULL, *dw = NULL, beta_x = 1.0f;
  MPT_RETURN_IF(mpt_var_grad_beta(tape, x, &dx, &beta_x));
  MPT_RETURN_IF(mpt_var_grad_acc(tape, w, &dw));
  if (k->x16)
    MPT_RETURN_IF(mpt__linear_backward_bf16(tape, k->x16, k->w16, dy, k->rows, k->in, k->out,
                                            beta_x, dx, dw));
  else if (dx) /* dx [rows, in] = beta_x dx + dy [rows, out] W [out, in] (beta_x 0: dx is new) */
    MPT_RETURN_IF(mpt_op_gemm_ex(s, k->precision, 0, 0, k->rows, k->in, k->out, 1.0f, dy, k->out, VAL(w),
                                       k->in, beta_x, dx, k->in));
  /* dW [out, in] += dy^T [out, rows] x [rows, in] */
  if (dw && !k->x16) MPT_RETURN_IF(mpt_op_gemm_ex(s, k->precision, 1, 0, k->out, k->in, k->rows, 1.0f, dy, k->out,
                                       VAL(x), k->in, 1.0f, dw, k->in));
  return MPT_OK;
}

static mpt_status linnd_backward(mpt_tape *tape, mpt_node *node) {
  const linnd_ctx *k = mpt_node_ctx(node);
  mpt_var *b = mpt_node_num_inputs(node) > 2 ? mpt_node_input(node, 2) : NULL;
  const float *dy = mpt_node_grad_output(node);
  float *db = NULL;
  if (b) MPT_RETURN_IF(mpt_var_grad_acc(tape, b, &db));
  MPT_RETURN_IF(linnd_grads(tape, k, mpt_node_input(node, 0), mpt_node_input(node, 1), dy));
  if (db) MPT_RETURN_IF(mpt_op_bias_backward(mpt_tape_stream(tape), db, dy, k->rows, k->out, 1));
  return MPT_OK;
}

/* linear_nd's and linear_gelu's checks and product: *o (a new var [..., out]) = x W^T (no
 * bias), in `into` when not NULL (then *o's value is left unwritten), and the context of
 * backward in *k. */
static mpt_status linnd_forward(mpt_tape *tape, const char *op, mpt_var *x, mpt_var *weight,
                                mpt_var *bias, float *into, mpt_var **o, linnd_ctx *k) {
  MPT_RETURN_IF(mpt__gpt_check_var(op, "x", x));
  MPT_RETURN_IF(mpt__gpt_check_var(op, "weight", weight));
  if (bias) MPT_RETURN_IF(mpt__gpt_check_var(op, "bias", bias));
  const mpt_tensor *xt = mpt_var_value(x), *wt = mpt_var_value(weight);
  char xs[128], ws[128], bs[128];
  const int64_t in = xt->ndim >= 1 ? xt->shape[xt->ndim - 1] : 0;
  if (in < 1 || wt->ndim != 2 || wt->shape[1] != in || wt->shape[0] < 1)
    return MPT_FAIL(MPT_ESHAPE, "%s: x %s and weight %s (want [..., C] and [OC, C], C >= 1)", op,
                    SHAPE(x, xs), SHAPE(weight, ws));
  const int64_t out = wt->shape[0], rows = xt->count / in;
  if (bias && (mpt_var_value(bias)->ndim != 1 || mpt_var_value(bias)->shape[0] != out))
    return MPT_FAIL(MPT_ESHAPE, "%s: bias %s does not match weight %s (want [%lld])", op,
                    SHAPE(bias, bs), SHAPE(weight, ws), (long long)out);
  int64_t shape[MPT_MAX_DIMS];
  memcpy(shape, xt->shape, sizeof shape);
  shape[xt->ndim - 1] = out;
  mpt_stream *s = mpt_tape_stream(tape);
  MPT_RETURN_IF(mpt_tape_new_var(tape, xt->ndim, shape, MPT_F32, o));
  float *y = into ? into : VAL(*o);
  const mpt_precision pr = mpt_tape_precision(tape);
  const uint16_t *x16 = NULL, *w16 = NULL;
  if (pr == MPT_PRECISION_BF16 && mpt_op_bf16_rounded_available(s))
    MPT_RETURN_IF(mpt__linear_forward_bf16(tape, xt->data, wt->data, rows, in, out, y, &x16,
                                           &w16));
  else
    MPT_RETURN_IF(mpt_op_gemm_ex(s, pr, 0, 1, rows, out, in, 1.0f, xt->data, in, wt->data, in,
                                 0.0f, y, out));
  *k = (linnd_ctx){.rows = rows, .in = in, .out = out, .precision = pr, .x16 = x16, .w16 = w16};
  return MPT_OK;
}

mpt_status mpt_nn_linear_nd(mpt_tape *tape, mpt_var *x, mpt_var *weight, mpt_var *bias,
                            mpt_var **y) {
  static const char op[] = "linear_nd";
  if (!tape || !y) return MPT_FAIL(MPT_EINVAL, "%s: NULL tape or output", op);
  *y = NULL;
  mpt_var *o = NULL;
  linnd_ctx k;
  MPT_RETURN_IF(linnd_forward(tape, op, x, weight, bias, NULL, &o, &k));
  if (bias)
    MPT_RETURN_IF(mpt_op_bias_add(mpt_tape_stream(tape), VAL(o), VAL(bias), k.rows, k.out, 1));
  mpt_var *inputs[3] = {x, weight, bias};
  const int ninputs = bias ? 3 : 2;
  if (mpt_tape_needs_grad(tape, inputs, ninputs)) {
    mpt_node *node = NULL;
    MPT_RETURN_IF(mpt_tape_record(tape, op, linnd_backward, inputs, ninputs, o, &node));
    *(linnd_ctx *)mpt_node_ctx(node) = k;
  }
  *y = o;
  return MPT_OK;
}

/* ---- Linear + bias + GELU, fused ---- */

typedef struct lingelu_ctx {
  linnd_ctx lin;
  const float *pre; /* [rows, out] x W^T without the bias, in the arena */
} lingelu_ctx;
_Static_assert(sizeof(lingelu_ctx) <= MPT_NODE_CTX_BYTES, "lingelu_ctx too large");

/* dpre = dy gelu'(pre + b) (new arena memory: the unfused pre-activation's gradient) and
 * db += its column sums in one pass, then dx and dW from dpre as linear_nd's backward. */
static mpt_status lingelu_backward(mpt_tape *tape, mpt_node *node) {
  const lingelu_ctx *k = mpt_node_ctx(node);
  mpt_var *b = mpt_node_input(node, 2);
  float *db = NULL, *dpre = NULL;
  MPT_RETURN_IF(mpt_var_grad_acc(tape, b, &db));
  MPT_RETURN_IF(mpt_tape_alloc(tape, (size_t)(k->lin.rows * k->lin.out) * sizeof(float),
                               (void **)&dpre));
  MPT_RETURN_IF(mpt_op_bias_gelu_backward(mpt_tape_stream(tape), dpre,
                                          mpt_node_grad_output(node), k->pre, VAL(b),
                                          k->lin.rows, k->lin.out, db));
  return linnd_grads(tape, &k->lin, mpt_node_input(node, 0), mpt_node_input(node, 1), dpre);
}

mpt_status mpt_nn_linear_gelu(mpt_tape *tape, mpt_var *x, mpt_var *weight, mpt_var *bias,
                              mpt_var **y) {
  static const char op[] = "linear_gelu";
  if (!tape || !y) return MPT_FAIL(MPT_EINVAL, "%s: NULL tape or output", op);
  *y = NULL;
  if (!bias) return MPT_FAIL(MPT_EINVAL, "%s: bias is NULL (use linear_nd, then gelu)", op);
  MPT_RETURN_IF(mpt__gpt_check_var(op, "weight", weight));
  const mpt_tensor *wt = mpt_var_value(weight), *xt = mpt_var_value(x);
  float *pre = NULL;
  if (xt && wt->ndim == 2 && xt->ndim >= 1 && xt->shape[xt->ndim - 1] >= 1)
    MPT_RETURN_IF(mpt_tape_alloc(tape, (size_t)(xt->count / xt->shape[xt->ndim - 1] *
                                                wt->shape[0]) * sizeof(float), (void **)&pre));
  mpt_var *o = NULL;
  lingelu_ctx k = {.pre = pre};
  MPT_RETURN_IF(linnd_forward(tape, op, x, weight, bias, pre, &o, &k.lin));
  MPT_RETURN_IF(mpt_op_bias_gelu(mpt_tape_stream(tape), VAL(o), pre, VAL(bias), k.lin.rows,
                                 k.lin.out));
  mpt_var *inputs[3] = {x, weight, bias};
  if (mpt_tape_needs_grad(tape, inputs, 3)) {
    mpt_node *node = NULL;
    MPT_RETURN_IF(mpt_tape_record(tape, op, lingelu_backward, inputs, 3, o, &node));
    *(lingelu_ctx *)mpt_node_ctx(node) = k;
  }
  *y = o;
  return MPT_OK;
}

/* ---- residual add + LayerNorm, fused forward ---- */

/* The add's backward (as mpt_nn_add's): dy to both inputs, a copy where the gradient is new
 * (b first), except that a new gradient of a (the residual stream) takes dy's storage
 * (mpt_var_grad_take): one copy of [rows, C] fewer. b before a, so that when a is b the copy
 * is made first and a then adds to it. */
static mpt_status residual_backward(mpt_tape *tape, mpt_node *node) {
  mpt_var *y = mpt_node_output(node);
  const float *dy = mpt_node_grad_output(node);
  const int64_t n = mpt_var_value(y)->count;
  for (int i = 1; i >= 0; i--) {
    float *d = NULL, beta = 1.0f;
    int taken = 0;
    if (i == 0) MPT_RETURN_IF(mpt_var_grad_take(tape, mpt_node_input(node, 0), y, &taken));
    if (taken) continue;
    MPT_RETURN_IF(mpt_var_grad_beta(tape, mpt_node_input(node, i), &d, &beta));
    if (d && beta == 0.0f)
      MPT_RETURN_IF(mpt_op_copy(mpt_tape_stream(tape), d, dy, n));
    else if (d)
      MPT_RETURN_IF(mpt_op_axpy(mpt_tape_stream(tape), n, 1.0f, dy, d));
  }
  return MPT_OK;
}

mpt_status mpt_nn_add_layernorm(mpt_tape *tape, mpt_var *a, mpt_var *b, mpt_var *weight,
                                mpt_var *bias, float eps, mpt_var **sum, mpt_var **y) {
  static const char op[] = "add_layernorm";
  if (!tape || !sum || !y) return MPT_FAIL(MPT_EINVAL, "%s: NULL tape or output", op);
  *sum = *y = NULL;
  MPT_RETURN_IF(mpt__gpt_check_var(op, "a", a));
  MPT_RETURN_IF(mpt__gpt_check_var(op, "b", b));
  MPT_RETURN_IF(mpt__gpt_check_var(op, "weight", weight));
  MPT_RETURN_IF(mpt__gpt_check_var(op, "bias", bias));
  if (!(eps >= 0.0f) || !isfinite(eps))
    return MPT_FAIL(MPT_EINVAL, "%s: eps %g must be finite and >= 0", op, (double)eps);
  const mpt_tensor *at = mpt_var_value(a), *bt = mpt_var_value(b);
  const mpt_tensor *wt = mpt_var_value(weight), *lt = mpt_var_value(bias);
  char as[128], bs[128], ws[128], ls[128];
  const int64_t c = at->ndim >= 1 ? at->shape[at->ndim - 1] : 0;
  int same = at->ndim == bt->ndim;
  for (int d = 0; same && d < at->ndim; d++) same = at->shape[d] == bt->shape[d];
  if (!same || c < 1 || wt->ndim != 1 || wt->shape[0] != c || lt->ndim != 1 || lt->shape[0] != c)
    return MPT_FAIL(MPT_ESHAPE, "%s: a %s, b %s, weight %s, bias %s (want [..., C] twice, [C], "
                    "[C], C >= 1)", op, SHAPE(a, as), SHAPE(b, bs), SHAPE(weight, ws),
                    SHAPE(bias, ls));
  const int64_t rows = at->count / c;
  mpt_var *s = NULL, *o = NULL;
  float *mean = NULL, *rstd = NULL;
  MPT_RETURN_IF(mpt_tape_new_var(tape, at->ndim, at->shape, MPT_F32, &s));
  MPT_RETURN_IF(mpt_tape_new_var(tape, at->ndim, at->shape, MPT_F32, &o));
  MPT_RETURN_IF(mpt_tape_alloc(tape, (size_t)rows * sizeof(float), (void **)&mean));
  MPT_RETURN_IF(mpt_tape_alloc(tape, (size_t)rows * sizeof(float), (void **)&rstd));
  MPT_RETURN_IF(mpt_op_add_layernorm(mpt_tape_stream(tape), at->data, bt->data, rows, c,
                                     wt->data, lt->data, eps, VAL(s), VAL(o), mean, rstd));
  mpt_var *add_in[2] = {a, b};
  if (mpt_tape_needs_grad(tape, add_in, 2))
    MPT_RETURN_IF(mpt_tape_record(tape, "add", residual_backward, add_in, 2, s, NULL));
  mpt_var *ln_in[3] = {s, weight, bias};
  if (mpt_tape_needs_grad(tape, ln_in, 3)) {
    mpt_node *node = NULL;
    MPT_RETURN_IF(mpt_tape_record(tape, "layernorm", ln_backward, ln_in, 3, o, &node));
    *(ln_ctx *)mpt_node_ctx(node) = (ln_ctx){.mean = mean, .rstd = rstd, .rows = rows, .c = c};
  }
  *sum = s;
  *y = o;
  return MPT_OK;
}

/* ---- fused softmax cross-entropy over a padded vocabulary ---- */

typedef struct xentv_ctx {
  const float *stats;     /* [N, 2] each row's max and 1 / sum of exp (ops_gpt.h), arena */
  const int32_t *targets; /* [N], the caller's */
  int64_t n, vp, v;
} xentv_ctx;
_Static_assert(sizeof(xentv_ctx) <= MPT_NODE_CTX_BYTES, "xentv_ctx too large");

static mpt_status xentv_backward(mpt_tape *tape, mpt_node *node) {
  const xentv_ctx *k = mpt_node_ctx(node);
  mpt_var *logits = mpt_node_input(node, 0);
  float *dl = NULL, beta = 1.0f;
  MPT_RETURN_IF(mpt_var_grad_beta(tape, logits, &dl, &beta));
  if (!dl) return MPT_OK;
  return mpt_op_xent_vocab_backward_beta(mpt_tape_stream(tape), VAL(logits), k->targets, k->n,
                                         k->vp, k->v, k->stats, mpt_node_grad_output(node), dl,
                                         beta);
}

mpt_status mpt_nn_cross_entropy_vocab(mpt_tape *tape, mpt_var *logits,
                                      const mpt_tensor *targets, int64_t vocab_size,
                                      mpt_var **loss) {
  static const char op[] = "cross_entropy_vocab";
  if (!tape || !targets || !loss)
    return MPT_FAIL(MPT_EINVAL, "%s: NULL tape, targets or output", op);
  *loss = NULL;
  MPT_RETURN_IF(mpt__gpt_check_var(op, "logits", logits));
  const mpt_tensor *lt = mpt_var_value(logits);
  char ls[128], ts[128];
  int ok = lt->ndim >= 2 && targets->ndim == lt->ndim - 1 && lt->shape[lt->ndim - 1] >= 1;
  for (int d = 0; ok && d < targets->ndim; d++) ok = targets->shape[d] == lt->shape[d];
  if (!ok || targets->count < 1)
    return MPT_FAIL(MPT_ESHAPE, "%s: logits %s and targets %s (want [B, T, Vp] and [B, T], or "
                    "[N, Vp] and [N], N >= 1)", op, SHAPE(logits, ls),
                    mpt_shape_str(targets->ndim, targets->shape, ts, sizeof ts));
  const int64_t vp = lt->shape[lt->ndim - 1], n = targets->count;
  if (vocab_size < 1 || vocab_size > vp)
    return MPT_FAIL(MPT_EINVAL, "%s: vocab_size %lld outside [1, %lld] (the logits' columns)",
                    op, (long long)vocab_size, (long long)vp);
  MPT_RETURN_IF(check_indices(op, "targets", targets, logits));
  static const int64_t scalar[1] = {1};
  mpt_var *o = NULL;
  float *stats = NULL;
  MPT_RETURN_IF(mpt_tape_new_var(tape, 0, scalar, MPT_F32, &o));
  MPT_RETURN_IF(mpt_tape_alloc(tape, (size_t)(2 * n) * sizeof(float), (void **)&stats));
  const int32_t *tg = targets->data;
  MPT_RETURN_IF(mpt_op_xent_vocab(mpt_tape_stream(tape), lt->data, tg, n, vp, vocab_size,
                                  stats, VAL(o)));
  if (mpt_tape_needs_grad(tape, &logits, 1)) {
    mpt_node *node = NULL;
    MPT_RETURN_IF(mpt_tape_record(tape, op, xentv_backward, &logits, 1, o, &node));
    *(xentv_ctx *)mpt_node_ctx(node) =
        (xentv_ctx){.stats = stats, .targets = tg, .n = n, .vp = vp, .v = vocab_size};
  }
  *loss = o;
  return MPT_OK;
}
