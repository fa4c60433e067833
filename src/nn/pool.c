/* Max pooling on the tape (mpt_nn_maxpool2d): a k x k window moved by `stride` over every
 * [H, W] plane of x [N, C, H, W], no padding; y [N, C, OH, OW] with OH = (H - k)/stride + 1.
 * The forward keeps, per output element, the index within its plane of the first maximum
 * (int32, in the tape arena, pool_ctx.argmax); backward sends dy there: dx[argmax] += dy, so
 * overlapping windows that share a maximum add up. Runs on the tape's stream. */
#include "mpitrain/autograd.h"
#include "mpitrain/ops.h"

/* The node's context (mpt_node_ctx). */
typedef struct pool_ctx {
  mpt_conv_geom g; /* one plane's geometry, resolved */
  int64_t planes;  /* N * C */
  int32_t *argmax; /* [N, C, OH, OW] in the arena */
} pool_ctx;
_Static_assert(sizeof(pool_ctx) <= MPT_NODE_CTX_BYTES, "pool_ctx too large");

static mpt_conv_geom pool_geom(int64_t h, int64_t w, int64_t k, int64_t stride) {
  mpt_conv_geom g = {.channels = 1, .height = h, .width = w, .kernel_h = k, .kernel_w = k,
                     .stride = stride, .pad = 0};
  return g;
}

static mpt_status maxpool2d_backward(mpt_tape *tape, mpt_node *node) {
  const float *dy = mpt_node_grad_output(node);
  float *dx = NULL;
  if (!dy) return MPT_OK;
  MPT_RETURN_IF(mpt_var_grad_acc(tape, mpt_node_input(node, 0), &dx));
  if (!dx) return MPT_OK;
  const pool_ctx *c = mpt_node_ctx(node);
  return mpt_op_maxpool_backward(mpt_tape_stream(tape), &c->g, c->planes, dy, c->argmax, dx);
}

mpt_status mpt_nn_maxpool2d(mpt_tape *tape, mpt_var *x, int64_t kernel, int64_t stride,
                            mpt_var **y) {
  char xs[64];
  if (!tape || !x || !y) return MPT_FAIL(MPT_EINVAL, "maxpool2d: NULL tape, x or y");
  const mpt_tensor *xt = mpt_var_value(x);
  mpt_shape_str(xt->ndim, xt->shape, xs, sizeof xs);
  if (xt->dtype != MPT_F32) return MPT_FAIL(MPT_EINVAL, "maxpool2d: x must be float32");
  if (xt->ndim != 4)
    return MPT_FAIL(MPT_ESHAPE, "maxpool2d: input %s, want [N, C, H, W]", xs);
  if (kernel < 1 || stride < 1 || xt->shape[2] < kernel || xt->shape[3] < kernel)
    return MPT_FAIL(MPT_EINVAL, "maxpool2d: kernel %lld, stride %lld on input %s: the window "
                    "must fit and both must be >= 1", (long long)kernel, (long long)stride, xs);
  mpt_conv_geom g = pool_geom(xt->shape[2], xt->shape[3], kernel, stride);
  MPT_RETURN_IF(mpt_conv_geom_resolve(&g));
  const int64_t planes = xt->shape[0] * xt->shape[1];
  const int64_t yshape[4] = {xt->shape[0], xt->shape[1], g.out_h, g.out_w};
  mpt_var *out = NULL;
  void *argmax = NULL;
  MPT_RETURN_IF(mpt_tape_new_var(tape, 4, yshape, MPT_F32, &out));
  MPT_RETURN_IF(mpt_tape_alloc(tape, (size_t)mpt_var_value(out)->count * sizeof(int32_t), &argmax));
  MPT_RETURN_IF(mpt_op_maxpool(mpt_tape_stream(tape), &g, planes, xt->data, mpt_var_value(out)->data,
                               argmax));
  if (mpt_tape_needs_grad(tape, &x, 1)) {
    mpt_node *node = NULL;
    MPT_RETURN_IF(mpt_tape_record(tape, "maxpool2d", maxpool2d_backward, &x, 1, out, &node));
    *(pool_ctx *)mpt_node_ctx(node) = (pool_ctx){.g = g, .planes = planes, .argmax = argmax};
  }
  *y = out;
  return MPT_OK;
}
