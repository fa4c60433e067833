/* Batch normalisation on the tape (mpt_nn_batchnorm; Ioffe & Szegedy, 2015, with PyTorch's
 * BatchNorm1d/2d semantics) and its parameter helper (mpt_batchnorm_add / _forward).
 *
 * x is [N, C] or [N, C, H, W], viewed as [n, c, inner] with inner = 1 or H*W; statistics are
 * per channel over n*inner values.
 * - Training mode (the tape's model is training): batch mean and biased variance normalise x;
 *   the model's running-statistics buffers are updated in place (unbiased variance, `momentum`)
 *   whether or not gradients are recorded, as PyTorch does; mean and 1/sqrt(var + eps) are kept
 *   in the arena for mpt_op_batchnorm_backward.
 * - Evaluation mode: the running statistics normalise x; the op is then a per-channel affine
 *   map y = scale[c] * x + shift[c] with scale = gamma / sqrt(running_var + eps), and its
 *   backward is dx += scale * dy, dgamma += sum(dy * xhat), dbeta += sum(dy). Nothing depends
 *   on the batch, so one sample's output does not depend on the others.
 * weight or bias may be NULL (no affine part): constant ones / zeros from the arena stand in.
 * The running-statistics pointers are not kept past the forward. Runs on the tape's stream. */
#include <stdio.h>

#include "mpitrain/autograd.h"
#include "mpitrain/ops.h"

/* The node's context. saved: training {gamma, save_mean, save_invstd}; eval {consts [3c]:
 * ones | zeros | scale, xhat [count] or NULL, tmp [count]}. */
typedef struct bn_ctx {
  int64_t n, c, inner;
  int training;
  int w_in, b_in; /* positions of weight / bias among the inputs, or -1 */
  void *saved[3];
} bn_ctx;
_Static_assert(sizeof(bn_ctx) <= MPT_NODE_CTX_BYTES, "bn_ctx too large");

static mpt_status grads_of(mpt_tape *tape, mpt_node *node, float **dx, float **dw,
                           float **db) {
  const bn_ctx *ctx = mpt_node_ctx(node);
  *dx = *dw = *db = NULL;
  MPT_RETURN_IF(mpt_var_grad_acc(tape, mpt_node_input(node, 0), dx));
  if (ctx->w_in >= 0) MPT_RETURN_IF(mpt_var_grad_acc(tape, mpt_node_input(node, ctx->w_in), dw));
  if (ctx->b_in >= 0) MPT_RETURN_IF(mpt_var_grad_acc(tape, mpt_node_input(node, ctx->b_in), db));
  return MPT_OK;
}

static mpt_status batchnorm_backward(mpt_tape *tape, mpt_node *node) {
  mpt_stream *s = mpt_tape_stream(tape);
  const float *dy = mpt_node_grad_output(node);
  float *dx, *dw, *db;
  if (!dy) return MPT_OK;
  MPT_RETURN_IF(grads_of(tape, node, &dx, &dw, &db));
  const bn_ctx *ctx = mpt_node_ctx(node);
  const int64_t n = ctx->n, c = ctx->c, inner = ctx->inner;
  const int64_t count = mpt_var_value(mpt_node_output(node))->count;
  if (ctx->training)
    return mpt_op_batchnorm_backward(s, dy, mpt_var_value(mpt_node_input(node, 0))->data, n, c, inner,
                                     ctx->saved[0], ctx->saved[1], ctx->saved[2], dx, dw, db);

  const float *ones = ctx->saved[0], *zeros = ones + c, *scale = ones + 2 * c;
  const float *xhat = ctx->saved[1];
  float *tmp = ctx->saved[2];
  if (db) MPT_RETURN_IF(mpt_op_bias_backward(s, db, dy, n, c, inner));
  if (dw) {
    MPT_RETURN_IF(mpt_op_mul(s, tmp, dy, xhat, count));
    MPT_RETURN_IF(mpt_op_bias_backward(s, dw, tmp, n, c, inner));
  }
  if (dx) {
    /* tmp = scale[c] * dy exactly: an eval "normalisation" with mean 0, var 1, eps 0 */
    MPT_RETURN_IF(mpt_op_batchnorm_eval(s, dy, n, c, inner, scale, zeros, 0.0f, zeros, ones,
                                        tmp));
    MPT_RETURN_IF(mpt_op_axpy(s, count, 1.0f, tmp, dx));
  }
  return MPT_OK;
}

/* Checks an optional [C] parameter var. */
static mpt_status check_affine(const char *what, const mpt_var *v, int64_t c) {
  char vs[64];
  if (!v) return MPT_OK;
  if (mpt_var_value(v)->dtype != MPT_F32 || mpt_var_value(v)->ndim != 1 || mpt_var_value(v)->shape[0] != c)
    return MPT_FAIL(MPT_ESHAPE, "batchnorm: %s %s, want float32 [%lld]", what,
                    mpt_shape_str(mpt_var_value(v)->ndim, mpt_var_value(v)->shape, vs, sizeof vs), (long long)c);
  return MPT_OK;
}

