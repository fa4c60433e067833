/* Tests of the GPT-2 model (include/mpitrain/transformer.h; src/nn/gpt.c).
 *
 * Oracles:
 * - Layout: the parameters are registered layer-major (wte, wpe, then each layer's 12 tensors
 *   ln1w .. fcprojb, then lnfw, lnfb), each with the name, shape and size that
 *   mpt_gpt_layout_compute (the model file's layout) gives its kind, contiguous in the flat
 *   buffer; the gpt2 preset has 124,475,904 parameters (the figure llm.c prints for GPT-2 124M),
 *   gpt2-medium 354,871,296 and gpt2-large 774,090,240 (their layouts only).
 * - Initialisation: the sample mean and standard deviation of each weight kind against
 *   N(0, 0.02) (and 0.02 / sqrt(2 L) for the residual projections) within 5 standard errors;
 *   LayerNorm weights exactly 1, biases exactly 0; one seed gives bit-identical models,
 *   another seed different ones.
 * - Gradients: central finite differences of the loss (in double, on the float forward) against
 *   the tape's backward for a sample of elements of EVERY parameter of a tiny GPT (L 2, H 2,
 *   C 16, T 8, V 23 -> Vp 128, B 2), whose parameters are redrawn U(-0.5, 0.5) so that the
 *   gradients are O(1e-3..1) (at the GPT-2 initialisation most are below the FD tolerance).
 *   The tied wte is used twice, its hook fires once, and its rows of tokens the batch never
 *   holds still get the head's gradient.
 * - Clipping (mpt_clip_grad_norm): gradients 3 and -4 have the global norm 5 exactly; under
 *   max_norm nothing changes, over it both are scaled by max_norm / (5 + 1e-6), bit for bit as
 *   PyTorch's formula in float; a NaN gradient gives a NaN norm and no scaling.
 * - Checkpoints: 2 steps (clipping + AdamW with decay groups), mpt_ckpt_save, mpt_ckpt_load
 *   into a model of another seed, 2 more steps: bit-identical to 4 steps straight.
 * - Files: the saved file holds, at file tensor k's offset + layer l's share, exactly the
 *   parameter named "h{l}.<name of k>" (read back from the raw bytes), so the file is in llm.c's
 *   per-kind order while the model is layer-major; save -> load into a model of another seed
 *   gives bit-identical parameters and the same loss bit for bit, and saving that model again
 *   writes the same bytes; a file cut short is refused and leaves the model untouched; a file
 *   of another config is refused, naming the field. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mpitrain/ckpt.h"
#include "mpitrain/optim.h"
#include "mpitrain/gpt_file.h"
#include "mpitrain/transformer.h"
#include "check_util.h"


enum { TB = 2, TT = 8 };

static mpt_gpt_config tiny_config(void) {
  mpt_gpt_config c = {.max_seq_len = TT, .vocab_size = 23, .num_layers = 2, .num_heads = 2,
                      .channels = 16, .padded_vocab_size = 0};
  return c;
}

/* ------------------------------------------------------------------------------------------ */
/* Layout                                                                                     */

/* The file tensor kind (0..15) of a parameter name ("h3.qkvw" -> 4, "lnfb" -> 15) and its
 * layer (0 for the 4 tensors that have none); -1 for an unknown name. */
static int kind_of(const char *name, int *layer) {
  *layer = 0;
  const char *base = name;
  if (name[0] == 'h' && strchr(name, '.')) {
    *layer = atoi(name + 1);
    base = strchr(name, '.') + 1;
  }
  for (int k = 0; k < MPT_GPT_NUM_TENSORS; k++)
    if (strcmp(base, mpt_gpt_tensor_name(k)) == 0) return k;
  return -1;
}

static int per_layer_kind(int k) { return k >= 2 && k < 14; }

