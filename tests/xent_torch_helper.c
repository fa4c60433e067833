/* The mpitrain side of the large-logit cross-entropy oracle (tests/test_xent_torch.sh,
 * tests/xent_torch.py).
 *
 * Usage: xent_torch_helper DIR
 * For each scale s of 1e1, 1e2, 1e3, 1e4 (index i = 0..3), the output head of a GPT on N = 16
 * positions: x [N, C] -> LayerNorm (weight, bias, eps 1e-5) -> logits [N, VP] = h W^T (W [VP, C],
 * no bias, the tied head's shape) -> mpt_nn_cross_entropy_vocab over the first V = 50 of the
 * VP = 64 columns; W is drawn so that each position's logits are about +-s plus a spread
 * of a few units (run_scale).
 * Then the unfused mpt_nn_cross_entropy on the same logits' first V columns (a separate
 * parameter z [N, V] holding them). Writes into DIR, per scale (float32 / int32, raw,
 * little-endian), files named s<i>_<what>.bin:
 *   x [N, C], lnw [C], lnb [C], w [VP, C], targets [N] (int32)    the inputs
 *   logits [N, VP], loss [1], dlogits [N, VP]                      the fused loss
 *   dx [N, C], dlnw [C], dlnb [C], dw [VP, C]                      gradients through the layer
 *   loss2 [1], dz [N, V]                                           the unfused loss
 * Exit status 0, or 1 with the error on stderr. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpitrain/nn.h"
#include "mpitrain/transformer.h"

enum { N = 16, C = 16, V = 50, VP = 64, SCALES = 4 };

static int write_raw(const char *dir, int si, const char *name, const void *data,
                     size_t nbytes) {
  char path[1024];
  snprintf(path, sizeof path, "%s/s%d_%s.bin", dir, si, name);
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(data, 1, nbytes, f) != nbytes || fclose(f) != 0) {
    fprintf(stderr, "xent_torch_helper: cannot write %s\n", path);
    return 1;
  }
  return 0;
}

#define CHECK(expr)                                                                           \
  do {                                                                                        \
    mpt_status st_ = (expr);                                                                  \
    if (st_ != MPT_OK) {                                                                      \
      fprintf(stderr, "xent_torch_helper: %s: %s: %s\n", #expr, mpt_status_name(st_),         \
              mpt_last_error());                                                              \
      return 1;                                                                               \
    }                                                                                         \
  } while (0)

/* Parameter indices, in registration order. */
enum { P_X, P_LNW, P_LNB, P_W, P_Z, NPARAMS };

static float *param(mpt_model *m, int i) { return mpt_model_param(m, i).data; }
static float *grad(mpt_model *m, int i) { return mpt_model_grad(m, i).data; }

static void fill(mpt_rng *rng, float *x, int64_t n, float lo, float hi) {
  mpt_rng_fill_uniform(rng, x, n, lo, hi);
}

/* One scale: the model m (parameters registered, finalised) gets its inputs, runs both losses
 * and writes the files. */
