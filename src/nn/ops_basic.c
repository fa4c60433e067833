/* The basic ops on the tape (include/mpitrain/nn.h): linear, relu, flatten, add, mul, sum,
 * mean, cross_entropy, and the Linear layer helpers mpt_linear_add / mpt_linear_forward.
 *
 * Each op validates its shapes (MPT_ESHAPE naming the op and the shapes), computes its output
 * in a new arena var on the tape's stream, and records a node when gradients are enabled and
 * an input needs one. Backward functions ACCUMULATE into their inputs' gradients (GEMMs with
 * beta = 1, axpy, the *_backward ops) and skip inputs that need no gradient.
 *   linear:  y = x W^T + b;  dx += dy W;  dW += dy^T x;  db += column sums of dy
 *   relu:    dx += dy where the OUTPUT is positive
 *   flatten: a view var sharing the input's value and gradient storage, so its backward has
 *            nothing to do (the consumers' gradients land directly in the input's gradient)
 *   add:     da += dy, db += dy;  mul: da += dy * b, db += dy * a
 *   sum:     dx += dy;  mean: dx += dy / count
 *   cross_entropy: probabilities saved in the arena, labels' data pointer saved (it must stay
 *            valid until backward, like every input of the pass) */
#include <stdio.h>

#include "mpitrain/autograd.h"
#include "mpitrain/ops.h"
#include "mpitrain/ops_bf16.h"

#define SHAPE(v, buf) mpt_shape_str(mpt_var_value(v)->ndim, mpt_var_value(v)->shape, buf, sizeof buf)

static mpt_status check_f32(const char *op, const char *what, const mpt_var *v) {
  if (!v) return MPT_FAIL(MPT_EINVAL, "%s: %s is NULL", op, what);
  if (mpt_var_value(v)->dtype != MPT_F32)
    return MPT_FAIL(MPT_EINVAL, "%s: %s is %s, want float32", op, what,
                    mpt_dtype_name(mpt_var_value(v)->dtype));
  if (mpt_var_value(v)->count > 0 && !mpt_var_value(v)->data)
    return MPT_FAIL(MPT_EINVAL, "%s: %s has no data", op, what);
  return MPT_OK;
}

static const int64_t SCALAR_SHAPE[1] = {1};

/* ---- linear ---- */

/* The node keeps the precision of its forward (mpt_tape_set_precision), so backward matches. */
typedef struct linear_ctx {
  mpt_precision precision;
} linear_ctx;
_Static_assert(sizeof(linear_ctx) <= MPT_NODE_CTX_BYTES, "linear_ctx too large");

static mpt_status linear_backward(mpt_tape *tape, mpt_node *node) {
  mpt_stream *s = mpt_tape_stream(tape);
  mpt_var *x = mpt_node_input(node, 0), *w = mpt_node_input(node, 1);
  mpt_var *b = mpt_node_num_inputs(node) > 2 ? mpt_node_input(node, 2) : NULL;
  const float *dy = mpt_node_grad_output(node);
  const mpt_precision pr = ((const linear_ctx *)mpt_node_ctx(node))->precision;
  const int64_t n = mpt_var_value(x)->shape[0], in = mpt_var_value(x)->shape[1], out = mpt_var_value(w)->shape[0];
  float *dx = NULL, *dw = NULL, *db = NULL;
  MPT_RETURN_IF(mpt_var_grad_acc(tape, x, &dx));
  MPT_RETURN_IF(mpt_var_grad_acc(tape, w, &dw));
  if (b) MPT_RETURN_IF(mpt_var_grad_acc(tape, b, &db));
  /* dx [N, in] += dy [N, out] W [out, in] */
  if (dx) MPT_RETURN_IF(mpt_op_gemm_ex(s, pr, 0, 0, n, in, out, 1.0f, dy, out, mpt_var_value(w)->data, in, 1.0f,
                                    dx, in));
  /* dW [out, in] += dy^T [out, N] x [N, in] */
  if (dw) MPT_RETURN_IF(mpt_op_gemm_ex(s, pr, 1, 0, out, in, n, 1.0f, dy, out, mpt_var_value(x)->data, in, 1.0f,
                                    dw, in));
  if (db) MPT_RETURN_IF(mpt_op_bias_backward(s, db, dy, n, out, 1));
  return MPT_OK;
}