/* The model's running-statistics buffer `index`, which must be float32 [c]. */
static mpt_status running_buffer(mpt_model *model, const char *what, int index, int64_t c,
                                 float **data) {
  char bs[64];
  if (index < 0 || index >= mpt_model_num_buffers(model))
    return MPT_FAIL(MPT_EINVAL, "batchnorm: %s buffer index %d outside [0, %d)", what, index,
                    mpt_model_num_buffers(model));
  mpt_tensor t = mpt_model_buffer(model, index);
  if (t.dtype != MPT_F32 || t.ndim != 1 || t.shape[0] != c || !t.data)
    return MPT_FAIL(MPT_ESHAPE, "batchnorm: %s buffer %d is %s, want float32 [%lld] (model "
                    "finalised?)", what, index, mpt_shape_str(t.ndim, t.shape, bs, sizeof bs),
                    (long long)c);
  *data = t.data;
  return MPT_OK;
}

static mpt_status arena_floats(mpt_tape *tape, int64_t count, float **ptr) {
  void *p = NULL;
  MPT_RETURN_IF(mpt_tape_alloc(tape, (size_t)count * sizeof(float), &p));
  *ptr = p;
  return MPT_OK;
}

mpt_status mpt_nn_batchnorm(mpt_tape *tape, mpt_var *x, mpt_var *weight, mpt_var *bias,
                            int running_mean_buffer, int running_var_buffer, float momentum,
                            float eps, mpt_var **y) {
  char xs[64];
  if (!tape || !x || !y) return MPT_FAIL(MPT_EINVAL, "batchnorm: NULL tape, x or y");
  const mpt_tensor *xt = mpt_var_value(x);
  mpt_shape_str(xt->ndim, xt->shape, xs, sizeof xs);
  if (xt->dtype != MPT_F32) return MPT_FAIL(MPT_EINVAL, "batchnorm: x must be float32");
  if (xt->ndim != 2 && xt->ndim != 4)
    return MPT_FAIL(MPT_ESHAPE, "batchnorm: input %s, want [N, C] or [N, C, H, W]", xs);
  if (!(eps >= 0.0f) || !(momentum >= 0.0f && momentum <= 1.0f))
    return MPT_FAIL(MPT_EINVAL, "batchnorm: eps = %g must be >= 0 and momentum = %g in [0, 1]",
                    (double)eps, (double)momentum);
  const int64_t n = xt->shape[0], c = xt->shape[1];
  const int64_t inner = xt->ndim == 4 ? xt->shape[2] * xt->shape[3] : 1;
  if (c < 1) return MPT_FAIL(MPT_ESHAPE, "batchnorm: input %s has no channels", xs);
  MPT_RETURN_IF(check_affine("weight", weight, c));
  MPT_RETURN_IF(check_affine("bias", bias, c));
  mpt_model *model = mpt_tape_model(tape);
  const int training = mpt_model_training(model);
  if (training && n * inner < 2)
    return MPT_FAIL(MPT_EINVAL, "batchnorm: input %s gives one value per channel; training "
                    "needs at least two", xs);
  float *rmean = NULL, *rvar = NULL;
  MPT_RETURN_IF(running_buffer(model, "running_mean", running_mean_buffer, c, &rmean));
  MPT_RETURN_IF(running_buffer(model, "running_var", running_var_buffer, c, &rvar));

  mpt_stream *s = mpt_tape_stream(tape);
  mpt_var *inputs[3] = {x, NULL, NULL};
  int ninputs = 1, w_in = -1, b_in = -1;
  if (weight) inputs[w_in = ninputs++] = weight;
  if (bias) inputs[b_in = ninputs++] = bias;
  const int record = mpt_tape_needs_grad(tape, inputs, ninputs);

  /* consts [3c] = ones | zeros | scratch; gamma/beta fall back to ones/zeros */
  float *consts = NULL;
  MPT_RETURN_IF(arena_floats(tape, 3 * c, &consts));
  MPT_RETURN_IF(mpt_op_fill(s, consts, c, 1.0f));
  MPT_RETURN_IF(mpt_op_fill(s, consts + c, c, 0.0f));
  const float *gamma = weight ? mpt_var_value(weight)->data : consts;
  const float *beta = bias ? mpt_var_value(bias)->data : consts + c;

  mpt_var *out = NULL;
  MPT_RETURN_IF(mpt_tape_new_var(tape, xt->ndim, xt->shape, MPT_F32, &out));
  void *saved[3] = {NULL, NULL, NULL};
  if (training) {
    float *stats = NULL; /* save_mean | save_invstd */
    MPT_RETURN_IF(arena_floats(tape, 2 * c, &stats));
    MPT_RETURN_IF(mpt_op_batchnorm_train(s, xt->data, n, c, inner, gamma, beta, eps, momentum,
                                         rmean, rvar, mpt_var_value(out)->data, stats, stats + c));
    saved[0] = (void *)gamma;
    saved[1] = stats;
    saved[2] = stats + c;
  } else {
    MPT_RETURN_IF(mpt_op_batchnorm_eval(s, xt->data, n, c, inner, gamma, beta, eps, rmean, rvar,
                                        mpt_var_value(out)->data));
    if (record) {
      float *scale = consts + 2 * c, *xhat = NULL, *tmp = NULL;
      /* scale[c] = gamma / sqrt(running_var + eps): the eval map applied to a [1, c, 1] one */
      MPT_RETURN_IF(mpt_op_batchnorm_eval(s, consts, 1, c, 1, gamma, consts + c, eps,
                                          consts + c, rvar, scale));
      if (weight) { /* xhat = (x - running_mean) / sqrt(running_var + eps) */
        MPT_RETURN_IF(arena_floats(tape, xt->count, &xhat));
        MPT_RETURN_IF(mpt_op_batchnorm_eval(s, xt->data, n, c, inner, consts, consts + c, eps,
                                            rmean, rvar, xhat));
      }
      MPT_RETURN_IF(arena_floats(tape, xt->count, &tmp));
      saved[0] = consts;
      saved[1] = xhat;
      saved[2] = tmp;
    }
  }
  if (record) {
    mpt_node *node = NULL;
    MPT_RETURN_IF(mpt_tape_record(tape, "batchnorm", batchnorm_backward, inputs, ninputs, out,
                                   &node));
    *(bn_ctx *)mpt_node_ctx(node) = (bn_ctx){.n = n, .c = c, .inner = inner,
                                             .training = training, .w_in = w_in, .b_in = b_in,
                                             .saved = {saved[0], saved[1], saved[2]}};
  }
  *y = out;
  return MPT_OK;
}

