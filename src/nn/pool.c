/* Max pooling on the tape (mpt_nn_maxpool2d): a k x k window moved by `stride` over every
 * [H, W] plane of x [N, C, H, W], no padding; y [N, C, OH, OW] with OH = (H - k)/stride + 1.
 * The forward keeps, per output element, the index within its plane of the first maximum
 * (int32, in the tape arena, node->saved[0]); backward sends dy there: dx[argmax] += dy, so
 * overlapping windows that share a maximum add up. Runs on the tape's stream. */
#include "core/error.h"
#include "nn/tape.h"

enum { CTX_PLANES, CTX_H, CTX_W, CTX_K, CTX_STRIDE, CTX_OH, CTX_OW };

static mpt_conv_geom pool_geom(int64_t h, int64_t w, int64_t k, int64_t stride) {
  mpt_conv_geom g = {.channels = 1, .height = h, .width = w, .kernel_h = k, .kernel_w = k,
                     .stride = stride, .pad = 0};
  return g;
}

static mpt_status maxpool2d_backward(mpt_tape *tape, mpt__node *node) {
  const float *dy = node->output->grad.data;
  float *dx = NULL;
  if (!dy) return MPT_OK;
  MPT_RETURN_IF(mpt__var_grad(tape, node->inputs[0], &dx));
  if (!dx) return MPT_OK;
  mpt_conv_geom g = pool_geom(node->ctx.i[CTX_H], node->ctx.i[CTX_W], node->ctx.i[CTX_K],
                              node->ctx.i[CTX_STRIDE]);
  g.out_h = node->ctx.i[CTX_OH];
  g.out_w = node->ctx.i[CTX_OW];
  return mpt_op_maxpool_backward(mpt_tape_stream(tape), &g, node->ctx.i[CTX_PLANES], dy,
                                 node->saved[0], dx);
}

mpt_status mpt_nn_maxpool2d(mpt_tape *tape, mpt_var *x, int64_t kernel, int64_t stride,
                            mpt_var **y) {
  char xs[64];
  if (!tape || !x || !y) return MPT_FAIL(MPT_EINVAL, "maxpool2d: NULL tape, x or y");
  const mpt_tensor *xt = &x->value;
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
  MPT_RETURN_IF(mpt__tape_new_var(tape, 4, yshape, MPT_F32, &out));
  MPT_RETURN_IF(mpt__tape_alloc(tape, (size_t)out->value.count * sizeof(int32_t), &argmax));
  MPT_RETURN_IF(mpt_op_maxpool(mpt_tape_stream(tape), &g, planes, xt->data, out->value.data,
                               argmax));
  if (mpt__tape_needs_grad(tape, &x, 1)) {
    mpt__node *node = NULL;
    MPT_RETURN_IF(mpt__tape_record(tape, "maxpool2d", maxpool2d_backward, &x, 1, out, &node));
    node->ctx.i[CTX_PLANES] = planes;
    node->ctx.i[CTX_H] = g.height;
    node->ctx.i[CTX_W] = g.width;
    node->ctx.i[CTX_K] = kernel;
    node->ctx.i[CTX_STRIDE] = stride;
    node->ctx.i[CTX_OH] = g.out_h;
    node->ctx.i[CTX_OW] = g.out_w;
    node->saved[0] = argmax;
  }
  *y = out;
  return MPT_OK;
}