mpt_status mpt_nn_linear(mpt_tape *tape, mpt_var *x, mpt_var *w, mpt_var *b, mpt_var **y) {
  if (!tape || !y) return MPT_FAIL(MPT_EINVAL, "linear: NULL tape or output");
  *y = NULL;
  MPT_RETURN_IF(check_f32("linear", "x", x));
  MPT_RETURN_IF(check_f32("linear", "weight", w));
  if (b) MPT_RETURN_IF(check_f32("linear", "bias", b));
  char xs[128], ws[128], bs[128];
  if (mpt_var_value(x)->ndim != 2 || mpt_var_value(w)->ndim != 2 || mpt_var_value(x)->shape[1] != mpt_var_value(w)->shape[1])
    return MPT_FAIL(MPT_ESHAPE, "linear: x %s and weight %s (want [N, in] and [out, in]; "
                    "flatten images first)", SHAPE(x, xs), SHAPE(w, ws));
  const int64_t n = mpt_var_value(x)->shape[0], in = mpt_var_value(x)->shape[1], out = mpt_var_value(w)->shape[0];
  if (b && (mpt_var_value(b)->ndim != 1 || mpt_var_value(b)->shape[0] != out))
    return MPT_FAIL(MPT_ESHAPE, "linear: bias %s does not match weight %s (want [%lld])",
                    SHAPE(b, bs), SHAPE(w, ws), (long long)out);
  mpt_stream *s = mpt_tape_stream(tape);
  mpt_var *o = NULL;
  const int64_t shape[2] = {n, out};
  MPT_RETURN_IF(mpt_tape_new_var(tape, 2, shape, MPT_F32, &o));
  /* y [N, out] = x [N, in] W^T */
  const mpt_precision pr = mpt_tape_precision(tape);
  MPT_RETURN_IF(mpt_op_gemm_ex(s, pr, 0, 1, n, out, in, 1.0f, mpt_var_value(x)->data, in, mpt_var_value(w)->data, in,
                            0.0f, mpt_var_value(o)->data, out));
  if (b) MPT_RETURN_IF(mpt_op_bias_add(s, mpt_var_value(o)->data, mpt_var_value(b)->data, n, out, 1));
  mpt_var *inputs[3] = {x, w, b};
  const int ninputs = b ? 3 : 2;
  if (mpt_tape_needs_grad(tape, inputs, ninputs)) {
    mpt_node *node = NULL;
    MPT_RETURN_IF(mpt_tape_record(tape, "linear", linear_backward, inputs, ninputs, o, &node));
    ((linear_ctx *)mpt_node_ctx(node))->precision = pr;
  }
  *y = o;
  return MPT_OK;
}

mpt_status mpt_linear_add(mpt_model *model, const char *name, int64_t in_features,
                          int64_t out_features, int bias, mpt_linear *layer) {
  if (!model || !name || !layer)
    return MPT_FAIL(MPT_EINVAL, "linear_add: NULL model, name or layer");
  if (in_features < 1 || out_features < 1)
    return MPT_FAIL(MPT_EINVAL, "linear_add '%s': in_features %lld and out_features %lld must "
                    "be >= 1", name, (long long)in_features, (long long)out_features);
  char pname[256];
  if (snprintf(pname, sizeof pname, "%s.weight", name) >= (int)sizeof pname)
    return MPT_FAIL(MPT_EINVAL, "linear_add: name '%s' is too long", name);
  layer->in_features = in_features;
  layer->out_features = out_features;
  layer->bias = -1;
  const int64_t wshape[2] = {out_features, in_features}, bshape[1] = {out_features};
  MPT_RETURN_IF(mpt_model_add_param(model, pname, 2, wshape, MPT_INIT_FAN_IN, in_features,
                                    &layer->weight));
  if (bias) {
    snprintf(pname, sizeof pname, "%s.bias", name);
    MPT_RETURN_IF(mpt_model_add_param(model, pname, 1, bshape, MPT_INIT_FAN_IN, in_features,
                                      &layer->bias));
  }
  return MPT_OK;
}

