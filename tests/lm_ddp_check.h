/* The DDP equivalence checks of the language models (tests/test_gpt_ddp.c,
 * tests/test_llama_ddp.c), the same for every model built by a `make` function.
 *
 * lm_ddp_check_equivalence(model, make, c): W ranks with B sequences each train like ONE
 * process on the W*B sequences. Every rank also runs a plain model (no DDP) on the whole
 * combined batch, and at each of STEPS AdamW steps (betas 0.9 / 0.95, weight decay 0.1 on the
 * >= 2-D weights only, through mpt_param_groups_split_decay; clipping by the global norm at
 * MAX_NORM, active, computed by mpt_clip_grad_norm on the averaged gradients), from the same
 * parameters, DDP's averaged and clipped gradients equal the one process's (relative
 * EQUIV_TOL) over the whole flat buffer and over the embedding (parameter 0) alone, the
 * embedding is used twice when tied to the head (DDP must reduce it once, after both uses) and
 * once otherwise, and the global norm is the same on every rank and equals the one process's.
 * After each step the plain model takes the replica's parameters, the replicas must be
 * bit-identical across ranks at the end, and training must have moved the parameters.
 *
 * lm_ddp_check_first_bucket(model, make, tied): with 0.01 MiB caps (several buckets), a tape-level
 * grad-ready hook records the order in which backward finalises the parameters; the first
 * bucket (the first all-reduce DDP launches) must be complete within the first half of the
 * ready events, and every bucket no later than the next one (buckets launch in index order, so
 * a later bucket that is ready earlier waits anyway).
 *
 * Both are soft checks between expect_begin and expect_agree (tests/mpi_check.h). The
 * including file declares g_comm, g_rank and g_world and includes tests/mpi_check.h first;
 * `make(seed, tied)` builds the model on the CPU with T = TT tokens and VOCAB tokens. */
#ifndef MPT_TESTS_LM_DDP_CHECK_H
#define MPT_TESTS_LM_DDP_CHECK_H

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpitrain/comm.h"
#include "mpitrain/ddp.h"
#include "mpitrain/optim.h"
#include "mpitrain/transformer.h"

enum { STEPS = 10, PER_RANK = 2, TT = 8, VOCAB = 23, MAX_GROUPS = 64 };
#define MAX_NORM 0.5f /* the tiny models' global norms are above it: clipping is active */

/* Tolerance: from the same parameters the two runs differ only in float32 summation order
 * (GEMMs over B*T rows per rank then an average of W means, against GEMMs over W*B*T rows), a
 * few ulps of each gradient; a real fault (a sum instead of a mean, a bucket not reduced, the
 * tied embedding reduced before its second use, a stale gradient) changes gradients by 1e-2
 * and more. */
#define EQUIV_TOL 1e-5

/* The model of a test from `seed`; tied: the head is the token embedding. */
typedef mpt_model *(*lm_ddp_make_fn)(uint64_t seed, int tied);

typedef struct lm_ddp_case {
  int overlap;
  double cap_mb;
  int tied;
} lm_ddp_case;

static mpt_optimizer *adamw_make(mpt_model *m) {
  mpt_optimizer_config c = mpt_optimizer_config_default();
  c.kind = MPT_OPTIM_ADAMW;
  c.lr = 1e-2f;
  c.beta1 = 0.9f;
  c.beta2 = 0.95f;
  c.weight_decay = 0.0f; /* the groups set it */
  mpt_optimizer *opt = NULL;
  OK(mpt_optimizer_init(&opt, &c, mpt_device_cpu(), mpt_model_param_count(m)));
  mpt_param_group groups[MAX_GROUPS];
  int ng = 0;
  OK(mpt_param_groups_split_decay(m, 0.1f, groups, MAX_GROUPS, &ng));
  OK(mpt_optimizer_set_groups(opt, groups, ng));
  return opt;
}

/* Forward + loss of sequences [first, first + n) of the step's windows (T + 1 tokens each:
 * inputs, then the targets shifted by one), copied into tok / tgt (which outlive backward). */
static mpt_var *forward_loss(mpt_model *m, mpt_tape *tape, const int32_t *windows,
                             int64_t first, int64_t n, int32_t *tok, int32_t *tgt,
                             mpt_tensor *tt, mpt_tensor *gt) {
  const int64_t shape[2] = {n, TT};
  for (int64_t s = 0; s < n; s++)
    for (int t = 0; t < TT; t++) {
      tok[s * TT + t] = windows[(first + s) * (TT + 1) + t];
      tgt[s * TT + t] = windows[(first + s) * (TT + 1) + t + 1];
    }
  *tt = mpt_tensor_view(tok, mpt_device_cpu(), MPT_I32, 2, shape);
  *gt = mpt_tensor_view(tgt, mpt_device_cpu(), MPT_I32, 2, shape);
  mpt_var *in = NULL, *logits = NULL, *loss = NULL;
  mpt_tape_reset(tape, 1);
  OK(mpt_tape_input(tape, tt, &in));
  OK(mpt_model_forward(m, tape, in, &logits));
  OK(mpt_nn_cross_entropy_vocab(tape, logits, gt, VOCAB, &loss));
  return loss;
}

