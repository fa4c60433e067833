/* The built-in models of include/mpitrain/nn.h: the MLP (Linear -> ReLU [-> Dropout] per hidden
 * layer, then Linear) and the small CNN ([Conv2d -> (BatchNorm2d) -> ReLU -> MaxPool2d(2)] x 2
 * -> Flatten -> Linear -> ReLU -> (Dropout) -> Linear), the PyTorch tutorial shapes.
 *
 * Each init function validates its config (MPT_EINVAL naming the bad field), registers the
 * parameters in forward order (so that the DDP buckets, built in reverse registration order,
 * follow the order gradients become ready), installs a forward function whose context struct
 * holds the layer structs (owned by the model, freed by mpt_model_free), finalises the model
 * and initialises it from the seed. The forward contexts are read-only after init, so replicas
 * may share them. */
#include <stdio.h>
#include <stdlib.h>

#include "mpitrain/autograd.h"
#include "mpitrain/ops.h"

/* ------------------------------------------------------------------------------------------ */
/* MLP                                                                                        */

typedef struct mlp_ctx {
  int64_t input_size;
  int num_linear;                         /* num_hidden + 1 */
  mpt_linear fc[MPT_MLP_MAX_HIDDEN + 1];  /* fc[i]: "fc{i+1}" */
  float dropout;
} mlp_ctx;

mpt_mlp_config mpt_mlp_config_default(void) {
  mpt_mlp_config c = {.input_size = 784, .num_hidden = 2, .hidden = {512, 512},
                      .num_classes = 10, .dropout = 0.0f};
  return c;
}

static mpt_status mlp_config_check(const mpt_mlp_config *c) {
  if (c->input_size < 1)
    return MPT_FAIL(MPT_EINVAL, "mlp config: input_size = %lld must be >= 1",
                    (long long)c->input_size);
  if (c->num_hidden < 0 || c->num_hidden > MPT_MLP_MAX_HIDDEN)
    return MPT_FAIL(MPT_EINVAL, "mlp config: num_hidden = %d must be in [0, %d]", c->num_hidden,
                    MPT_MLP_MAX_HIDDEN);
  for (int i = 0; i < c->num_hidden; i++)
    if (c->hidden[i] < 1)
      return MPT_FAIL(MPT_EINVAL, "mlp config: hidden[%d] = %lld must be >= 1", i,
                      (long long)c->hidden[i]);
  if (c->num_classes < 1)
    return MPT_FAIL(MPT_EINVAL, "mlp config: num_classes = %lld must be >= 1",
                    (long long)c->num_classes);
  if (!(c->dropout >= 0.0f && c->dropout < 1.0f))
    return MPT_FAIL(MPT_EINVAL, "mlp config: dropout = %g must be in [0, 1)", (double)c->dropout);
  return MPT_OK;
}

static mpt_status mlp_forward(mpt_model *model, mpt_tape *tape, void *vctx, mpt_var *input,
                              mpt_var **output) {
  (void)model;
  const mlp_ctx *ctx = vctx;
  char xs[64];
  mpt_var *h = input;
  const mpt_tensor *xt = mpt_var_value(input);
  int64_t features = 1;
  for (int d = 1; d < xt->ndim; d++) features *= xt->shape[d];
  if (xt->ndim < 2 || features != ctx->input_size)
    return MPT_FAIL(MPT_ESHAPE, "mlp: input %s does not flatten to [N, %lld]",
                    mpt_shape_str(xt->ndim, xt->shape, xs, sizeof xs),
                    (long long)ctx->input_size);
  if (xt->ndim > 2) MPT_RETURN_IF(mpt_nn_flatten(tape, h, &h));
  for (int i = 0; i < ctx->num_linear; i++) {
    MPT_RETURN_IF(mpt_linear_forward(tape, &ctx->fc[i], h, &h));
    if (i + 1 == ctx->num_linear) break;
    MPT_RETURN_IF(mpt_nn_relu(tape, h, &h));
    if (ctx->dropout > 0.0f) MPT_RETURN_IF(mpt_nn_dropout(tape, h, ctx->dropout, &h));
  }
  *output = h;
  return MPT_OK;
}

/* Creates a model, hands it `ctx` (freed with the model from then on, or here on an early
 * failure), lets `add` register the layers, then finalises and initialises from `seed`. */