mpt_status mpt_linear_forward(mpt_tape *tape, const mpt_linear *layer, mpt_var *x,
                              mpt_var **y) {
  if (!tape || !layer) return MPT_FAIL(MPT_EINVAL, "linear_forward: NULL tape or layer");
  mpt_var *w = NULL, *b = NULL;
  MPT_RETURN_IF(mpt_tape_param(tape, layer->weight, &w));
  if (layer->bias >= 0) MPT_RETURN_IF(mpt_tape_param(tape, layer->bias, &b));
  return mpt_nn_linear(tape, x, w, b, y);
}

/* ---- relu, flatten ---- */

static mpt_status relu_backward(mpt_tape *tape, mpt_node *node) {
  float *dx = NULL;
  MPT_RETURN_IF(mpt_var_grad_acc(tape, mpt_node_input(node, 0), &dx));
  if (!dx) return MPT_OK;
  const mpt_var *y = mpt_node_output(node);
  return mpt_op_relu_backward(mpt_tape_stream(tape), dx, mpt_var_grad(y)->data, mpt_var_value(y)->data,
                              mpt_var_value(y)->count);
}

mpt_status mpt_nn_relu(mpt_tape *tape, mpt_var *x, mpt_var **y) {
  if (!tape || !y) return MPT_FAIL(MPT_EINVAL, "relu: NULL tape or output");
  *y = NULL;
  MPT_RETURN_IF(check_f32("relu", "x", x));
  mpt_var *o = NULL;
  MPT_RETURN_IF(mpt_tape_new_var(tape, mpt_var_value(x)->ndim, mpt_var_value(x)->shape, MPT_F32, &o));
  MPT_RETURN_IF(mpt_op_relu(mpt_tape_stream(tape), mpt_var_value(o)->data, mpt_var_value(x)->data,
                            mpt_var_value(x)->count));
  if (mpt_tape_needs_grad(tape, &x, 1))
    MPT_RETURN_IF(mpt_tape_record(tape, "relu", relu_backward, &x, 1, o, NULL));
  *y = o;
  return MPT_OK;
}

mpt_status mpt_nn_flatten(mpt_tape *tape, mpt_var *x, mpt_var **y) {
  if (!tape || !y) return MPT_FAIL(MPT_EINVAL, "flatten: NULL tape or output");
  *y = NULL;
  if (!x) return MPT_FAIL(MPT_EINVAL, "flatten: x is NULL");
  char xs[128];
  if (mpt_var_value(x)->ndim < 2)
    return MPT_FAIL(MPT_ESHAPE, "flatten: x %s needs a batch and at least one more dimension",
                    SHAPE(x, xs));
  int64_t inner = 1;
  for (int d = 1; d < mpt_var_value(x)->ndim; d++) inner *= mpt_var_value(x)->shape[d];
  const int64_t shape[2] = {mpt_var_value(x)->shape[0], inner};
  mpt_var *o = NULL;
  MPT_RETURN_IF(mpt_tape_view_var(tape, x, 2, shape, &o)); /* a node when x needs a grad */
  *y = o;
  return MPT_OK;
}

/* ---- add, mul ---- */

static mpt_status binary_check(const char *op, const mpt_var *a, const mpt_var *b) {
  MPT_RETURN_IF(check_f32(op, "a", a));
  MPT_RETURN_IF(check_f32(op, "b", b));
  char as[128], bs[128];
  if (!mpt_tensor_same_shape(mpt_var_value(a), mpt_var_value(b)))
    return MPT_FAIL(MPT_ESHAPE, "%s: a %s and b %s differ (no broadcasting)", op, SHAPE(a, as),
                    SHAPE(b, bs));
  return MPT_OK;
}

static mpt_status add_backward(mpt_tape *tape, mpt_node *node) {
  const mpt_var *y = mpt_node_output(node);
  for (int i = 0; i < 2; i++) {
    float *d = NULL, beta = 1.0f;
    MPT_RETURN_IF(mpt_var_grad_beta(tape, mpt_node_input(node, i), &d, &beta));
    if (d && beta == 0.0f) /* the first gradient of that input: a copy, no zero-fill */
      MPT_RETURN_IF(mpt_op_copy(mpt_tape_stream(tape), d, mpt_var_grad(y)->data,
                                mpt_var_value(y)->count));
    else if (d)
      MPT_RETURN_IF(mpt_op_axpy(mpt_tape_stream(tape), mpt_var_value(y)->count, 1.0f,
                                mpt_var_grad(y)->data, d));
  }
  return MPT_OK;
}