static void lm_ddp_check_equivalence(const char *model, lm_ddp_make_fn make,
                                     const lm_ddp_case *c) {
  const int64_t total = (int64_t)g_world * PER_RANK;
  expect_begin();
  mpt_model *ref = make(1234, c->tied);
  mpt_model *dm = make(1234 + (uint64_t)g_rank * 77, c->tied); /* DDP makes it rank 0's */
  mpt_tape *rt = NULL, *dt = NULL;
  OK(mpt_tape_init(&rt, ref, NULL));
  OK(mpt_tape_init(&dt, dm, NULL));
  mpt_ddp_config dc = mpt_ddp_config_default();
  dc.overlap = c->overlap;
  dc.bucket_cap_mb = c->cap_mb;
  dc.first_bucket_cap_mb = c->cap_mb < 1 ? c->cap_mb : 1;
  dc.timeout_ms = 30000;
  mpt_ddp *ddp = NULL;
  OK(mpt_ddp_init(&ddp, dm, g_comm, NULL, &dc));
  const int64_t count = mpt_model_param_count(ref);
  const int64_t emb_count = mpt_model_param_info(ref, 0)->count;
  EXPECT(memcmp(mpt_model_params(dm), mpt_model_params(ref), (size_t)count * sizeof(float)) == 0,
         "after mpt_ddp_init the replica is not rank 0's model");
  if (c->cap_mb < 0.1)
    EXPECT(mpt_ddp_num_buckets(ddp) > 1, "cap %g MiB: %d bucket(s), want several", c->cap_mb,
           mpt_ddp_num_buckets(ddp));
  float *init = malloc((size_t)count * sizeof *init);
  int32_t *windows = malloc((size_t)(total * (TT + 1)) * sizeof *windows);
  int32_t *rtok = malloc((size_t)(total * TT) * sizeof *rtok);
  int32_t *rtgt = malloc((size_t)(total * TT) * sizeof *rtgt);
  int32_t dtok[PER_RANK * TT], dtgt[PER_RANK * TT];
  ck_assert(init && windows && rtok && rtgt);
  memcpy(init, mpt_model_params(ref), (size_t)count * sizeof *init);
  mpt_optimizer *ropt = adamw_make(ref), *dopt = adamw_make(dm);
  double err = 0, emb_err = 0;
  int clipped = 0;
  mpt_tensor a, b;
  for (int step = 0; step < STEPS; step++) {
    mpt_rng rng;
    mpt_rng_seed(&rng, 1000 + (uint64_t)step);
    for (int64_t i = 0; i < total * (TT + 1); i++)
      windows[i] = (int32_t)mpt_rng_below(&rng, VOCAB);
    OK(mpt_model_zero_grad(ref, NULL));
    mpt_var *loss = forward_loss(ref, rt, windows, 0, total, rtok, rtgt, &a, &b);
    OK(mpt_tape_backward(rt, loss, 1.0f));
    float rnorm = 0, dnorm = 0;
    OK(mpt_clip_grad_norm(ref, NULL, MAX_NORM, &rnorm));
    OK(mpt_optimizer_step_model(ropt, ref, NULL, 1e-2f));
    /* DDP: rank r holds sequences [r B, (r + 1) B); the user's loop, no DDP call */
    OK(mpt_model_zero_grad(dm, NULL));
    loss = forward_loss(dm, dt, windows, (int64_t)g_rank * PER_RANK, PER_RANK, dtok, dtgt, &a,
                        &b);
    OK(mpt_tape_backward(dt, loss, 1.0f));
    EXPECT(mpt_tape_param_uses(dt, 0) == (c->tied ? 2 : 1),
           "the embedding used %d times, want %d (%s)", mpt_tape_param_uses(dt, 0),
           c->tied ? 2 : 1, c->tied ? "embedding and head" : "embedding");
    /* the reference's gradients are clipped already: compare after clipping DDP's too, on
     * the averaged gradients (the same norm and scale on every rank) */
    OK(mpt_clip_grad_norm(dm, NULL, MAX_NORM, &dnorm));
    EXPECT(same_on_all_ranks(&dnorm, 1), "step %d: the ranks clipped with different norms", step);
    if (dnorm > MAX_NORM) clipped++;
    double e = rel_diff(mpt_model_grads(dm), mpt_model_grads(ref), count);
    double ee = rel_diff(mpt_model_grads(dm), mpt_model_grads(ref), emb_count);
    double en = fabs((double)dnorm - rnorm) / rnorm;
    if (e > err) err = e;
    if (ee > emb_err) emb_err = ee;
    if (en > err) err = en;
    OK(mpt_optimizer_step_model(dopt, dm, NULL, 1e-2f));
    memcpy(mpt_model_params(ref), mpt_model_params(dm), (size_t)count * sizeof(float));
  }
  const double moved = rel_diff(mpt_model_params(ref), init, count);
  EXPECT(err <= EQUIV_TOL && emb_err <= EQUIV_TOL,
         "%s: overlap %d, cap %g MiB, tied %d: DDP and one-process gradients differ by %.3g "
         "(embedding %.3g) > %g", model, c->overlap, c->cap_mb, c->tied, err, emb_err, EQUIV_TOL);
  EXPECT(clipped > 0, "clipping was never active: the test would not see it");
  EXPECT(moved > 1000 * EQUIV_TOL, "training moved the parameters by only %.3g", moved);
  EXPECT(same_on_all_ranks(mpt_model_params(dm), count),
         "the replicas are not bit-identical across ranks after training");
  if (g_rank == 0)
    fprintf(stderr, "%s ddp W=%d overlap %d cap %g MiB tied %d (%d buckets): rel diff %.2e "
            "(embedding %.2e), moved %.2e, clipped in %d of %d steps\n", model, g_world,
            c->overlap, c->cap_mb, c->tied, mpt_ddp_num_buckets(ddp), err, emb_err, moved,
            clipped, STEPS);
  free(init);
  free(windows);
  free(rtok);
  free(rtgt);
  mpt_optimizer_free(ropt);
  mpt_optimizer_free(dopt);
  mpt_ddp_free(ddp);
  mpt_tape_free(rt);
  mpt_tape_free(dt);
  mpt_model_free(ref);
  mpt_model_free(dm);
  expect_agree();
}