static int run_scale(const char *dir, int si, float s, mpt_model *m, mpt_tape *tape) {
  mpt_rng rng;
  mpt_rng_seed(&rng, 100 + (uint64_t)si);
  fill(&rng, param(m, P_X), N * C, -2.0f, 2.0f);
  fill(&rng, param(m, P_LNW), C, 0.8f, 1.2f);
  fill(&rng, param(m, P_LNB), C, -0.1f, 0.1f);
  /* Every row of W is s u plus its own U(-1, 1) entries, u in U(-0.5, 0.5)^C: LayerNorm's
   * output h has unit variance over the 16 channels, so each position's logits are a common
   * s (h . u), of magnitude about s, plus a spread of a few units over the columns: several
   * probabilities of a row are far from 0 and 1 (where a wrong one shows), and dLayerNorm
   * sums dlogits against the large common column s u, as a GPT's head does when its logits
   * drift to a large offset. */
  float u[C], *wd = param(m, P_W);
  fill(&rng, u, C, -0.5f, 0.5f);
  fill(&rng, wd, VP * C, -1.0f, 1.0f);
  for (int j = 0; j < VP; j++)
    for (int c = 0; c < C; c++) wd[j * C + c] += s * u[c];
  int32_t tg[N];
  for (int i = 0; i < N; i++) tg[i] = (int32_t)mpt_rng_below(&rng, V);
  tg[0] = V - 1; /* the last real column */
  const int64_t tshape[1] = {N};
  mpt_tensor tt = mpt_tensor_view(tg, mpt_device_cpu(), MPT_I32, 1, tshape);

  /* The fused head. */
  mpt_var *x = NULL, *lnw = NULL, *lnb = NULL, *w = NULL, *h = NULL, *logits = NULL;
  mpt_var *loss = NULL;
  float lv = 0.0f;
  CHECK(mpt_model_zero_grad(m, NULL));
  mpt_tape_reset(tape, 1);
  CHECK(mpt_tape_param(tape, P_X, &x));
  CHECK(mpt_tape_param(tape, P_LNW, &lnw));
  CHECK(mpt_tape_param(tape, P_LNB, &lnb));
  CHECK(mpt_tape_param(tape, P_W, &w));
  CHECK(mpt_nn_layernorm(tape, x, lnw, lnb, 1e-5f, &h));
  CHECK(mpt_nn_linear_nd(tape, h, w, NULL, &logits));
  CHECK(mpt_nn_cross_entropy_vocab(tape, logits, &tt, V, &loss));
  CHECK(mpt_var_item(tape, loss, &lv));
  CHECK(mpt_tape_backward(tape, loss, 1.0f));
  const mpt_tensor *lt = mpt_var_value(logits), *dlt = mpt_var_grad(logits);
  if (!dlt || !dlt->data) {
    fprintf(stderr, "xent_torch_helper: the logits have no gradient after backward\n");
    return 1;
  }
  if (write_raw(dir, si, "x", param(m, P_X), N * C * sizeof(float)) ||
      write_raw(dir, si, "lnw", param(m, P_LNW), C * sizeof(float)) ||
      write_raw(dir, si, "lnb", param(m, P_LNB), C * sizeof(float)) ||
      write_raw(dir, si, "w", param(m, P_W), VP * C * sizeof(float)) ||
      write_raw(dir, si, "targets", tg, sizeof tg) ||
      write_raw(dir, si, "logits", lt->data, N * VP * sizeof(float)) ||
      write_raw(dir, si, "loss", &lv, sizeof lv) ||
      write_raw(dir, si, "dlogits", dlt->data, N * VP * sizeof(float)) ||
      write_raw(dir, si, "dx", grad(m, P_X), N * C * sizeof(float)) ||
      write_raw(dir, si, "dlnw", grad(m, P_LNW), C * sizeof(float)) ||
      write_raw(dir, si, "dlnb", grad(m, P_LNB), C * sizeof(float)) ||
      write_raw(dir, si, "dw", grad(m, P_W), VP * C * sizeof(float)))
    return 1;

  /* The unfused loss on the same logits (their first V columns). */
  float *z = param(m, P_Z);
  const float *l = lt->data;
  for (int r = 0; r < N; r++) memcpy(z + r * V, l + r * VP, V * sizeof(float));
  mpt_var *zv = NULL, *loss2 = NULL;
  float lv2 = 0.0f;
  CHECK(mpt_model_zero_grad(m, NULL));
  mpt_tape_reset(tape, 1);
  CHECK(mpt_tape_param(tape, P_Z, &zv));
  CHECK(mpt_nn_cross_entropy(tape, zv, &tt, &loss2));
  CHECK(mpt_var_item(tape, loss2, &lv2));
  CHECK(mpt_tape_backward(tape, loss2, 1.0f));
  if (write_raw(dir, si, "loss2", &lv2, sizeof lv2) ||
      write_raw(dir, si, "dz", grad(m, P_Z), N * V * sizeof(float)))
    return 1;
  return 0;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: xent_torch_helper DIR\n");
    return 2;
  }
  static const float scales[SCALES] = {1e1f, 1e2f, 1e3f, 1e4f};
  mpt_model *m = NULL;
  mpt_tape *tape = NULL;
  CHECK(mpt_model_init(&m, mpt_device_cpu()));
  static const struct {
    const char *name;
    int ndim;
    int64_t shape[2];
  } params[NPARAMS] = {{"x", 2, {N, C}}, {"lnw", 1, {C}}, {"lnb", 1, {C}},
                       {"w", 2, {VP, C}}, {"z", 2, {N, V}}};
  for (int i = 0; i < NPARAMS; i++) {
    int index = -1;
    CHECK(mpt_model_add_param(m, params[i].name, params[i].ndim, params[i].shape,
                              MPT_INIT_ZEROS, 1, &index));
    if (index != i) {
      fprintf(stderr, "xent_torch_helper: parameter %s got index %d\n", params[i].name, index);
      return 1;
    }
  }
  CHECK(mpt_model_finalize(m));
  CHECK(mpt_tape_init(&tape, m, NULL));
  for (int si = 0; si < SCALES; si++)
    if (run_scale(argv[1], si, scales[si], m, tape)) return 1;
  mpt_tape_free(tape);
  mpt_model_free(m);
  return 0;
}