mpt_status mpt_nn_add(mpt_tape *tape, mpt_var *a, mpt_var *b, mpt_var **y) {
  if (!tape || !y) return MPT_FAIL(MPT_EINVAL, "add: NULL tape or output");
  *y = NULL;
  MPT_RETURN_IF(binary_check("add", a, b));
  mpt_stream *s = mpt_tape_stream(tape);
  mpt_var *o = NULL;
  MPT_RETURN_IF(mpt_tape_new_var(tape, mpt_var_value(a)->ndim, mpt_var_value(a)->shape, MPT_F32, &o));
  MPT_RETURN_IF(mpt_op_copy(s, mpt_var_value(o)->data, mpt_var_value(a)->data, mpt_var_value(a)->count));
  MPT_RETURN_IF(mpt_op_axpy(s, mpt_var_value(a)->count, 1.0f, mpt_var_value(b)->data, mpt_var_value(o)->data));
  mpt_var *inputs[2] = {a, b};
  if (mpt_tape_needs_grad(tape, inputs, 2))
    MPT_RETURN_IF(mpt_tape_record(tape, "add", add_backward, inputs, 2, o, NULL));
  *y = o;
  return MPT_OK;
}

static mpt_status mul_backward(mpt_tape *tape, mpt_node *node) {
  const mpt_var *y = mpt_node_output(node);
  for (int i = 0; i < 2; i++) {
    float *d = NULL;
    MPT_RETURN_IF(mpt_var_grad_acc(tape, mpt_node_input(node, i), &d));
    /* d(a*b)/da = b, d(a*b)/db = a */
    if (d) MPT_RETURN_IF(mpt_op_mul_backward(mpt_tape_stream(tape), d, mpt_var_grad(y)->data,
                                             mpt_var_value(mpt_node_input(node, 1 - i))->data, mpt_var_value(y)->count));
  }
  return MPT_OK;
}

mpt_status mpt_nn_mul(mpt_tape *tape, mpt_var *a, mpt_var *b, mpt_var **y) {
  if (!tape || !y) return MPT_FAIL(MPT_EINVAL, "mul: NULL tape or output");
  *y = NULL;
  MPT_RETURN_IF(binary_check("mul", a, b));
  mpt_var *o = NULL;
  MPT_RETURN_IF(mpt_tape_new_var(tape, mpt_var_value(a)->ndim, mpt_var_value(a)->shape, MPT_F32, &o));
  MPT_RETURN_IF(mpt_op_mul(mpt_tape_stream(tape), mpt_var_value(o)->data, mpt_var_value(a)->data, mpt_var_value(b)->data,
                           mpt_var_value(a)->count));
  mpt_var *inputs[2] = {a, b};
  if (mpt_tape_needs_grad(tape, inputs, 2))
    MPT_RETURN_IF(mpt_tape_record(tape, "mul", mul_backward, inputs, 2, o, NULL));
  *y = o;
  return MPT_OK;
}

/* ---- sum, mean ---- */

/* The node's context: one float, the factor d(y)/d(x_i) (1 for sum, 1/count for mean). */
static mpt_status reduce_backward(mpt_tape *tape, mpt_node *node) {
  float *dx = NULL;
  MPT_RETURN_IF(mpt_var_grad_acc(tape, mpt_node_input(node, 0), &dx));
  if (!dx) return MPT_OK;
  return mpt_op_sum_backward(mpt_tape_stream(tape), dx, mpt_var_value(mpt_node_input(node, 0))->count,
                             mpt_node_grad_output(node), *(const float *)mpt_node_ctx(node));
}

static mpt_status reduce(mpt_tape *tape, const char *op, mpt_var *x, int mean, mpt_var **y) {
  if (!tape || !y) return MPT_FAIL(MPT_EINVAL, "%s: NULL tape or output", op);
  *y = NULL;
  MPT_RETURN_IF(check_f32(op, "x", x));
  mpt_stream *s = mpt_tape_stream(tape);
  const int64_t count = mpt_var_value(x)->count;
  /* The mean of nothing is NaN (0 * inf), as in PyTorch. */
  const float factor = mean ? (float)(1.0 / (double)count) : 1.0f;
  mpt_var *o = NULL;
  MPT_RETURN_IF(mpt_tape_new_var(tape, 0, SCALAR_SHAPE, MPT_F32, &o));
  MPT_RETURN_IF(mpt_op_sum(s, mpt_var_value(x)->data, count, mpt_var_value(o)->data));
  if (mean) MPT_RETURN_IF(mpt_op_scale(s, mpt_var_value(o)->data, 1, factor));
  if (mpt_tape_needs_grad(tape, &x, 1)) {
    mpt_node *node = NULL;
    MPT_RETURN_IF(mpt_tape_record(tape, op, reduce_backward, &x, 1, o, &node));
    *(float *)mpt_node_ctx(node) = factor;
  }
  *y = o;
  return MPT_OK;
}

