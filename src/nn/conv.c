/* 2-D convolution on the tape (mpt_nn_conv2d) and its parameter helper (mpt_conv2d_add /
 * mpt_conv2d_forward).
 *
 * Two ways to compute it (mpt_nn_set_conv_algo), chosen at forward and kept in the node:
 *
 * Library: the whole batch at once through mpt_op_conv2d_forward / _backward_data /
 * _backward_weights (oneDNN on the CPU), bias fused; nothing is saved but the inputs.
 *
 * im2col + GEMM, per image n (Chellapilla et al., 2006; Caffe's im2col layout, Jia et al., 2014):
 *   col [C*kh*kw, OH*OW] = im2col(x_n)
 *   y_n [O, OH*OW]       = W [O, C*kh*kw] x col
 * then y += b broadcast over [N, O, OH*OW].
 * Backward, per image n, with dy_n [O, OH*OW]:
 *   dW  += dy_n x col^T             (col recomputed from x_n: nothing per image is kept)
 *   dcol = W^T x dy_n ;  dx_n += col2im(dcol)
 *   db  += sum over n and positions of dy.
 * Invariants: the one-image col buffer is taken from the tape arena in forward and reused by
 * backward (conv_ctx.col); the geometry is stored in the node's context (conv_ctx), so the
 * backward needs no allocation. Everything runs on the tape's stream. */
#include <stdatomic.h>
#include <stdio.h>

#include "mpitrain/autograd.h"
#include "mpitrain/ops.h"
#include "mpitrain/ops_bf16.h"

/* The node's context (mpt_node_ctx). */
typedef struct conv_ctx {
  mpt_conv_geom g; /* one image's geometry */
  int64_t n, o;    /* batch, output channels */
  int library;     /* computed by the library convolutions (else im2col + GEMM) */
  float *col;      /* im2col scratch [C*kh*kw, OH*OW] in the arena (im2col only) */
  mpt_precision precision; /* of the forward (mpt_tape_set_precision): backward matches */
} conv_ctx;
_Static_assert(sizeof(conv_ctx) <= MPT_NODE_CTX_BYTES, "conv_ctx too large");

static _Atomic int conv_algo = MPT_CONV_ALGO_AUTO;

mpt_status mpt_nn_set_conv_algo(mpt_conv_algo algo) {
  if (algo != MPT_CONV_ALGO_AUTO && algo != MPT_CONV_ALGO_IM2COL && algo != MPT_CONV_ALGO_LIBRARY)
    return MPT_FAIL(MPT_EINVAL, "set_conv_algo: %d is not AUTO, IM2COL or LIBRARY", (int)algo);
  atomic_store(&conv_algo, (int)algo);
  return MPT_OK;
}

mpt_conv_algo mpt_nn_conv_algo(void) { return (mpt_conv_algo)atomic_load(&conv_algo); }

static mpt_status conv2d_backward(mpt_tape *tape, mpt_node *node) {
  mpt_stream *s = mpt_tape_stream(tape);
  mpt_var *x = mpt_node_input(node, 0), *w = mpt_node_input(node, 1);
  mpt_var *b = mpt_node_num_inputs(node) > 2 ? mpt_node_input(node, 2) : NULL;
  const float *dy = mpt_node_grad_output(node);
  float *dx = NULL, *dw = NULL, *db = NULL;
  if (!dy) return MPT_OK; /* the output took no part in the loss */
  MPT_RETURN_IF(mpt_var_grad_acc(tape, x, &dx));
  MPT_RETURN_IF(mpt_var_grad_acc(tape, w, &dw));
  if (b) MPT_RETURN_IF(mpt_var_grad_acc(tape, b, &db));

  const conv_ctx *c = mpt_node_ctx(node);
  const mpt_conv_geom g = c->g;
  const int64_t n = c->n, o = c->o;
  const int64_t kdim = g.channels * g.kernel_h * g.kernel_w, l = g.out_h * g.out_w;
  const int64_t x_img = g.channels * g.height * g.width, y_img = o * l;
  const float *xv = mpt_var_value(x)->data, *wv = mpt_var_value(w)->data;
  float *col = c->col;

  const mpt_precision pr = c->precision;
  const int bf16 = pr == MPT_PRECISION_BF16;
  if (c->library) {
    if (dw)
      MPT_RETURN_IF(bf16 ? mpt_op_conv2d_backward_weights_bf16(s, &g, n, o, xv, dy, dw, db)
                         : mpt_op_conv2d_backward_weights(s, &g, n, o, xv, dy, dw, db));
    else if (db) MPT_RETURN_IF(mpt_op_bias_backward(s, db, dy, n, o, l));
    if (dx)
      MPT_RETURN_IF(bf16 ? mpt_op_conv2d_backward_data_bf16(s, &g, n, o, wv, dy, dx)
                         : mpt_op_conv2d_backward_data(s, &g, n, o, wv, dy, dx));
    return MPT_OK;
  }
  if (db) MPT_RETURN_IF(mpt_op_bias_backward(s, db, dy, n, o, l));
  if (!dw && !dx) return MPT_OK;
  for (int64_t i = 0; i < n; i++) {
    const float *dy_i = dy + i * y_img;
    if (dw) {
      MPT_RETURN_IF(mpt_op_im2col(s, &g, xv + i * x_img, col));
      /* dW [O, K] += dy_i [O, L] x col^T [L, K] */
      MPT_RETURN_IF(mpt_op_gemm_ex(s, pr, 0, 1, o, kdim, l, 1.0f, dy_i, l, col, l, 1.0f, dw,
                                   kdim));
    }
    if (dx) {
      /* dcol [K, L] = W^T [K, O] x dy_i [O, L], then scattered back into the image */
      MPT_RETURN_IF(mpt_op_gemm_ex(s, pr, 1, 0, kdim, l, o, 1.0f, wv, kdim, dy_i, l, 0.0f, col,
                                   l));
      MPT_RETURN_IF(mpt_op_col2im(s, &g, col, dx + i * x_img));
    }
  }
  return MPT_OK;
}