static void check_layout(const mpt_gpt_config *config) {
  mpt_model *m = NULL;
  mpt_gpt_layout lay;
  OK(mpt_model_init_gpt(&m, mpt_device_cpu(), config, 1));
  OK(mpt_gpt_layout_compute(config, &lay));
  const int L = config->num_layers;
  ck_assert_int_eq(mpt_model_num_params(m), 12 * L + 4);
  ck_assert_int_eq(mpt_model_param_count(m), lay.total);
  /* the expected registration order: (kind, layer) pairs, layer-major */
  int want_kind[12 * 64 + 4], want_layer[12 * 64 + 4], n = 0;
  ck_assert_int_le(L, 64);
  want_kind[n] = 0, want_layer[n++] = 0;
  want_kind[n] = 1, want_layer[n++] = 0;
  for (int l = 0; l < L; l++)
    for (int k = 2; k < 14; k++) want_kind[n] = k, want_layer[n++] = l;
  want_kind[n] = 14, want_layer[n++] = 0;
  want_kind[n] = 15, want_layer[n++] = 0;
  int64_t offset = 0;
  for (int index = 0; index < n; index++) {
    const int k = want_kind[index], l = want_layer[index], per_layer = per_layer_kind(k);
    const mpt_param_info *pi = mpt_model_param_info(m, index);
    char want[48];
    if (per_layer)
      snprintf(want, sizeof want, "h%d.%s", l, mpt_gpt_tensor_name(k));
    else
      snprintf(want, sizeof want, "%s", mpt_gpt_tensor_name(k));
    ck_assert_str_eq(pi->name, want);
    ck_assert_int_eq(pi->offset, offset);
    ck_assert_int_eq(pi->count, per_layer ? lay.count[k] / L : lay.count[k]);
    ck_assert_int_eq(pi->ndim, per_layer ? lay.ndim[k] - 1 : lay.ndim[k]);
    for (int d = 0; d < pi->ndim; d++) ck_assert_int_eq(pi->shape[d], lay.shape[k][d + per_layer]);
    offset += pi->count;
  }
  ck_assert_int_eq(offset, lay.total);
  mpt_model_free(m);
}