mpt_status mpt_nn_sum(mpt_tape *tape, mpt_var *x, mpt_var **y) {
  return reduce(tape, "sum", x, 0, y);
}

mpt_status mpt_nn_mean(mpt_tape *tape, mpt_var *x, mpt_var **y) {
  return reduce(tape, "mean", x, 1, y);
}

/* ---- cross entropy ---- */

/* The node's context. */
typedef struct xent_ctx {
  const float *probs;    /* [N, K] softmax, in the arena */
  const int32_t *labels; /* [N], the caller's (valid until backward) */
  int64_t n, k;
} xent_ctx;
_Static_assert(sizeof(xent_ctx) <= MPT_NODE_CTX_BYTES, "xent_ctx too large");

static mpt_status xent_backward(mpt_tape *tape, mpt_node *node) {
  float *dlogits = NULL;
  MPT_RETURN_IF(mpt_var_grad_acc(tape, mpt_node_input(node, 0), &dlogits));
  if (!dlogits) return MPT_OK;
  const xent_ctx *c = mpt_node_ctx(node);
  return mpt_op_softmax_xent_backward(mpt_tape_stream(tape), c->probs, c->labels, c->n, c->k,
                                      mpt_node_grad_output(node), dlogits);
}

mpt_status mpt_nn_cross_entropy(mpt_tape *tape, mpt_var *logits, const mpt_tensor *labels,
                                mpt_var **loss) {
  if (!tape || !loss || !labels)
    return MPT_FAIL(MPT_EINVAL, "cross_entropy: NULL tape, labels or output");
  *loss = NULL;
  MPT_RETURN_IF(check_f32("cross_entropy", "logits", logits));
  char ls[128], ys[128];
  if (mpt_var_value(logits)->ndim != 2 || mpt_var_value(logits)->shape[0] < 1 || mpt_var_value(logits)->shape[1] < 1)
    return MPT_FAIL(MPT_ESHAPE, "cross_entropy: logits %s (want [N, K], N, K >= 1)",
                    SHAPE(logits, ls));
  const int64_t n = mpt_var_value(logits)->shape[0], k = mpt_var_value(logits)->shape[1];
  if (labels->dtype != MPT_I32 || labels->ndim != 1 || labels->shape[0] != n || !labels->data)
    return MPT_FAIL(MPT_ESHAPE, "cross_entropy: labels %s %s for logits %s (want int32 [%lld])",
                    mpt_dtype_name(labels->dtype),
                    mpt_shape_str(labels->ndim, labels->shape, ys, sizeof ys), SHAPE(logits, ls),
                    (long long)n);
  if (labels->device.type != mpt_var_value(logits)->device.type)
    return MPT_FAIL(MPT_EINVAL, "cross_entropy: labels and logits are on different devices");
  mpt_stream *s = mpt_tape_stream(tape);
  void *probs = NULL;
  mpt_var *o = NULL;
  MPT_RETURN_IF(mpt_tape_alloc(tape, (size_t)(n * k) * sizeof(float), &probs));
  MPT_RETURN_IF(mpt_tape_new_var(tape, 0, SCALAR_SHAPE, MPT_F32, &o));
  MPT_RETURN_IF(mpt_op_softmax_xent(s, mpt_var_value(logits)->data, labels->data, n, k, probs,
                                    mpt_var_value(o)->data));
  if (mpt_tape_needs_grad(tape, &logits, 1)) {
    mpt_node *node = NULL;
    MPT_RETURN_IF(mpt_tape_record(tape, "cross_entropy", xent_backward, &logits, 1, o, &node));
    *(xent_ctx *)mpt_node_ctx(node) =
        (xent_ctx){.probs = probs, .labels = labels->data, .n = n, .k = k};
  }
  *loss = o;
  return MPT_OK;
}