static mpt_status model_build(mpt_model **model, mpt_device device, void *ctx,
                              mpt_forward_fn forward,
                              mpt_status (*add)(mpt_model *m, void *ctx, const void *config),
                              const void *config, uint64_t seed) {
  mpt_status st = MPT_OK;
  mpt_model *m = NULL;
  st = mpt_model_init(&m, device);
  if (st != MPT_OK) {
    free(ctx);
    return st;
  }
  mpt_model_set_forward(m, forward, ctx, free);
  MPT_CHECK(add(m, ctx, config), fail);
  MPT_CHECK(mpt_model_finalize(m), fail);
  MPT_CHECK(mpt_model_init_params(m, seed), fail);
  *model = m;
  return MPT_OK;
fail:
  mpt_model_free(m);
  return st;
}

static mpt_status mlp_add(mpt_model *m, void *vctx, const void *vconfig) {
  mlp_ctx *ctx = vctx;
  const mpt_mlp_config *config = vconfig;
  int64_t in = config->input_size;
  for (int i = 0; i < ctx->num_linear; i++) {
    char name[16];
    int64_t out = i < config->num_hidden ? config->hidden[i] : config->num_classes;
    snprintf(name, sizeof name, "fc%d", i + 1);
    MPT_RETURN_IF(mpt_linear_add(m, name, in, out, 1, &ctx->fc[i]));
    in = out;
  }
  return MPT_OK;
}

mpt_status mpt_model_init_mlp(mpt_model **model, mpt_device device, const mpt_mlp_config *config,
                              uint64_t seed) {
  if (!model || !config) return MPT_FAIL(MPT_EINVAL, "mlp: NULL model or config");
  *model = NULL;
  MPT_RETURN_IF(mlp_config_check(config));
  mlp_ctx *ctx = calloc(1, sizeof *ctx);
  if (!ctx) return MPT_FAIL(MPT_ENOMEM, "mlp: forward context");
  ctx->input_size = config->input_size;
  ctx->num_linear = config->num_hidden + 1;
  ctx->dropout = config->dropout;
  return model_build(model, device, ctx, mlp_forward, mlp_add, config, seed);
}

/* ------------------------------------------------------------------------------------------ */
/* CNN                                                                                        */

typedef struct cnn_ctx {
  int64_t in_channels, height, width; /* the input each sample must have */
  mpt_conv2d conv1, conv2;
  int batchnorm;
  mpt_batchnorm bn1, bn2;
  mpt_linear fc1, fc2;
  float dropout;
} cnn_ctx;

mpt_cnn_config mpt_cnn_config_default(void) {
  mpt_cnn_config c = {.in_channels = 1, .height = 28, .width = 28, .conv1_channels = 16,
                      .conv2_channels = 32, .kernel = 5, .hidden = 128, .num_classes = 10,
                      .batchnorm = 0, .dropout = 0.0f};
  return c;
}

/* Spatial size after conv (pad kernel/2, stride 1) then 2x2 pooling, or -1 if the pooling does
 * not divide the conv output. */
static int64_t cnn_stage(int64_t size, int64_t kernel) {
  int64_t conv = size + 2 * (kernel / 2) - kernel + 1;
  return conv >= 2 && conv % 2 == 0 ? conv / 2 : -1;
}

static mpt_status cnn_config_check(const mpt_cnn_config *c, int64_t *out_h, int64_t *out_w) {
  const struct { const char *name; int64_t v; } pos[] = {
      {"in_channels", c->in_channels},       {"height", c->height},
      {"width", c->width},                   {"conv1_channels", c->conv1_channels},
      {"conv2_channels", c->conv2_channels}, {"kernel", c->kernel},
      {"hidden", c->hidden},                 {"num_classes", c->num_classes}};
  for (size_t i = 0; i < sizeof pos / sizeof pos[0]; i++)
    if (pos[i].v < 1)
      return MPT_FAIL(MPT_EINVAL, "cnn config: %s = %lld must be >= 1", pos[i].name,
                      (long long)pos[i].v);
  if (c->batchnorm != 0 && c->batchnorm != 1)
    return MPT_FAIL(MPT_EINVAL, "cnn config: batchnorm = %d must be 0 or 1", c->batchnorm);
  if (!(c->dropout >= 0.0f && c->dropout < 1.0f))
    return MPT_FAIL(MPT_EINVAL, "cnn config: dropout = %g must be in [0, 1)", (double)c->dropout);
  int64_t h1 = cnn_stage(c->height, c->kernel), w1 = cnn_stage(c->width, c->kernel);
  int64_t h2 = h1 > 0 ? cnn_stage(h1, c->kernel) : -1;
  int64_t w2 = w1 > 0 ? cnn_stage(w1, c->kernel) : -1;
  if (h2 < 1 || w2 < 1)
    return MPT_FAIL(MPT_EINVAL, "cnn config: a %lldx%lld input with kernel %lld: each 2x2 "
                    "max pooling needs an even conv output of at least 2 (e.g. odd kernel and "
                    "height, width divisible by 4)", (long long)c->height, (long long)c->width,
                    (long long)c->kernel);
  *out_h = h2;
  *out_w = w2;
  return MPT_OK;
}