START_TEST(test_layout_is_layer_major) {
  mpt_gpt_config c = tiny_config();
  check_layout(&c);
  ck_assert_int_eq(mpt_gpt_padded_vocab(c.vocab_size), 128);
  OK(mpt_gpt_config_preset("gpt-mini", &c));
  ck_assert_int_eq(c.num_layers, 6);
  ck_assert_int_eq(c.channels, 384);
  ck_assert_int_eq(c.padded_vocab_size, 256);
  check_layout(&c);
  OK(mpt_gpt_config_preset("gpt2", &c));
  ck_assert_int_eq(c.padded_vocab_size, 50304);
  mpt_model *m = NULL;
  OK(mpt_model_init_gpt(&m, mpt_device_cpu(), &c, 1));
  ck_assert_int_eq(mpt_model_param_count(m), 124475904);
  ck_assert_int_eq(mpt_model_num_params(m), 12 * 12 + 4);
  mpt_model_free(m);
  /* the larger GPT-2s: their layouts (as llm.c's model files hold them), without the memory */
  mpt_gpt_layout lay;
  OK(mpt_gpt_config_preset("gpt2-medium", &c));
  ck_assert(c.num_layers == 24 && c.num_heads == 16 && c.channels == 1024);
  ck_assert(c.max_seq_len == 1024 && c.vocab_size == 50257 && c.padded_vocab_size == 50304);
  OK(mpt_gpt_layout_compute(&c, &lay));
  ck_assert_int_eq(lay.total, 354871296);
  OK(mpt_gpt_config_preset("gpt2-large", &c));
  ck_assert(c.num_layers == 36 && c.num_heads == 20 && c.channels == 1280);
  ck_assert(c.max_seq_len == 1024 && c.vocab_size == 50257 && c.padded_vocab_size == 50304);
  OK(mpt_gpt_layout_compute(&c, &lay));
  ck_assert_int_eq(lay.total, 774090240);
  ck_assert_int_eq(mpt_gpt_config_preset("gpt3", &c), MPT_EINVAL);
  c = tiny_config();
  c.num_heads = 3; /* 16 channels are not 3 heads */
  ck_assert_int_eq(mpt_model_init_gpt(&m, mpt_device_cpu(), &c, 1), MPT_EINVAL);
  ck_assert_ptr_null(m);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* Initialisation                                                                             */

START_TEST(test_init_is_gpt2s) {
  mpt_gpt_config c = {.max_seq_len = 64, .vocab_size = 200, .num_layers = 3, .num_heads = 4,
                      .channels = 64};
  mpt_gpt_layout lay;
  mpt_model *a = NULL, *b = NULL, *d = NULL;
  OK(mpt_gpt_layout_compute(&c, &lay));
  OK(mpt_model_init_gpt(&a, mpt_device_cpu(), &c, 5));
  OK(mpt_model_init_gpt(&b, mpt_device_cpu(), &c, 5));
  OK(mpt_model_init_gpt(&d, mpt_device_cpu(), &c, 6));
  const size_t nbytes = (size_t)lay.total * sizeof(float);
  ck_assert_mem_eq(mpt_model_params(a), mpt_model_params(b), nbytes);
  ck_assert(memcmp(mpt_model_params(a), mpt_model_params(d), nbytes) != 0);
  const float *p = mpt_model_params(a);
  /* per kind, over its parameters (found by name): count, sum, sum of squares; constants */
  double cnt[MPT_GPT_NUM_TENSORS] = {0}, sum[MPT_GPT_NUM_TENSORS] = {0},
         sq[MPT_GPT_NUM_TENSORS] = {0};
  for (int i = 0; i < mpt_model_num_params(a); i++) {
    const mpt_param_info *pi = mpt_model_param_info(a, i);
    int layer = -1, k = kind_of(pi->name, &layer);
    ck_assert_msg(k >= 0, "unknown parameter %s", pi->name);
    const float *x = p + pi->offset;
    int weight = k == 0 || k == 1 || k == 4 || k == 6 || k == 10 || k == 12;
    for (int64_t j = 0; j < pi->count; j++) {
      if (!weight) {
        float want = (k == 2 || k == 8 || k == 14) ? 1.0f : 0.0f; /* LayerNorm weights */
        ck_assert_msg(x[j] == want, "%s[%lld] = %g, want %g", pi->name, (long long)j,
                      (double)x[j], (double)want);
      }
      sum[k] += x[j];
      sq[k] += (double)x[j] * x[j];
    }
    cnt[k] += (double)pi->count;
  }
  for (int k = 0; k < MPT_GPT_NUM_TENSORS; k++) {
    ck_assert_int_eq((int64_t)cnt[k], lay.count[k]);
    int weight = k == 0 || k == 1 || k == 4 || k == 6 || k == 10 || k == 12;
    if (!weight) continue;
    const double n = cnt[k];
    double sigma = (k == 6 || k == 12) ? 0.02 / sqrt(2.0 * c.num_layers) : 0.02;
    double mean = sum[k] / n, sd = sqrt(sq[k] / n - mean * mean);
    /* standard errors of the sample mean and std of n normal draws: sigma / sqrt(n) and
     * sigma / sqrt(2 n); 5 of them. The residual scale 1/sqrt(6) = 0.41 is far outside. */
    ck_assert_msg(fabs(mean) < 5 * sigma / sqrt(n), "%s: mean %g", mpt_gpt_tensor_name(k), mean);
    ck_assert_msg(fabs(sd - sigma) < 5 * sigma / sqrt(2.0 * n), "%s: std %g, want %g (n %g)",
                  mpt_gpt_tensor_name(k), sd, sigma, n);
  }
  /* re-initialising from the same seed gives the model back; a model that is not this GPT is
   * refused */
  float *before = malloc(nbytes);
  ck_assert_ptr_nonnull(before);
  memcpy(before, p, nbytes);
  memset(mpt_model_params(a), 0, nbytes);
  OK(mpt_gpt_init_weights(a, &c, 5));
  ck_assert_mem_eq(mpt_model_params(a), before, nbytes);
  free(before);
  mpt_gpt_config other = c;
  other.num_layers = 2;
  ck_assert_int_eq(mpt_gpt_init_weights(a, &other, 5), MPT_ESHAPE);
  mpt_model *mlp = NULL;
  mpt_mlp_config mc = mpt_mlp_config_default();
  OK(mpt_model_init_mlp(&mlp, mpt_device_cpu(), &mc, 1));
  ck_assert_int_eq(mpt_gpt_init_weights(mlp, &c, 5), MPT_ESHAPE);
  ck_assert_int_eq(mpt_gpt_save(mlp, &c, "/tmp/never_written.bin"), MPT_ESHAPE);
  mpt_model_free(mlp);
  mpt_model_free(a);
  mpt_model_free(b);
  mpt_model_free(d);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* Forward, loss, gradients                                                                   */

typedef struct fx {
  mpt_gpt_config cfg;
  mpt_model *model;
  mpt_tape *tape;
  int32_t tokens[TB * TT], targets[TB * TT];
  mpt_tensor tok, tgt;
} fx;

static void fx_init(fx *f, uint64_t seed) {
  memset(f, 0, sizeof *f);
  f->cfg = tiny_config();
  OK(mpt_model_init_gpt(&f->model, mpt_device_cpu(), &f->cfg, seed));
  OK(mpt_tape_init(&f->tape, f->model, NULL));
  const int64_t shape[2] = {TB, TT};
  for (int i = 0; i < TB * TT; i++) {
    f->tokens[i] = (int32_t)((i * 7 + 3) % 19); /* tokens 19..22 never occur */
    f->targets[i] = (int32_t)((i * 5 + 1) % 23);
  }
  f->tok = mpt_tensor_view(f->tokens, mpt_device_cpu(), MPT_I32, 2, shape);
  f->tgt = mpt_tensor_view(f->targets, mpt_device_cpu(), MPT_I32, 2, shape);
}

static void fx_free(fx *f) {
  mpt_tape_free(f->tape);
  mpt_model_free(f->model);
}

/* The loss of the batch; with `grad`, zero_grad + backward too. */
static double loss_of(fx *f, int grad) {
  mpt_var *in = NULL, *logits = NULL, *loss = NULL;
  float value = 0;
  if (grad) OK(mpt_model_zero_grad(f->model, NULL));
  mpt_tape_reset(f->tape, 7);
  mpt_tape_set_grad_enabled(f->tape, grad);
  OK(mpt_tape_input(f->tape, &f->tok, &in));
  OK(mpt_model_forward(f->model, f->tape, in, &logits));
  const mpt_tensor *lt = mpt_var_value(logits);
  ck_assert_int_eq(lt->ndim, 3);
  ck_assert_int_eq(lt->shape[0], TB);
  ck_assert_int_eq(lt->shape[1], TT);
  ck_assert_int_eq(lt->shape[2], 128);
  OK(mpt_nn_cross_entropy_vocab(f->tape, logits, &f->tgt, f->cfg.vocab_size, &loss));
  OK(mpt_var_item(f->tape, loss, &value));
  if (grad) OK(mpt_tape_backward(f->tape, loss, 1.0f));
  mpt_tape_set_grad_enabled(f->tape, 1);
  return value;
}

/* As tests/test_gpt_ops.c: eps 1e-2 turns the float forward's rounding (~1e-7 |L|, |L| ~ 3)
 * into ~1e-5 and the truncation error is O(eps^2); gradients here are O(1e-3..1). */
#define FD_EPS 1e-2
#define FD_RTOL 2e-3
#define FD_ATOL 1e-4

static void ready_count(void *user, int index) { ((int *)user)[index]++; }

START_TEST(test_tiny_gpt_gradients_match_finite_differences) {
  fx f;
  fx_init(&f, 3);
  const int np = mpt_model_num_params(f.model);
  mpt_rng rng;
  mpt_rng_seed(&rng, 11);
  mpt_rng_fill_uniform(&rng, mpt_model_params(f.model), mpt_model_param_count(f.model), -0.5f,
                       0.5f);
  static int ready[64];
  memset(ready, 0, sizeof ready);
  mpt_tape_set_grad_hook(f.tape, ready_count, ready);
  const double loss = loss_of(&f, 1);
  mpt_tape_set_grad_hook(f.tape, NULL, NULL);
  ck_assert(isfinite(loss));
  ck_assert_int_eq(mpt_tape_param_uses(f.tape, 0), 2); /* embedding and head */
  for (int i = 0; i < np; i++) ck_assert_int_eq(ready[i], 1);
  float *grads = malloc((size_t)mpt_model_param_count(f.model) * sizeof *grads);
  ck_assert_ptr_nonnull(grads);
  memcpy(grads, mpt_model_grads(f.model),
         (size_t)mpt_model_param_count(f.model) * sizeof *grads);
  float *p = mpt_model_params(f.model);
  const int C = f.cfg.channels;
  int checked = 0;
  for (int i = 0; i < np; i++) {
    const mpt_param_info *pi = mpt_model_param_info(f.model, i);
    /* 4 elements per parameter, spread over it; for wte, rows of a token seen (3: embedding
     * and head) and of one never seen (20: the head only) */
    int64_t picks[4];
    for (int s = 0; s < 4; s++) picks[s] = (pi->count * s) / 4 + (s * 5 + i) % (pi->count / 4);
    if (i == 0) {
      picks[0] = 3 * C + 1;
      picks[1] = 3 * C + 9;
      picks[2] = 20 * C + 2;
      picks[3] = 127 * C + 5; /* a padding row: no gradient at all */
    }
    for (int s = 0; s < 4; s++) {
      const int64_t j = pi->offset + picks[s];
      const float saved = p[j];
      p[j] = (float)(saved + FD_EPS);
      const double up = (double)p[j] - saved, lp = loss_of(&f, 0);
      p[j] = (float)(saved - FD_EPS);
      const double down = (double)saved - p[j], lm = loss_of(&f, 0);
      p[j] = saved;
      const double numeric = (lp - lm) / (up + down), analytic = grads[j];
      const double tol = FD_RTOL * fmax(fabs(numeric), fabs(analytic)) + FD_ATOL;
      ck_assert_msg(fabs(numeric - analytic) <= tol, "d/d%s[%lld]: analytic %.6g numeric %.6g",
                    pi->name, (long long)picks[s], analytic, numeric);
      checked++;
    }
  }
  ck_assert_int_eq(checked, 4 * np);
  /* the tied wte: a seen token's row has both gradients, an unseen one the head's only,
   * a padding row none */
  ck_assert(fabs(grads[3 * C + 1]) > 1e-3 && fabs(grads[20 * C + 2]) > 1e-3);
  for (int c = 0; c < C; c++) ck_assert(grads[127 * C + c] == 0.0f);
  free(grads);
  fx_free(&f);
}
END_TEST

START_TEST(test_forward_rejects_bad_inputs) {
  fx f;
  fx_init(&f, 3);
  mpt_var *in = NULL, *out = NULL;
  float x[TB * TT] = {0};
  const int64_t shape[2] = {TB, TT}, long_shape[2] = {1, TT + 1};
  mpt_tensor ft = mpt_tensor_view(x, mpt_device_cpu(), MPT_F32, 2, shape);
  int32_t many[TT + 1] = {0};
  mpt_tensor lt = mpt_tensor_view(many, mpt_device_cpu(), MPT_I32, 2, long_shape);
  mpt_tape_reset(f.tape, 1);
  OK(mpt_tape_input(f.tape, &ft, &in));
  ck_assert_int_eq(mpt_model_forward(f.model, f.tape, in, &out), MPT_ESHAPE);
  OK(mpt_tape_input(f.tape, &lt, &in));
  ck_assert_int_eq(mpt_model_forward(f.model, f.tape, in, &out), MPT_ESHAPE);
  ck_assert_ptr_nonnull(strstr(mpt_last_error(), "T <= 8"));
  f.tokens[5] = 23; /* outside the vocabulary */
  OK(mpt_tape_input(f.tape, &f.tok, &in));
  ck_assert_int_eq(mpt_model_forward(f.model, f.tape, in, &out), MPT_EINVAL);
  fx_free(&f);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* Model files                                                                                */

START_TEST(test_save_load_round_trip) {
  char dir[] = "/tmp/test_gpt_XXXXXX", path[256];
  ck_assert_ptr_nonnull(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/model.bin", dir);
  fx a, b;
  fx_init(&a, 3);
  fx_init(&b, 4);
  const int64_t n = mpt_model_param_count(a.model);
  const size_t nbytes = (size_t)n * sizeof(float);
  ck_assert(memcmp(mpt_model_params(a.model), mpt_model_params(b.model), nbytes) != 0);
  const double loss_a = loss_of(&a, 0);
  OK(mpt_gpt_save(a.model, &a.cfg, path));
  /* the file holds llm.c's per-kind order: tensor k of layer l at offset[k] + l * its share,
   * equal to the parameter of that name */
  FILE *fp = fopen(path, "rb");
  ck_assert_ptr_nonnull(fp);
  int32_t header[256];
  ck_assert_int_eq(fread(header, 4, 256, fp), 256);
  ck_assert_int_eq(header[0], MPT_GPT_FILE_MAGIC);
  ck_assert_int_eq(header[7], 128);
  float *raw = malloc(nbytes + 1);
  ck_assert_ptr_nonnull(raw);
  ck_assert_int_eq(fread(raw, 1, nbytes + 1, fp), nbytes);
  fclose(fp);
  mpt_gpt_layout lay;
  OK(mpt_gpt_layout_compute(&a.cfg, &lay));
  for (int i = 0; i < mpt_model_num_params(a.model); i++) {
    const mpt_param_info *pi = mpt_model_param_info(a.model, i);
    int layer = 0, k = kind_of(pi->name, &layer);
    ck_assert(k >= 0);
    const int64_t at = lay.offset[k] + (per_layer_kind(k) ? layer * pi->count : 0);
    ck_assert_msg(memcmp(raw + at, mpt_model_params(a.model) + pi->offset,
                         (size_t)pi->count * sizeof(float)) == 0,
                  "%s is not at %lld of the file", pi->name, (long long)at);
  }
  /* not the flat buffer itself: the two orders differ (qkvw of layer 0 follows ln1b of all
   * layers in the file, ln1b of layer 0 in the model) */
  ck_assert(memcmp(raw, mpt_model_params(a.model), nbytes) != 0);
  OK(mpt_gpt_load(b.model, &b.cfg, path));
  ck_assert_mem_eq(mpt_model_params(b.model), mpt_model_params(a.model), nbytes);
  const double loss_b = loss_of(&b, 0);
  ck_assert(loss_a == loss_b);
  /* saving the loaded model writes the same bytes */
  char again[300];
  snprintf(again, sizeof again, "%s/again.bin", dir);
  OK(mpt_gpt_save(b.model, &b.cfg, again));
  fp = fopen(again, "rb");
  ck_assert_ptr_nonnull(fp);
  float *raw2 = malloc(nbytes + 1);
  ck_assert_ptr_nonnull(raw2);
  ck_assert_int_eq(fread(header, 4, 256, fp), 256);
  ck_assert_int_eq(fread(raw2, 1, nbytes + 1, fp), nbytes);
  fclose(fp);
  ck_assert_mem_eq(raw2, raw, nbytes);
  free(raw2);
  free(raw);
  /* a file that fails to read (cut short) leaves the model untouched */
  ck_assert_int_eq(truncate(again, 1024 + 4 * 100), 0);
  mpt_model *fresh = NULL;
  OK(mpt_model_init_gpt(&fresh, mpt_device_cpu(), &b.cfg, 4));
  float *before = malloc(nbytes);
  ck_assert_ptr_nonnull(before);
  memcpy(before, mpt_model_params(fresh), nbytes);
  ck_assert_int_eq(mpt_gpt_load(fresh, &b.cfg, again), MPT_EFORMAT);
  ck_assert_mem_eq(mpt_model_params(fresh), before, nbytes);
  free(before);
  mpt_model_free(fresh);
  unlink(again);
  /* a model of another config refuses the file, naming the field */
  mpt_gpt_config other = a.cfg;
  other.num_heads = 4;
  mpt_model *m = NULL;
  OK(mpt_model_init_gpt(&m, mpt_device_cpu(), &other, 1));
  ck_assert_int_eq(mpt_gpt_load(m, &other, path), MPT_ESHAPE);
  ck_assert_msg(strstr(mpt_last_error(), "head") != NULL, "%s", mpt_last_error());
  /* and a config that does not describe the model is refused before the file is read */
  other = a.cfg;
  other.channels = 32;
  ck_assert_int_eq(mpt_gpt_load(m, &other, path), MPT_ESHAPE);
  ck_assert_int_eq(mpt_gpt_save(m, &other, path), MPT_ESHAPE);
  mpt_model_free(m);
  unlink(path);
  rmdir(dir);
  fx_free(&a);
  fx_free(&b);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* Gradient clipping by the global norm                                                       */

START_TEST(test_clip_grad_norm_scales_by_the_global_norm) {
  fx f;
  fx_init(&f, 3);
  const int64_t n = mpt_model_param_count(f.model);
  float *g = mpt_model_grads(f.model);
  float norm = -1;
  /* 3 in the first parameter (wte), 4 in the last (lnfb): the global norm is 5, exactly */
  memset(g, 0, (size_t)n * sizeof *g);
  g[0] = 3.0f;
  g[n - 1] = -4.0f;
  OK(mpt_clip_grad_norm(f.model, NULL, 10.0f, &norm));
  ck_assert(norm == 5.0f);
  ck_assert(g[0] == 3.0f && g[n - 1] == -4.0f); /* under max_norm: untouched */
  OK(mpt_clip_grad_norm(f.model, NULL, 1.0f, &norm));
  ck_assert(norm == 5.0f);
  const float coef = (float)(1.0 / (5.0 + 1e-6));
  ck_assert(g[0] == 3.0f * coef && g[n - 1] == -4.0f * coef);
  OK(mpt_clip_grad_norm(f.model, NULL, 1.0f, &norm));
  ck_assert_double_eq_tol(norm, 1.0, 1e-6);
  /* the norm of a real gradient equals the sum of squares of all its parameters' views */
  loss_of(&f, 1);
  double sq = 0;
  for (int i = 0; i < mpt_model_num_params(f.model); i++) {
    mpt_tensor t = mpt_model_grad(f.model, i);
    for (int64_t j = 0; j < t.count; j++) sq += (double)((float *)t.data)[j] * ((float *)t.data)[j];
  }
  OK(mpt_clip_grad_norm(f.model, NULL, 1e30f, &norm));
  ck_assert_double_eq_tol(norm, sqrt(sq), 1e-6 * sqrt(sq));
  g[7] = NAN;
  float before = g[8];
  OK(mpt_clip_grad_norm(f.model, NULL, 1e-3f, &norm));
  ck_assert(isnan(norm) && g[8] == before);
  ck_assert_int_eq(mpt_clip_grad_norm(f.model, NULL, 0.0f, &norm), MPT_EINVAL);
  ck_assert_int_eq(mpt_clip_grad_norm(f.model, NULL, NAN, &norm), MPT_EINVAL);
  ck_assert_int_eq(mpt_clip_grad_norm(NULL, NULL, 1.0f, &norm), MPT_EINVAL);
  fx_free(&f);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* Checkpoints (ckpt.h) hold a GPT and its AdamW state: exact resume                          */

static mpt_optimizer *adamw_for(mpt_model *m) {
  mpt_optimizer_config c = mpt_optimizer_config_default();
  c.kind = MPT_OPTIM_ADAMW;
  c.lr = 1e-2f;
  c.beta2 = 0.95f;
  mpt_optimizer *opt = NULL;
  OK(mpt_optimizer_init(&opt, &c, mpt_device_cpu(), mpt_model_param_count(m)));
  mpt_param_group groups[64];
  int ng = 0;
  OK(mpt_param_groups_split_decay(m, 0.1f, groups, 64, &ng));
  OK(mpt_optimizer_set_groups(opt, groups, ng));
  return opt;
}

static void train_steps(fx *f, mpt_optimizer *opt, int steps) {
  for (int s = 0; s < steps; s++) {
    for (int i = 0; i < TB * TT; i++) f->tokens[i] = (f->tokens[i] + 5) % 23; /* a new batch */
    loss_of(f, 1);
    OK(mpt_clip_grad_norm(f->model, NULL, 0.5f, NULL));
    OK(mpt_optimizer_step_model(opt, f->model, NULL, 1e-2f));
  }
}

START_TEST(test_checkpoint_resume_is_exact) {
  char dir[] = "/tmp/test_gpt_ckpt_XXXXXX", path[256];
  ck_assert_ptr_nonnull(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/ckpt.bin", dir);
  fx a, b;
  fx_init(&a, 3);
  fx_init(&b, 9); /* another seed: the checkpoint must overwrite everything */
  mpt_optimizer *oa = adamw_for(a.model), *ob = adamw_for(b.model);
  const size_t nbytes = (size_t)mpt_model_param_count(a.model) * sizeof(float);
  float *straight = malloc(nbytes);
  ck_assert_ptr_nonnull(straight);
  /* a: 4 steps straight, from the same initial parameters the resumed run starts from */
  float *start = malloc(nbytes);
  ck_assert_ptr_nonnull(start);
  memcpy(start, mpt_model_params(a.model), nbytes);
  train_steps(&a, oa, 4);
  memcpy(straight, mpt_model_params(a.model), nbytes);
  /* again from the start: 2 steps, checkpoint, load into b, 2 more steps on b */
  memcpy(mpt_model_params(a.model), start, nbytes);
  mpt_optimizer_free(oa);
  oa = adamw_for(a.model);
  memcpy(a.tokens, b.tokens, sizeof a.tokens); /* the batches start over too */
  train_steps(&a, oa, 2);
  mpt_ckpt_meta meta = mpt_ckpt_meta_default();
  OK(mpt_ckpt_save(path, a.model, oa, &meta));
  OK(mpt_ckpt_load(path, b.model, ob, &meta));
  ck_assert_mem_eq(mpt_model_params(b.model), mpt_model_params(a.model), nbytes);
  memcpy(b.tokens, a.tokens, sizeof b.tokens);
  train_steps(&b, ob, 2);
  ck_assert_mem_eq(mpt_model_params(b.model), straight, nbytes);
  ck_assert(memcmp(straight, start, nbytes) != 0);
  free(straight);
  free(start);
  mpt_optimizer_free(oa);
  mpt_optimizer_free(ob);
  unlink(path);
  rmdir(dir);
  fx_free(&a);
  fx_free(&b);
}
END_TEST

static Suite *gpt_suite(void) {
  Suite *s = suite_create("gpt");
  TCase *tc = tcase_create("gpt");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, test_layout_is_layer_major);
  tcase_add_test(tc, test_init_is_gpt2s);
  tcase_add_test(tc, test_tiny_gpt_gradients_match_finite_differences);
  tcase_add_test(tc, test_forward_rejects_bad_inputs);
  tcase_add_test(tc, test_save_load_round_trip);
  tcase_add_test(tc, test_clip_grad_norm_scales_by_the_global_norm);
  tcase_add_test(tc, test_checkpoint_resume_is_exact);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(gpt_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
