/* The part of the PyTorch oracles' mpitrain side that does not depend on the model
 * (tests/gpt_torch_helper.c, tests/llama_torch_helper.c): the same perturbation of the
 * parameters, the same batch and the same training steps, written to the same files.
 *
 * CHECK(expr): an mpitrain call that must return MPT_OK; otherwise the call and the error
 * detail go to stderr and the enclosing function returns 1. write_raw(dir, name, data, nbytes):
 * dir/name holds the nbytes of data (0, or 1 with the path on stderr).
 * torch_helper_perturb(m, rng): seeds *rng with 17 and adds U(-0.05, 0.05) to every parameter
 * (so that biases and norm weights are not 0 and 1 and a swapped tensor shows).
 * torch_helper_train(dir, m, rng, T, V): draws the batch from *rng and trains, writing into dir
 * (little-endian, raw):
 *   tokens.bin   int32 [B, T + 1], B = 2: inputs are [:, :T], targets [:, 1:]
 *   logits.bin   float32 [B, T, V'] of the first forward (V' the model's logit width)
 *   loss.bin     float32 [1] the first loss
 *   grads.bin    float32 [N] the first gradients (the flat buffer, registration order)
 *   norms.bin    float32 [STEPS] the global gradient norm before clipping at each step
 *   losses.bin   float32 [STEPS] the loss at each step
 *   params.bin   float32 [N] the parameters after STEPS steps of: zero_grad, forward, loss over
 *                V classes, backward, mpt_clip_grad_norm(MAX_NORM), AdamW (lr 1e-2, betas
 *                0.9 / 0.95, eps 1e-8, weight decay 0.1 on the >= 2-D weights only) on the
 *                same batch.
 * The including file defines TORCH_HELPER_NAME (a string, the program's name, for messages)
 * before including this header. */
#ifndef MPT_TESTS_TORCH_HELPER_H
#define MPT_TESTS_TORCH_HELPER_H

#include <stdio.h>
#include <stdlib.h>

#include "mpitrain/optim.h"
#include "mpitrain/transformer.h"

enum { B = 2, STEPS = 10, MAX_GROUPS = 64 };
#define MAX_NORM 0.5f
#define LR 1e-2f

static int write_raw(const char *dir, const char *name, const void *data, size_t nbytes) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(data, 1, nbytes, f) != nbytes || fclose(f) != 0) {
    fprintf(stderr, TORCH_HELPER_NAME ": cannot write %s\n", path);
    return 1;
  }
  return 0;
}

#define CHECK(expr)                                                                           \
  do {                                                                                        \
    mpt_status st_ = (expr);                                                                  \
    if (st_ != MPT_OK) {                                                                      \
      fprintf(stderr, TORCH_HELPER_NAME ": %s: %s: %s\n", #expr, mpt_status_name(st_),        \
              mpt_last_error());                                                              \
      return 1;                                                                               \
    }                                                                                         \
  } while (0)

static int torch_helper_perturb(mpt_model *m, mpt_rng *rng) {
  const int64_t n = mpt_model_param_count(m);
  float *p = mpt_model_params(m);
  mpt_rng_seed(rng, 17);
  float *noise = malloc((size_t)n * sizeof *noise);
  if (!noise) return 1;
  mpt_rng_fill_uniform(rng, noise, n, -0.05f, 0.05f);
  for (int64_t i = 0; i < n; i++) p[i] += noise[i];
  free(noise);
  return 0;
}

/* Builds the optimizer into *opt (the caller frees it and *tape), writes tokens.bin from window
 * [B, T + 1] (tok and tgt [B, T] its inputs and targets, which outlive backward), then trains
 * and writes the other files. */