static void ready_record(void *user, int index) {
  int *order = user; /* order[0]: events so far; order[1 + index]: the event's position */
  order[1 + index] = order[0]++;
}

static void lm_ddp_check_first_bucket(const char *model, lm_ddp_make_fn make, int tied) {
  expect_begin();
  mpt_model *m = make(1234, tied);
  mpt_tape *tape = NULL;
  OK(mpt_tape_init(&tape, m, NULL));
  mpt_ddp_config dc = mpt_ddp_config_default();
  dc.bucket_cap_mb = 0.01;
  dc.first_bucket_cap_mb = 0.01;
  dc.timeout_ms = 30000;
  mpt_ddp *ddp = NULL;
  OK(mpt_ddp_init(&ddp, m, g_comm, NULL, &dc));
  const int np = mpt_model_num_params(m), nb = mpt_ddp_num_buckets(ddp);
  int order[1 + 64];
  ck_assert_int_le(np, 64);
  for (int i = 0; i < 1 + np; i++) order[i] = i == 0 ? 0 : -1;
  mpt_tape_set_grad_hook(tape, ready_record, order);
  int32_t windows[PER_RANK * (TT + 1)], tok[PER_RANK * TT], tgt[PER_RANK * TT];
  for (int i = 0; i < PER_RANK * (TT + 1); i++) windows[i] = (i * 7 + g_rank) % VOCAB;
  mpt_tensor a, b;
  OK(mpt_model_zero_grad(m, NULL));
  mpt_var *loss = forward_loss(m, tape, windows, 0, PER_RANK, tok, tgt, &a, &b);
  OK(mpt_tape_backward(tape, loss, 1.0f));
  EXPECT(order[0] == np, "%d grad-ready events, want one per parameter (%d)", order[0], np);
  EXPECT(nb > 2, "%d buckets at 0.01 MiB, want several", nb);
  int prev = -1, first = -1;
  for (int k = 0; k < nb; k++) {
    const mpt_ddp_bucket_info *bi = mpt_ddp_bucket(ddp, k);
    int complete = -1; /* the position of the bucket's last ready event */
    for (int i = bi->last_param; i <= bi->first_param; i++)
      if (order[1 + i] > complete) complete = order[1 + i];
    if (k == 0) first = complete;
    EXPECT(complete >= prev, "bucket %d (parameters %d..%d) is complete at event %d, before "
           "bucket %d (event %d): buckets do not complete in launch order", k, bi->last_param,
           bi->first_param, complete, k - 1, prev);
    prev = complete;
  }
  EXPECT(first >= 0 && 2 * first < np, "the first bucket (parameters %d..%d) is complete only at "
         "ready event %d of %d, want in the first half",
         mpt_ddp_bucket(ddp, 0)->last_param, mpt_ddp_bucket(ddp, 0)->first_param, first, np);
  if (g_rank == 0)
    fprintf(stderr, "%s ddp: %d buckets at 0.01 MiB, the first complete at ready event %d "
            "of %d\n", model, nb, first, np);
  mpt_tape_set_grad_hook(tape, NULL, NULL);
  mpt_ddp_free(ddp);
  mpt_tape_free(tape);
  mpt_model_free(m);
  expect_agree();
}

#endif