mpt_status mpt_batchnorm_add(mpt_model *model, const char *name, int64_t channels,
                             mpt_batchnorm *layer) {
  if (!model || !name || !layer)
    return MPT_FAIL(MPT_EINVAL, "batchnorm_add: NULL model, name or layer");
  if (channels < 1)
    return MPT_FAIL(MPT_EINVAL, "batchnorm_add '%s': channels = %lld must be >= 1", name,
                    (long long)channels);
  char pname[256];
  if (snprintf(pname, sizeof pname, "%s.running_mean", name) >= (int)sizeof pname)
    return MPT_FAIL(MPT_EINVAL, "batchnorm_add: name '%s' is too long", name);
  mpt_batchnorm l = {.weight = -1, .bias = -1, .running_mean = -1, .running_var = -1,
                     .channels = channels, .momentum = 0.1f, .eps = 1e-5f};
  snprintf(pname, sizeof pname, "%s.weight", name);
  MPT_RETURN_IF(mpt_model_add_param(model, pname, 1, &channels, MPT_INIT_ONES, 0, &l.weight));
  snprintf(pname, sizeof pname, "%s.bias", name);
  MPT_RETURN_IF(mpt_model_add_param(model, pname, 1, &channels, MPT_INIT_ZEROS, 0, &l.bias));
  snprintf(pname, sizeof pname, "%s.running_mean", name);
  MPT_RETURN_IF(mpt_model_add_buffer(model, pname, 1, &channels, MPT_INIT_ZEROS,
                                     &l.running_mean));
  snprintf(pname, sizeof pname, "%s.running_var", name);
  MPT_RETURN_IF(mpt_model_add_buffer(model, pname, 1, &channels, MPT_INIT_ONES,
                                     &l.running_var));
  *layer = l;
  return MPT_OK;
}

mpt_status mpt_batchnorm_forward(mpt_tape *tape, const mpt_batchnorm *layer, mpt_var *x,
                                 mpt_var **y) {
  if (!tape || !layer) return MPT_FAIL(MPT_EINVAL, "batchnorm_forward: NULL tape or layer");
  mpt_var *w = NULL, *b = NULL;
  if (layer->weight >= 0) MPT_RETURN_IF(mpt_tape_param(tape, layer->weight, &w));
  if (layer->bias >= 0) MPT_RETURN_IF(mpt_tape_param(tape, layer->bias, &b));
  return mpt_nn_batchnorm(tape, x, w, b, layer->running_mean, layer->running_var,
                          layer->momentum, layer->eps, y);
}