static int torch_helper_steps(const char *dir, mpt_model *m, mpt_tape **tape,
                              mpt_optimizer **opt, const int32_t *window, int32_t *tok,
                              int32_t *tgt, int T, int V) {
  const int64_t n = mpt_model_param_count(m);
  CHECK(mpt_tape_init(tape, m, NULL));
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++) {
      tok[b * T + t] = window[b * (T + 1) + t];
      tgt[b * T + t] = window[b * (T + 1) + t + 1];
    }
  if (write_raw(dir, "tokens.bin", window, (size_t)(B * (T + 1)) * sizeof *window)) return 1;
  const int64_t shape[2] = {B, T};
  mpt_tensor tt = mpt_tensor_view(tok, mpt_device_cpu(), MPT_I32, 2, shape);
  mpt_tensor gt = mpt_tensor_view(tgt, mpt_device_cpu(), MPT_I32, 2, shape);

  mpt_optimizer_config oc = mpt_optimizer_config_default();
  oc.kind = MPT_OPTIM_ADAMW;
  oc.lr = LR;
  oc.beta1 = 0.9f;
  oc.beta2 = 0.95f;
  oc.eps = 1e-8f;
  oc.weight_decay = 0.0f;
  CHECK(mpt_optimizer_init(opt, &oc, mpt_device_cpu(), n));
  mpt_param_group groups[MAX_GROUPS];
  int ng = 0;
  CHECK(mpt_param_groups_split_decay(m, 0.1f, groups, MAX_GROUPS, &ng));
  CHECK(mpt_optimizer_set_groups(*opt, groups, ng));

  float norms[STEPS], losses[STEPS];
  for (int step = 0; step < STEPS; step++) {
    mpt_var *in = NULL, *logits = NULL, *loss = NULL;
    CHECK(mpt_model_zero_grad(m, NULL));
    mpt_tape_reset(*tape, 1);
    CHECK(mpt_tape_input(*tape, &tt, &in));
    CHECK(mpt_model_forward(m, *tape, in, &logits));
    CHECK(mpt_nn_cross_entropy_vocab(*tape, logits, &gt, V, &loss));
    CHECK(mpt_var_item(*tape, loss, &losses[step]));
    CHECK(mpt_tape_backward(*tape, loss, 1.0f));
    if (step == 0) {
      const mpt_tensor *lt = mpt_var_value(logits);
      if (write_raw(dir, "logits.bin", lt->data, (size_t)lt->count * sizeof(float)) ||
          write_raw(dir, "loss.bin", &losses[0], sizeof(float)) ||
          write_raw(dir, "grads.bin", mpt_model_grads(m), (size_t)n * sizeof(float)))
        return 1;
    }
    CHECK(mpt_clip_grad_norm(m, NULL, MAX_NORM, &norms[step]));
    CHECK(mpt_optimizer_step_model(*opt, m, NULL, LR));
  }
  if (write_raw(dir, "norms.bin", norms, sizeof norms) ||
      write_raw(dir, "losses.bin", losses, sizeof losses) ||
      write_raw(dir, "params.bin", mpt_model_params(m), (size_t)n * sizeof(float)))
    return 1;
  return 0;
}

/* The batch of the top of this file, drawn from *rng (tokens below V), then the steps; the
 * caller frees m. */
static int torch_helper_train(const char *dir, mpt_model *m, mpt_rng *rng, int T, int V) {
  mpt_tape *tape = NULL;
  mpt_optimizer *opt = NULL;
  int32_t *window = malloc((size_t)(B * (T + 1)) * sizeof *window);
  int32_t *tok = malloc((size_t)(B * T) * sizeof *tok);
  int32_t *tgt = malloc((size_t)(B * T) * sizeof *tgt);
  int failed = !window || !tok || !tgt;
  if (!failed) {
    for (int i = 0; i < B * (T + 1); i++) window[i] = (int32_t)mpt_rng_below(rng, (uint64_t)V);
    failed = torch_helper_steps(dir, m, &tape, &opt, window, tok, tgt, T, V);
  }
  mpt_optimizer_free(opt);
  mpt_tape_free(tape);
  free(window);
  free(tok);
  free(tgt);
  return failed;
}

#endif