mpt_status mpt_nn_conv2d(mpt_tape *tape, mpt_var *x, mpt_var *w, mpt_var *b, int64_t stride,
                         int64_t pad, mpt_var **y) {
  char xs[64], ws[64], bs[64];
  if (!tape || !x || !w || !y)
    return MPT_FAIL(MPT_EINVAL, "conv2d: NULL argument (tape %p, x %p, w %p, y %p)",
                    (void *)tape, (void *)x, (void *)w, (void *)y);
  const mpt_tensor *xt = mpt_var_value(x), *wt = mpt_var_value(w);
  mpt_shape_str(xt->ndim, xt->shape, xs, sizeof xs);
  mpt_shape_str(wt->ndim, wt->shape, ws, sizeof ws);
  if (xt->dtype != MPT_F32 || wt->dtype != MPT_F32 || (b && mpt_var_value(b)->dtype != MPT_F32))
    return MPT_FAIL(MPT_EINVAL, "conv2d: x, weight and bias must be float32");
  if (xt->ndim != 4 || wt->ndim != 4 || wt->shape[1] != xt->shape[1])
    return MPT_FAIL(MPT_ESHAPE, "conv2d: input %s and weight %s (want [N, C, H, W] and "
                    "[O, C, kh, kw] with the same C)", xs, ws);
  const int64_t n = xt->shape[0], o = wt->shape[0];
  if (b && (mpt_var_value(b)->ndim != 1 || mpt_var_value(b)->shape[0] != o))
    return MPT_FAIL(MPT_ESHAPE, "conv2d: bias %s does not match weight %s (want [%lld])",
                    mpt_shape_str(mpt_var_value(b)->ndim, mpt_var_value(b)->shape, bs, sizeof bs), ws,
                    (long long)o);
  mpt_conv_geom g = {.channels = xt->shape[1], .height = xt->shape[2], .width = xt->shape[3],
                     .kernel_h = wt->shape[2], .kernel_w = wt->shape[3], .stride = stride,
                     .pad = pad};
  if (g.channels < 1 || g.height < 1 || g.width < 1 || o < 1 || g.kernel_h < 1 ||
      g.kernel_w < 1 || stride < 1 || pad < 0 || g.height + 2 * pad < g.kernel_h ||
      g.width + 2 * pad < g.kernel_w)
    return MPT_FAIL(MPT_EINVAL, "conv2d: input %s, weight %s, stride %lld, pad %lld: the "
                    "window does not fit or an extent is not positive", xs, ws,
                    (long long)stride, (long long)pad);
  MPT_RETURN_IF(mpt_conv_geom_resolve(&g));

  mpt_stream *s = mpt_tape_stream(tape);
  const int64_t kdim = g.channels * g.kernel_h * g.kernel_w, l = g.out_h * g.out_w;
  const int64_t x_img = g.channels * g.height * g.width, y_img = o * l;
  const int64_t yshape[4] = {n, o, g.out_h, g.out_w};
  const mpt_conv_algo algo = mpt_nn_conv_algo();
  const mpt_precision pr = mpt_tape_precision(tape);
  /* bf16: the library's bf16 convolutions where the backend has them, else im2col + bf16 GEMM */
  const int have_library = pr == MPT_PRECISION_BF16 ? mpt_op_conv2d_bf16_available(s)
                                                    : mpt_op_conv2d_available(s);
  const int library = algo == MPT_CONV_ALGO_LIBRARY ||
                      (algo == MPT_CONV_ALGO_AUTO && have_library);
  if (library && !have_library)
    return MPT_FAIL(MPT_ENOTSUP, "conv2d: the library convolution was asked for, but this "
                    "build has none for the tape's device (configure found no oneDNN?)");
  mpt_var *out = NULL;
  void *col = NULL;
  MPT_RETURN_IF(mpt_tape_new_var(tape, 4, yshape, MPT_F32, &out));

  const float *xv = xt->data, *wv = wt->data;
  float *yv = mpt_var_value(out)->data;
  if (library) {
    const float *bv = b ? mpt_var_value(b)->data : NULL;
    MPT_RETURN_IF(pr == MPT_PRECISION_BF16 ? mpt_op_conv2d_forward_bf16(s, &g, n, o, xv, wv, bv, yv)
                                           : mpt_op_conv2d_forward(s, &g, n, o, xv, wv, bv, yv));
  } else {
    MPT_RETURN_IF(mpt_tape_alloc(tape, (size_t)(kdim * l) * sizeof(float), &col));
    for (int64_t i = 0; i < n; i++) {
      MPT_RETURN_IF(mpt_op_im2col(s, &g, xv + i * x_img, col));
      MPT_RETURN_IF(mpt_op_gemm_ex(s, pr, 0, 0, o, l, kdim, 1.0f, wv, kdim, col, l, 0.0f,
                                yv + i * y_img, l));
    }
    if (b) MPT_RETURN_IF(mpt_op_bias_add(s, yv, mpt_var_value(b)->data, n, o, l));
  }

  mpt_var *inputs[3] = {x, w, b};
  const int ninputs = b ? 3 : 2;
  if (mpt_tape_needs_grad(tape, inputs, ninputs)) {
    mpt_node *node = NULL;
    MPT_RETURN_IF(mpt_tape_record(tape, "conv2d", conv2d_backward, inputs, ninputs, out, &node));
    *(conv_ctx *)mpt_node_ctx(node) = (conv_ctx){.g = g, .n = n, .o = o, .library = library,
                                                 .col = col, .precision = pr};
  }
  *y = out;
  return MPT_OK;
}

