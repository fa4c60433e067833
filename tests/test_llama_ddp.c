/* DDP equivalence for the Llama model (src/nn/llama.c), run under mpirun with 2 and 3 ranks
 * (tests/test_llama_ddp_np2.sh, tests/test_llama_ddp_np3.sh):
 *
 * W ranks with B sequences each train like ONE process on the W*B sequences. Every rank also
 * runs a plain tiny Llama (V 23, C 32, L 2, H 4, KV 2, F 48, T 8; no DDP) on the whole combined
 * batch, and at each of 10 AdamW steps (betas 0.9 / 0.95, weight decay 0.1 on the >= 2-D
 * weights only; clipping by the global norm at 0.5, active), from the same parameters, DDP's
 * averaged and clipped gradients equal the one process's (relative 1e-5) over the whole flat
 * buffer and over the embedding alone (tied to the head in one case: DDP must reduce it once,
 * after both uses), and the global norm is the same on every rank and equals the one
 * process's. Cases: untied with overlap on and a 0.01 MiB bucket cap (several buckets),
 * overlap off, the default 25 MiB cap, and the head tied to the embedding. After each step the
 * plain model takes the replica's parameters, the replicas must be bit-identical across ranks
 * at the end, and training must have moved the parameters.
 *
 * Bucket readiness: with 0.01 MiB caps, the first bucket (the first all-reduce DDP launches)
 * must be complete within the first half of backward's grad-ready events, and every bucket no
 * later than the next (the registration follows the forward's order of use).
 *
 * MPI rules as tests/test_ddp.c: no fork, soft checks, the ranks agree at the end of a test. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpitrain/comm.h"
#include "mpitrain/ddp.h"
#include "mpitrain/llama.h"
#include "mpitrain/optim.h"
#include "mpitrain/transformer.h"

static mpt_comm *g_comm;
static int g_rank, g_world;

#define MPI_CHECK_COMM g_comm
#include "mpi_check.h"

enum { STEPS = 10, PER_RANK = 2, TT = 8, VOCAB = 23, MAX_GROUPS = 64 };
#define MAX_NORM 0.5f

/* Tolerance: from the same parameters the two runs differ only in float32 summation order
 * (GEMMs over B*T rows per rank then an average of W means, against GEMMs over W*B*T rows), a
 * few ulps of each gradient; a real fault (a sum instead of a mean, a bucket not reduced, the
 * tied embedding reduced before its second use, a stale gradient) changes gradients by 1e-2
 * and more. */
#define EQUIV_TOL 1e-5

static mpt_model *llama_make(uint64_t seed, int tied) {
  mpt_llama_config c = {.vocab_size = VOCAB, .dim = 32, .n_layers = 2, .n_heads = 4,
                        .n_kv_heads = 2, .ffn_dim = 48, .max_seq_len = TT,
                        .rope_theta = 10000.0f, .norm_eps = 1e-5f, .tied_embeddings = tied};
  mpt_model *m = NULL;
  OK(mpt_model_init_llama(&m, mpt_device_cpu(), &c, seed));
  return m;
}

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

/* max |a - b| / max(max |b|, 1e-3) */
static double rel_diff(const float *a, const float *b, int64_t n) {
  double diff = 0, scale = 1e-3;
  for (int64_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - (double)b[i]);
    if (d > diff) diff = d;
    if (fabs((double)b[i]) > scale) scale = fabs((double)b[i]);
  }
  return diff / scale;
}

static int same_on_all_ranks(const float *x, int64_t n) {
  float *lo = malloc((size_t)n * sizeof *lo), *hi = malloc((size_t)n * sizeof *hi);
  ck_assert(lo && hi);
  OK(mpt_comm_allreduce_sync(g_comm, x, lo, n, MPT_F32, MPT_REDUCE_MIN));
  OK(mpt_comm_allreduce_sync(g_comm, x, hi, n, MPT_F32, MPT_REDUCE_MAX));
  int same = memcmp(lo, hi, (size_t)n * sizeof *lo) == 0;
  free(lo);
  free(hi);
  return same;
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

typedef struct llama_case {
  int overlap;
  double cap_mb;
  int tied;
} llama_case;

static const llama_case CASES[] = {{1, 0.01, 0}, {0, 0.01, 0}, {1, 25, 0}, {1, 0.01, 1}};

START_TEST(test_llama_ddp_matches_one_process_on_combined_batch) {
  const llama_case *c = &CASES[_i];
  const int64_t total = (int64_t)g_world * PER_RANK;
  expect_begin();
  mpt_model *ref = llama_make(1234, c->tied);
  mpt_model *dm = llama_make(1234 + (uint64_t)g_rank * 77, c->tied); /* DDP makes it rank 0's */
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
           "the embedding used %d times, want %d", mpt_tape_param_uses(dt, 0), c->tied ? 2 : 1);
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
         "overlap %d, cap %g MiB, tied %d: DDP and one-process gradients differ by %.3g "
         "(embedding %.3g) > %g", c->overlap, c->cap_mb, c->tied, err, emb_err, EQUIV_TOL);
  EXPECT(clipped > 0, "clipping was never active: the test would not see it");
  EXPECT(moved > 1000 * EQUIV_TOL, "training moved the parameters by only %.3g", moved);
  EXPECT(same_on_all_ranks(mpt_model_params(dm), count),
         "the replicas are not bit-identical across ranks after training");
  if (g_rank == 0)
    fprintf(stderr, "llama ddp W=%d overlap %d cap %g MiB tied %d (%d buckets): rel diff %.2e "
            "(embedding %.2e), moved %.2e, clipped in %d of %d steps\n", g_world, c->overlap,
            c->cap_mb, c->tied, mpt_ddp_num_buckets(ddp), err, emb_err, moved, clipped, STEPS);
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
END_TEST

static void ready_record(void *user, int index) {
  int *order = user; /* order[0]: events so far; order[1 + index]: the event's position */
  order[1 + index] = order[0]++;
}

START_TEST(test_llama_first_bucket_is_ready_early) {
  expect_begin();
  mpt_model *m = llama_make(1234, 0);
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
    fprintf(stderr, "llama ddp: %d buckets at 0.01 MiB, the first complete at ready event %d "
            "of %d\n", nb, first, np);
  mpt_tape_set_grad_hook(tape, NULL, NULL);
  mpt_ddp_free(ddp);
  mpt_tape_free(tape);
  mpt_model_free(m);
  expect_agree();
}
END_TEST

static Suite *llama_ddp_suite(void) {
  Suite *s = suite_create("llama_ddp");
  TCase *tc = tcase_create("equivalence");
  tcase_set_timeout(tc, 120);
  tcase_add_loop_test(tc, test_llama_ddp_matches_one_process_on_combined_batch, 0,
                      (int)(sizeof CASES / sizeof CASES[0]));
  tcase_add_test(tc, test_llama_first_bucket_is_ready_early);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  mpt_comm_config cc = mpt_comm_config_default();
  cc.timeout_ms = 30000;
  mpt_status st = mpt_comm_init(&g_comm, &cc);
  if (st != MPT_OK) {
    fprintf(stderr, "test_llama_ddp: mpt_comm_init: %s: %s\n", mpt_status_name(st),
            mpt_last_error());
    mpt_comm_finalize();
    return EXIT_FAILURE;
  }
  g_rank = mpt_comm_rank(g_comm);
  g_world = mpt_comm_world_size(g_comm);
  SRunner *sr = srunner_create(llama_ddp_suite());
  srunner_set_fork_status(sr, CK_NOFORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  mpt_comm_free(g_comm);
  mpt_comm_finalize();
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