static mpt_status cnn_forward(mpt_model *model, mpt_tape *tape, void *vctx, mpt_var *input,
                              mpt_var **output) {
  (void)model;
  const cnn_ctx *ctx = vctx;
  const mpt_tensor *xt = mpt_var_value(input);
  char xs[64];
  mpt_var *h = input;
  if (xt->ndim != 4 || xt->shape[1] != ctx->in_channels || xt->shape[2] != ctx->height ||
      xt->shape[3] != ctx->width)
    return MPT_FAIL(MPT_ESHAPE, "cnn: input %s, want [N, %lld, %lld, %lld]",
                    mpt_shape_str(xt->ndim, xt->shape, xs, sizeof xs),
                    (long long)ctx->in_channels, (long long)ctx->height, (long long)ctx->width);
  const mpt_conv2d *convs[2] = {&ctx->conv1, &ctx->conv2};
  const mpt_batchnorm *bns[2] = {&ctx->bn1, &ctx->bn2};
  for (int i = 0; i < 2; i++) {
    MPT_RETURN_IF(mpt_conv2d_forward(tape, convs[i], h, &h));
    if (ctx->batchnorm) MPT_RETURN_IF(mpt_batchnorm_forward(tape, bns[i], h, &h));
    MPT_RETURN_IF(mpt_nn_relu(tape, h, &h));
    MPT_RETURN_IF(mpt_nn_maxpool2d(tape, h, 2, 2, &h));
  }
  MPT_RETURN_IF(mpt_nn_flatten(tape, h, &h));
  MPT_RETURN_IF(mpt_linear_forward(tape, &ctx->fc1, h, &h));
  MPT_RETURN_IF(mpt_nn_relu(tape, h, &h));
  if (ctx->dropout > 0.0f) MPT_RETURN_IF(mpt_nn_dropout(tape, h, ctx->dropout, &h));
  MPT_RETURN_IF(mpt_linear_forward(tape, &ctx->fc2, h, &h));
  *output = h;
  return MPT_OK;
}

typedef struct cnn_add_args {
  const mpt_cnn_config *config;
  int64_t flat_features;
} cnn_add_args;

static mpt_status cnn_add(mpt_model *m, void *vctx, const void *vargs) {
  cnn_ctx *ctx = vctx;
  const cnn_add_args *args = vargs;
  const mpt_cnn_config *c = args->config;
  const int64_t k = c->kernel;
  MPT_RETURN_IF(mpt_conv2d_add(m, "conv1", c->in_channels, c->conv1_channels, k, 1, k / 2, 1,
                               &ctx->conv1));
  if (c->batchnorm) MPT_RETURN_IF(mpt_batchnorm_add(m, "bn1", c->conv1_channels, &ctx->bn1));
  MPT_RETURN_IF(mpt_conv2d_add(m, "conv2", c->conv1_channels, c->conv2_channels, k, 1, k / 2, 1,
                               &ctx->conv2));
  if (c->batchnorm) MPT_RETURN_IF(mpt_batchnorm_add(m, "bn2", c->conv2_channels, &ctx->bn2));
  MPT_RETURN_IF(mpt_linear_add(m, "fc1", args->flat_features, c->hidden, 1, &ctx->fc1));
  MPT_RETURN_IF(mpt_linear_add(m, "fc2", c->hidden, c->num_classes, 1, &ctx->fc2));
  return MPT_OK;
}

mpt_status mpt_model_init_cnn(mpt_model **model, mpt_device device, const mpt_cnn_config *config,
                              uint64_t seed) {
  int64_t oh = 0, ow = 0;
  if (!model || !config) return MPT_FAIL(MPT_EINVAL, "cnn: NULL model or config");
  *model = NULL;
  MPT_RETURN_IF(cnn_config_check(config, &oh, &ow));
  cnn_ctx *ctx = calloc(1, sizeof *ctx);
  if (!ctx) return MPT_FAIL(MPT_ENOMEM, "cnn: forward context");
  ctx->in_channels = config->in_channels;
  ctx->height = config->height;
  ctx->width = config->width;
  ctx->batchnorm = config->batchnorm;
  ctx->dropout = config->dropout;
  cnn_add_args args = {.config = config, .flat_features = config->conv2_channels * oh * ow};
  return model_build(model, device, ctx, cnn_forward, cnn_add, &args, seed);
}