mpt_status mpt_conv2d_add(mpt_model *model, const char *name, int64_t in_channels,
                          int64_t out_channels, int64_t kernel, int64_t stride, int64_t pad,
                          int bias, mpt_conv2d *layer) {
  if (!model || !name || !layer)
    return MPT_FAIL(MPT_EINVAL, "conv2d_add: NULL model, name or layer");
  if (in_channels < 1 || out_channels < 1 || kernel < 1 || stride < 1 || pad < 0)
    return MPT_FAIL(MPT_EINVAL, "conv2d_add '%s': in %lld, out %lld, kernel %lld, stride %lld "
                    "must be >= 1 and pad %lld >= 0", name, (long long)in_channels,
                    (long long)out_channels, (long long)kernel, (long long)stride,
                    (long long)pad);
  char pname[256];
  if (snprintf(pname, sizeof pname, "%s.weight", name) >= (int)sizeof pname)
    return MPT_FAIL(MPT_EINVAL, "conv2d_add: name '%s' is too long", name);
  const int64_t fan_in = in_channels * kernel * kernel;
  const int64_t wshape[4] = {out_channels, in_channels, kernel, kernel};
  mpt_conv2d l = {.weight = -1, .bias = -1, .in_channels = in_channels,
                  .out_channels = out_channels, .kernel = kernel, .stride = stride, .pad = pad};
  MPT_RETURN_IF(mpt_model_add_param(model, pname, 4, wshape, MPT_INIT_FAN_IN, fan_in, &l.weight));
  if (bias) {
    snprintf(pname, sizeof pname, "%s.bias", name);
    MPT_RETURN_IF(mpt_model_add_param(model, pname, 1, &out_channels, MPT_INIT_FAN_IN, fan_in,
                                      &l.bias));
  }
  *layer = l;
  return MPT_OK;
}

mpt_status mpt_conv2d_forward(mpt_tape *tape, const mpt_conv2d *layer, mpt_var *x,
                              mpt_var **y) {
  if (!tape || !layer) return MPT_FAIL(MPT_EINVAL, "conv2d_forward: NULL tape or layer");
  mpt_var *w = NULL, *b = NULL;
  MPT_RETURN_IF(mpt_tape_param(tape, layer->weight, &w));
  if (layer->bias >= 0) MPT_RETURN_IF(mpt_tape_param(tape, layer->bias, &b));
  return mpt_nn_conv2d(tape, x, w, b, layer->stride, layer->pad, y);
}
