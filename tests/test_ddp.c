/* Tests of the DDP engine (src/ddp/ddp.c), run under mpirun with 2, 3 and 4 ranks
 * (tests/test_ddp_np2.mpi, _np3.mpi, _np4.mpi):
 *
 * - Equivalence: W ranks with B samples each train like ONE process on the W*B samples: every
 *   rank also runs a plain model (no DDP) on the whole combined batch, and at each of 20
 *   SGD-with-momentum steps, from the same parameters, DDP's averaged gradients equal the one
 *   process's (relative 1e-5), for the MLP and the CNN, overlap on and off, bucket caps 0.01, 1
 *   and 25 MiB; with gradient accumulation (K = 3 micro-batches, no_sync on the first K - 1,
 *   loss scale 1/K) against one process on W*K*B samples. After each step the plain model takes
 *   the DDP replica's parameters: over a free-running 20-step trajectory, float rounding (1e-7)
 *   can flip a near-tie of max pooling, a discrete jump (seen: 4e-3 in the cnn's gradients at
 *   step 17, 4 ranks) that says nothing about DDP. Also: the replicas are bit-identical across ranks after training, overlap on
 *   launches every bucket during backward and overlap off none (counted by the comm's sequence
 *   numbers), no_sync passes issue no collective, and the stats count synchronised passes.
 * - Bucket plan: a plan worked out by hand (caps in bytes, an oversized parameter alone), the
 *   PyTorch default caps on the default MLP, and the invariants of every plan (reverse
 *   registration order, contiguous slices covering the gradient buffer exactly once, each bucket
 *   within its cap unless it is one oversized parameter, greedy: a bucket closes only when the
 *   next parameter does not fit).
 * - no_sync: mpt_ddp_set_sync takes effect at the next backward.
 * - The user's loop: DDP is attached to the model, so the step is zero_grad, reset, input,
 *   forward, loss, backward, optimizer step with no DDP call; leaving out any one of the seven
 *   is an error naming it on every rank with nothing trained; other misuse (a second forward,
 *   a model changed after wrapping, a second wrapper, ops that bypass mpt_model_forward) too.
 *
 * MPI rules: Check runs without forking (CK_NOFORK); every rank runs the same tests in the same
 * order. Value checks inside a test are soft (EXPECT) and the ranks agree on the outcome at the
 * end of each test, so a failing check on one rank never leaves the others waiting in a
 * collective. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpitrain/autograd.h"
#include "mpitrain/comm.h"
#include "mpitrain/ddp.h"
#include "mpitrain/nn.h"
#include "mpitrain/optim.h"

static mpt_comm *g_comm;
static int g_rank, g_world;

#define MPI_CHECK_COMM g_comm
#include "mpi_check.h"

/* ------------------------------------------------------------------------------------------ */
/* Models and data                                                                            */

enum { STEPS = 20, PER_RANK = 8, ACCUM = 3, CLASSES = 10 };

/* MLP 784-64-64-10 (55050 parameters; at a 0.01 MiB cap fc3+fc2 and fc1 form two buckets) or CNN on 1x12x12 images: conv 1->8 k5, conv 8->16 k5,
 * fc 144->32, fc 32->10 (8394 parameters). Neither has BatchNorm or dropout. */
static mpt_model *model_make(int cnn, uint64_t seed) {
  mpt_model *m = NULL;
  if (cnn) {
    mpt_cnn_config c = mpt_cnn_config_default();
    c.height = c.width = 12;
    c.conv1_channels = 8;
    c.conv2_channels = 16;
    c.kernel = 5;
    c.hidden = 32;
    c.num_classes = CLASSES;
    OK(mpt_model_init_cnn(&m, mpt_device_cpu(), &c, seed));
  } else {
    mpt_mlp_config c = mpt_mlp_config_default();
    c.input_size = 784;
    c.num_hidden = 2;
    c.hidden[0] = 64;
    c.hidden[1] = 64;
    c.num_classes = CLASSES;
    OK(mpt_model_init_mlp(&m, mpt_device_cpu(), &c, seed));
  }
  return m;
}

static int64_t sample_size(int cnn) { return cnn ? 144 : 784; }

/* n samples drawn from `seed`: x uniform in (-1, 1), labels uniform in [0, CLASSES). */
typedef struct batch {
  float *x;
  int32_t *y;
  int64_t n, features;
} batch;

static batch batch_make(int cnn, int64_t n, uint64_t seed) {
  batch b = {.n = n, .features = sample_size(cnn)};
  b.x = malloc((size_t)(n * b.features) * sizeof *b.x);
  b.y = malloc((size_t)n * sizeof *b.y);
  ck_assert(b.x && b.y);
  mpt_rng rng;
  mpt_rng_seed(&rng, seed);
  mpt_rng_fill_uniform(&rng, b.x, n * b.features, -1.0f, 1.0f);
  for (int64_t i = 0; i < n; i++) b.y[i] = (int32_t)mpt_rng_below(&rng, CLASSES);
  return b;
}

static void batch_free(batch *b) {
  free(b->x);
  free(b->y);
}

/* Records forward + mean cross-entropy of samples [first, first + n) of `b` on a fresh pass.
 * The tensors must outlive the backward: they are returned through xt / yt. */
static mpt_var *forward_loss(mpt_model *m, mpt_tape *tape, int cnn, const batch *b,
                             int64_t first, int64_t n, mpt_tensor *xt, mpt_tensor *yt) {
  int64_t xs_mlp[2] = {n, 784}, xs_cnn[4] = {n, 1, 12, 12}, ys[1] = {n};
  float *x = b->x + first * b->features;
  *xt = cnn ? mpt_tensor_view(x, mpt_device_cpu(), MPT_F32, 4, xs_cnn)
            : mpt_tensor_view(x, mpt_device_cpu(), MPT_F32, 2, xs_mlp);
  *yt = mpt_tensor_view(b->y + first, mpt_device_cpu(), MPT_I32, 1, ys);
  mpt_var *xv = NULL, *out = NULL, *loss = NULL;
  mpt_tape_reset(tape, 1);
  OK(mpt_tape_input(tape, xt, &xv));
  OK(mpt_model_forward(m, tape, xv, &out));
  OK(mpt_nn_cross_entropy(tape, out, yt, &loss));
  return loss;
}

static mpt_optimizer *sgd_make(const mpt_model *m) {
  mpt_optimizer_config c = mpt_optimizer_config_default();
  c.lr = 0.05f;
  c.momentum = 0.9f;
  mpt_optimizer *opt = NULL;
  OK(mpt_optimizer_init(&opt, &c, mpt_device_cpu(), mpt_model_param_count(m)));
  return opt;
}

static void sgd_step(mpt_optimizer *opt, mpt_model *m) {
  OK(mpt_optimizer_step_model(opt, m, NULL, 0.05f));
}

/* A tape-level grad-ready hook (it runs just before DDP's hook for the same parameter): the
 * collective sequence number when parameter 0, the last to become ready, is final. */
typedef struct seq_probe {
  uint64_t at_param0;
} seq_probe;

static void probe_param0(void *user, int param_index) {
  if (param_index == 0) ((seq_probe *)user)->at_param0 = mpt_comm_sequence(g_comm);
}

/* ------------------------------------------------------------------------------------------ */
/* Equivalence with one process on the combined batch                                         */

typedef struct equiv_case {
  int cnn, overlap;
  double cap_mb, first_cap_mb;
} equiv_case;

static const equiv_case EQUIV[] = {
    {0, 1, 0.01, 0.01}, {0, 1, 1, 1}, {0, 1, 25, 1}, {0, 0, 0.01, 0.01}, {0, 0, 1, 1},
    {0, 0, 25, 1},      {1, 1, 0.01, 0.01}, {1, 1, 1, 1}, {1, 1, 25, 1}, {1, 0, 0.01, 0.01},
    {1, 0, 1, 1},       {1, 0, 25, 1},
};

/* Tolerance: from the same parameters the two runs differ only in float32 summation order (a
 * GEMM over B rows per rank then an average of W means, against one GEMM over W*B rows), a few
 * ulps (~1e-7 relative) of each gradient, while a real fault (a sum instead of a mean, a bucket
 * not reduced, a stale or doubled gradient) changes gradients by ~1e-2 and more. */
#define EQUIV_TOL 1e-5

/* Trains `ddp_m` under DDP and `ref` alone on the same samples for STEPS steps; accum > 1
 * splits each rank's share into accum micro-batches (no_sync on all but the last). */
static void train_both(const equiv_case *c, int accum, double *err, double *moved) {
  const int cnn = c->cnn;
  const int64_t total = (int64_t)g_world * accum * PER_RANK;
  mpt_model *ref = model_make(cnn, 1234);
  /* Seeded differently per rank: mpt_ddp_init must make every replica rank 0's. */
  mpt_model *dm = model_make(cnn, 1234 + (uint64_t)g_rank * 77);
  mpt_tape *rt = NULL, *dt = NULL;
  OK(mpt_tape_init(&rt, ref, NULL));
  OK(mpt_tape_init(&dt, dm, NULL));
  mpt_ddp_config dc = mpt_ddp_config_default();
  dc.overlap = c->overlap;
  dc.bucket_cap_mb = c->cap_mb;
  dc.first_bucket_cap_mb = c->first_cap_mb;
  dc.timeout_ms = 30000;
  mpt_ddp *ddp = NULL;
  OK(mpt_ddp_init(&ddp, dm, g_comm, NULL, &dc));
  const int64_t count = mpt_model_param_count(ref);
  const int nb = mpt_ddp_num_buckets(ddp);
  EXPECT(memcmp(mpt_model_params(dm), mpt_model_params(ref), (size_t)count * sizeof(float)) == 0,
         "after mpt_ddp_init the replica is not rank 0's model");
  if (c->cap_mb < 0.1) EXPECT(nb > 1, "cap %g MiB gave %d bucket(s), want several", c->cap_mb, nb);
  float *init = malloc((size_t)count * sizeof *init);
  ck_assert(init);
  memcpy(init, mpt_model_params(ref), (size_t)count * sizeof *init);
  mpt_optimizer *ropt = sgd_make(ref), *dopt = sgd_make(dm);
  mpt_tensor xt, yt;

  for (int step = 0; step < STEPS; step++) {
    batch b = batch_make(cnn, total, 1000 + (uint64_t)step);
    /* one process, all samples */
    OK(mpt_model_zero_grad(ref, NULL));
    mpt_var *loss = forward_loss(ref, rt, cnn, &b, 0, total, &xt, &yt);
    OK(mpt_tape_backward(rt, loss, 1.0f));
    sgd_step(ropt, ref);
    /* DDP: micro-batch k of rank r holds samples [(k*W + r)*B, +B) */
    /* The user's loop: no DDP call but no_sync; backward returns averaged gradients. */
    OK(mpt_model_zero_grad(dm, NULL));
    seq_probe probe = {0};
    mpt_tape_set_grad_hook(dt, probe_param0, &probe);
    for (int k = 0; k < accum; k++) {
      const int last = k == accum - 1;
      mpt_ddp_set_sync(ddp, last);
      const int buffers = mpt_model_buffer_count(dm) > 0 && g_world > 1;
      uint64_t seq0 = mpt_comm_sequence(g_comm) + (uint64_t)buffers; /* the buffer broadcast */
      loss = forward_loss(dm, dt, cnn, &b, ((int64_t)k * g_world + g_rank) * PER_RANK, PER_RANK,
                          &xt, &yt);
      EXPECT(mpt_comm_sequence(g_comm) == seq0, "step %d: the forward issued %llu collectives, "
             "want %d (the buffer broadcast)", step,
             (unsigned long long)(mpt_comm_sequence(g_comm) - seq0 + (uint64_t)buffers), buffers);
      OK(mpt_tape_backward(dt, loss, 1.0f / (float)accum));
      uint64_t seq2 = mpt_comm_sequence(g_comm);
      if (!last) {
        EXPECT(seq2 == seq0, "step %d: a no_sync pass issued %llu collectives", step,
               (unsigned long long)(seq2 - seq0));
      } else {
        /* With overlap every bucket but the last (which holds parameter 0) was launched before
         * parameter 0's gradient was final; without, none. */
        uint64_t during = c->overlap ? (uint64_t)nb - 1 : 0;
        EXPECT(probe.at_param0 - seq0 == during && seq2 - seq0 == (uint64_t)nb,
               "step %d, overlap %d: %llu all-reduces before the last gradient and %llu in all, "
               "want %llu and %d",
               step, c->overlap, (unsigned long long)(probe.at_param0 - seq0),
               (unsigned long long)(seq2 - seq0), (unsigned long long)during, nb);
      }
    }
    mpt_tape_set_grad_hook(dt, NULL, NULL);
    const double gerr = rel_diff(mpt_model_grads(dm), mpt_model_grads(ref), count);
    if (gerr > *err) *err = gerr;
    sgd_step(dopt, dm);
    /* the plain model follows the replica (see the file comment) */
    memcpy(mpt_model_params(ref), mpt_model_params(dm), (size_t)count * sizeof(float));
    batch_free(&b);
  }
  mpt_ddp_stats stats = mpt_ddp_get_stats(ddp);
  EXPECT(stats.steps == STEPS, "stats count %lld synchronised passes, want %d",
         (long long)stats.steps, STEPS);
  *moved = rel_diff(mpt_model_params(ref), init, count);
  EXPECT(same_on_all_ranks(mpt_model_params(dm), count),
         "the replicas are not bit-identical across ranks after training");
  free(init);
  mpt_optimizer_free(ropt);
  mpt_optimizer_free(dopt);
  mpt_ddp_free(ddp);
  mpt_tape_free(rt);
  mpt_tape_free(dt);
  mpt_model_free(ref);
  mpt_model_free(dm);
}

START_TEST(test_ddp_matches_one_process_on_combined_batch) {
  const equiv_case *c = &EQUIV[_i];
  double err = 0, moved = 0;
  expect_begin();
  train_both(c, 1, &err, &moved);
  EXPECT(err <= EQUIV_TOL,
         "%s, overlap %d, caps %g/%g MiB: DDP and one-process gradients differ by %.3g "
         "(relative, worst step) > %g",
         c->cnn ? "cnn" : "mlp", c->overlap, c->first_cap_mb, c->cap_mb, err, EQUIV_TOL);
  EXPECT(moved > 1000 * EQUIV_TOL, "training moved the parameters by only %.3g", moved);
  if (g_rank == 0)
    fprintf(stderr, "equivalence %s overlap %d caps %g/%g: rel diff %.2e, moved %.2e\n",
            c->cnn ? "cnn" : "mlp", c->overlap, c->first_cap_mb, c->cap_mb, err, moved);
  expect_agree();
}
END_TEST

START_TEST(test_gradient_accumulation_matches_one_process) {
  const equiv_case c = {_i, 1, 0.01, 0.01};
  double err = 0, moved = 0;
  expect_begin();
  train_both(&c, ACCUM, &err, &moved);
  EXPECT(err <= EQUIV_TOL, "%s, %d micro-batches: DDP and one-process gradients differ by %.3g > %g",
         c.cnn ? "cnn" : "mlp", ACCUM, err, EQUIV_TOL);
  EXPECT(moved > 1000 * EQUIV_TOL, "training moved the parameters by only %.3g", moved);
  if (g_rank == 0)
    fprintf(stderr, "accumulation %s: rel diff %.2e, moved %.2e\n", c.cnn ? "cnn" : "mlp", err,
            moved);
  expect_agree();
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* Bucket plan                                                                                */

/* The invariants of any plan: see the file comment. */
static void check_plan(const mpt_ddp *ddp, const mpt_model *m, double first_cap_mb,
                       double cap_mb) {
  const int n = mpt_model_num_params(m), nb = mpt_ddp_num_buckets(ddp);
  EXPECT(nb >= 1 && nb <= n, "%d buckets for %d parameters", nb, n);
  int next = n - 1;         /* the parameter the next bucket must start with */
  int64_t end = mpt_model_param_count(m); /* where the next bucket's slice must end */
  for (int b = 0; b < nb; b++) {
    const mpt_ddp_bucket_info *bk = mpt_ddp_bucket(ddp, b);
    EXPECT(bk != NULL, "bucket %d missing", b);
    if (!bk) return;
    EXPECT(bk->first_param == next && bk->last_param <= bk->first_param,
           "bucket %d covers parameters %d..%d, want to start at %d", b, bk->first_param,
           bk->last_param, next);
    double bytes = 0;
    int64_t count = 0;
    for (int p = bk->first_param; p >= bk->last_param && p >= 0; p--) {
      bytes += 4.0 * (double)mpt_model_param_info(m, p)->count;
      count += mpt_model_param_info(m, p)->count;
      EXPECT(mpt_ddp_param_bucket(ddp, p) == b, "parameter %d is in bucket %d, not %d", p,
             mpt_ddp_param_bucket(ddp, p), b);
    }
    const mpt_param_info *low = mpt_model_param_info(m, bk->last_param);
    EXPECT(low && bk->offset == low->offset && bk->count == count && bk->offset + count == end,
           "bucket %d is the slice {%lld, %lld}, want {%lld, %lld} ending at %lld", b,
           (long long)bk->offset, (long long)bk->count, low ? (long long)low->offset : -1LL,
           (long long)count, (long long)end);
    double cap = (b == 0 ? first_cap_mb : cap_mb) * 1048576.0;
    double last_bytes = 4.0 * (double)mpt_model_param_info(m, bk->last_param)->count;
    EXPECT(bytes - last_bytes < cap,
           "bucket %d was already at %.0f bytes (cap %.0f) before its last parameter", b,
           bytes - last_bytes, cap);
    if (b + 1 < nb) /* closed as soon as it reached its cap (PyTorch's rule) */
      EXPECT(bytes >= cap, "bucket %d closed at %.0f bytes, under its cap %.0f", b, bytes, cap);
    next = bk->last_param - 1;
    end = bk->offset;
  }
  EXPECT(next == -1 && end == 0, "the buckets stop at parameter %d, offset %lld", next + 1,
         (long long)end);
  EXPECT(mpt_ddp_bucket(ddp, nb) == NULL && mpt_ddp_bucket(ddp, -1) == NULL,
         "buckets outside [0, %d) exist", nb);
  EXPECT(mpt_ddp_param_bucket(ddp, n) == -1, "parameter %d outside the model has a bucket", n);
}

/* Parameters a[10] b[300] c[5] d[2000] e[7] f[100] g[500], caps 120 floats (first) and 400
 * floats, PyTorch's rule (add, then close once the cap is reached):
 *   bucket 0: g            (500 >= 120: closes at once)  slice {2422, 500}
 *   bucket 1: f, e, d      (100, 107, 2107 >= 400)        slice {315, 2107}
 *   bucket 2: c, b, a      (315 floats, the rest)         slice {0, 315} */
START_TEST(test_bucket_plan_matches_hand_computed_plan) {
  static const char *names[7] = {"a", "b", "c", "d", "e", "f", "g"};
  static const int64_t sizes[7] = {10, 300, 5, 2000, 7, 100, 500};
  mpt_model *m = NULL;
  expect_begin();
  OK(mpt_model_init(&m, mpt_device_cpu()));
  for (int i = 0; i < 7; i++) {
    int index = -1;
    OK(mpt_model_add_param(m, names[i], 1, &sizes[i], MPT_INIT_FAN_IN, 4, &index));
    ck_assert_int_eq(index, i);
  }
  OK(mpt_model_finalize(m));
  OK(mpt_model_init_params(m, 3));
  mpt_ddp_config dc = mpt_ddp_config_default();
  dc.first_bucket_cap_mb = 120.0 * 4 / 1048576.0;
  dc.bucket_cap_mb = 400.0 * 4 / 1048576.0;
  mpt_ddp *ddp = NULL;
  OK(mpt_ddp_init(&ddp, m, g_comm, NULL, &dc));
  static const mpt_ddp_bucket_info want[3] = {
      {.offset = 2422, .count = 500, .first_param = 6, .last_param = 6},
      {.offset = 315, .count = 2107, .first_param = 5, .last_param = 3},
      {.offset = 0, .count = 315, .first_param = 2, .last_param = 0}};
  EXPECT(mpt_ddp_num_buckets(ddp) == 3, "%d buckets, want 3", mpt_ddp_num_buckets(ddp));
  for (int b = 0; b < 3 && b < mpt_ddp_num_buckets(ddp); b++) {
    const mpt_ddp_bucket_info *g = mpt_ddp_bucket(ddp, b);
    EXPECT(g->offset == want[b].offset && g->count == want[b].count &&
               g->first_param == want[b].first_param && g->last_param == want[b].last_param,
           "bucket %d = {offset %lld, count %lld, params %d..%d}, want {%lld, %lld, %d..%d}", b,
           (long long)g->offset, (long long)g->count, g->first_param, g->last_param,
           (long long)want[b].offset, (long long)want[b].count, want[b].first_param,
           want[b].last_param);
  }
  static const int want_bucket[7] = {2, 2, 2, 1, 1, 1, 0};
  for (int p = 0; p < 7; p++)
    EXPECT(mpt_ddp_param_bucket(ddp, p) == want_bucket[p], "parameter %s in bucket %d, want %d",
           names[p], mpt_ddp_param_bucket(ddp, p), want_bucket[p]);
  check_plan(ddp, m, dc.first_bucket_cap_mb, dc.bucket_cap_mb);
  mpt_ddp_free(ddp);
  mpt_model_free(m);
  expect_agree();
}
END_TEST

/* PyTorch's defaults (1 MiB first, 25 MiB after) on the default MLP 784-512-512-10: the first
 * bucket takes fc3.bias, fc3.weight, fc2.bias and fc2.weight (which brings it past 1 MiB:
 * 267786 floats), the second fc1 — so fc2/fc3's all-reduce overlaps fc1's backward. */
START_TEST(test_default_caps_give_small_first_bucket) {
  mpt_model *m = NULL;
  mpt_mlp_config c = mpt_mlp_config_default();
  expect_begin();
  OK(mpt_model_init_mlp(&m, mpt_device_cpu(), &c, 5));
  mpt_ddp *ddp = NULL;
  OK(mpt_ddp_init(&ddp, m, g_comm, NULL, NULL));
  EXPECT(mpt_ddp_num_buckets(ddp) == 2, "%d buckets, want 2", mpt_ddp_num_buckets(ddp));
  const mpt_ddp_bucket_info *b0 = mpt_ddp_bucket(ddp, 0);
  EXPECT(b0 && b0->first_param == 5 && b0->last_param == 2 &&
             b0->count == 10 + 5120 + 512 + 262144,
         "first bucket covers %d..%d (%lld floats), want 5..2 (267786)", b0 ? b0->first_param : -1,
         b0 ? b0->last_param : -1, b0 ? (long long)b0->count : -1LL);
  check_plan(ddp, m, 1.0, 25.0);
  mpt_ddp_free(ddp);
  mpt_model_free(m);
  expect_agree();
}
END_TEST

/* The invariants on the test models at several caps. */
START_TEST(test_bucket_plans_are_contiguous_reverse_and_capped) {
  static const double caps[][2] = {{0.001, 0.001}, {0.002, 0.01}, {0.01, 0.01}, {1, 25},
                                   {0.0001, 0.05}};
  expect_begin();
  for (int cnn = 0; cnn < 2; cnn++) {
    mpt_model *m = model_make(cnn, 9);
    for (size_t k = 0; k < sizeof caps / sizeof caps[0]; k++) {
      mpt_ddp_config dc = mpt_ddp_config_default();
      dc.first_bucket_cap_mb = caps[k][0];
      dc.bucket_cap_mb = caps[k][1];
      mpt_ddp *ddp = NULL;
      OK(mpt_ddp_init(&ddp, m, g_comm, NULL, &dc));
      check_plan(ddp, m, dc.first_bucket_cap_mb, dc.bucket_cap_mb);
      if (g_bad && g_why[0] != '[') { /* say which plan */
        char tmp[sizeof g_why];
        snprintf(tmp, sizeof tmp, "[%s caps %g/%g] %s", cnn ? "cnn" : "mlp", caps[k][0],
                 caps[k][1], g_why);
        memcpy(g_why, tmp, sizeof g_why);
      }
      mpt_ddp_free(ddp);
    }
    mpt_model_free(m);
  }
  expect_agree();
}
END_TEST

/* mpt_ddp_set_sync takes effect at the next prepare_backward: a pass prepared while syncing is
 * finalised as a synchronised pass even if no_sync was switched on in between (overlap off, so
 * every all-reduce is issued by finalize), and the pass after is local. */
START_TEST(test_set_sync_applies_from_the_next_backward) {
  mpt_model *m = model_make(0, 21);
  mpt_tape *tape = NULL;
  mpt_tensor xt, yt;
  expect_begin();
  OK(mpt_tape_init(&tape, m, NULL));
  mpt_ddp_config dc = mpt_ddp_config_default();
  dc.overlap = 0;
  dc.first_bucket_cap_mb = dc.bucket_cap_mb = 0.01;
  mpt_ddp *ddp = NULL;
  OK(mpt_ddp_init(&ddp, m, g_comm, NULL, &dc));
  const int nb = mpt_ddp_num_buckets(ddp);
  const int64_t count = mpt_model_param_count(m);
  batch b = batch_make(0, (int64_t)g_world * PER_RANK, 77);
  for (int pass = 0; pass < 2; pass++) {
    OK(mpt_model_zero_grad(m, NULL));
    mpt_var *loss = forward_loss(m, tape, 0, &b, (int64_t)g_rank * PER_RANK, PER_RANK, &xt, &yt);
    uint64_t s0 = mpt_comm_sequence(g_comm);
    OK(mpt_tape_backward(tape, loss, 1.0f));
    mpt_ddp_set_sync(ddp, 0); /* pass 0: too late for this pass; pass 1: already off */
    uint64_t used = mpt_comm_sequence(g_comm) - s0;
    /* No optimizer in this test: say so. A step on the no_sync pass's gradients (this rank's
     * alone) is refused. */
    const mpt_status cst = mpt_model_consume_grads(m);
    EXPECT(cst == (pass == 0 ? MPT_OK : MPT_ESTATE), "pass %d: consume_grads gave %s: %s", pass,
           mpt_status_name(cst), mpt_last_error());
    uint64_t want = pass == 0 ? (uint64_t)nb : 0;
    EXPECT(used == want, "pass %d: %llu all-reduces, want %llu", pass, (unsigned long long)used,
           (unsigned long long)want);
    int same = same_on_all_ranks(mpt_model_grads(m), count); /* data differs per rank */
    EXPECT(same == (pass == 0), "pass %d: gradients %s across ranks", pass,
           same ? "identical" : "differ");
  }
  batch_free(&b);
  mpt_ddp_free(ddp);
  mpt_tape_free(tape);
  mpt_model_free(m);
  expect_agree();
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* DDP attached to the model: the user's loop, and every call left out is an error            */

/* The step a user writes, call by call (examples/custom_model.c has the same seven). `skip`
 * leaves out call number `skip` (1..7; 0: none) and returns the first error, or MPT_OK. */
static mpt_status user_step(mpt_model *m, mpt_tape *tape, mpt_optimizer *opt, const batch *b,
                            int skip) {
  int64_t xs[2] = {PER_RANK, 784}, ys[1] = {PER_RANK};
  mpt_tensor xt = mpt_tensor_view(b->x + (int64_t)g_rank * PER_RANK * 784, mpt_device_cpu(),
                                  MPT_F32, 2, xs);
  mpt_tensor yt = mpt_tensor_view(b->y + (int64_t)g_rank * PER_RANK, mpt_device_cpu(), MPT_I32,
                                  1, ys);
  mpt_var *xv = NULL, *out = NULL, *loss = NULL;
  mpt_status st = MPT_OK;
  if (skip != 1) MPT_RETURN_IF(mpt_model_zero_grad(m, NULL));
  if (skip != 2) mpt_tape_reset(tape, 1);
  if (skip != 3) MPT_RETURN_IF(mpt_tape_input(tape, &xt, &xv));
  if (skip != 4) st = mpt_model_forward(m, tape, xv, &out);
  MPT_RETURN_IF(st);
  if (skip != 5) st = mpt_nn_cross_entropy(tape, out, &yt, &loss);
  MPT_RETURN_IF(st);
  if (skip != 6) MPT_RETURN_IF(mpt_tape_backward(tape, loss, 1.0f));
  if (skip != 7) MPT_RETURN_IF(mpt_optimizer_step_model(opt, m, NULL, 0.05f));
  return MPT_OK;
}

/* Three full steps, then a step with call `_i` (1..7) left out: each omission is an error
 * (MPT_ESTATE naming it, or MPT_EINVAL for a missing input or output), on every rank alike, and
 * never a step that silently trains differently. Calls 3-5 left out are compile errors in C
 * (their output is the next call's input); here they reach the library as NULL. */
START_TEST(test_ddp_step_with_a_call_left_out_is_an_error) {
  const int skip = _i;
  expect_begin();
  mpt_model *m = model_make(0, 5);
  mpt_tape *tape = NULL;
  OK(mpt_tape_init(&tape, m, NULL));
  mpt_ddp_config dc = mpt_ddp_config_default();
  dc.timeout_ms = 30000;
  mpt_ddp *ddp = NULL;
  OK(mpt_ddp_init(&ddp, m, g_comm, NULL, &dc));
  mpt_optimizer *opt = sgd_make(m);
  batch b = batch_make(0, (int64_t)g_world * PER_RANK, 9);
  for (int step = 0; step < 3; step++) OK(user_step(m, tape, opt, &b, 0));
  const int64_t count = mpt_model_param_count(m);
  float *before = malloc((size_t)count * sizeof *before);
  ck_assert(before);
  memcpy(before, mpt_model_params(m), (size_t)count * sizeof *before);
  mpt_status st = user_step(m, tape, opt, &b, skip);
  if (skip == 2) {
    /* Without reset the tape still holds the last pass: its backward already ran. The step
     * after a missing reset fails at backward (a second backward of one pass). */
    EXPECT(st == MPT_ESTATE, "reset left out: %s: %s", mpt_status_name(st), mpt_last_error());
  } else if (skip == 7) {
    /* No step: the next zero_grad refuses to drop averaged gradients nobody applied. */
    EXPECT(st == MPT_OK, "step 4 without the optimizer: %s", mpt_status_name(st));
    st = user_step(m, tape, opt, &b, 0);
    EXPECT(st == MPT_ESTATE && strstr(mpt_last_error(), "no optimizer step used"),
           "zero_grad after a step without optimizer: %s: %s", mpt_status_name(st),
           mpt_last_error());
  } else {
    const mpt_status want = skip == 3 || skip == 4 || skip == 5 ? MPT_EINVAL : MPT_ESTATE;
    EXPECT(st == want, "call %d left out: %s (want %s): %s", skip, mpt_status_name(st),
           mpt_status_name(want), mpt_last_error());
  }
  if (skip == 1)
    EXPECT(strstr(mpt_last_error(), "not zeroed") != NULL, "no zero_grad: %s", mpt_last_error());
  if (skip == 6)
    EXPECT(strstr(mpt_last_error(), "backward") != NULL, "no backward: %s", mpt_last_error());
  /* Whatever failed, no parameter moved on any rank, and the replicas still match. */
  if (skip != 7)
    EXPECT(memcmp(before, mpt_model_params(m), (size_t)count * sizeof *before) == 0,
           "call %d left out: the parameters changed", skip);
  EXPECT(same_on_all_ranks(mpt_model_params(m), count), "call %d left out: replicas differ",
         skip);
  free(before);
  batch_free(&b);
  mpt_optimizer_free(opt);
  mpt_ddp_free(ddp);
  mpt_tape_free(tape);
  mpt_model_free(m);
  expect_agree();
}
END_TEST

/* Misuse beyond a missing call: a second forward before the backward, a model changed after
 * wrapping, a second wrapper, and a backward through ops that bypass mpt_model_forward. */
START_TEST(test_ddp_misuse_is_named) {
  expect_begin();
  mpt_model *m = model_make(0, 6);
  mpt_tape *tape = NULL;
  OK(mpt_tape_init(&tape, m, NULL));
  mpt_ddp *ddp = NULL, *second = NULL;
  OK(mpt_ddp_init(&ddp, m, g_comm, NULL, NULL));
  batch b = batch_make(0, (int64_t)g_world * PER_RANK, 10);
  mpt_tensor xt, yt;
  /* A second training forward before the first one's backward. */
  OK(mpt_model_zero_grad(m, NULL));
  forward_loss(m, tape, 0, &b, (int64_t)g_rank * PER_RANK, PER_RANK, &xt, &yt);
  mpt_var *xv = NULL, *out = NULL;
  OK(mpt_tape_input(tape, &xt, &xv));
  mpt_status st = mpt_model_forward(m, tape, xv, &out);
  EXPECT(st == MPT_ESTATE && strstr(mpt_last_error(), "second training forward"),
         "second forward: %s: %s", mpt_status_name(st), mpt_last_error());
  /* An evaluation forward is not DDP's business: allowed between the two. */
  mpt_tape_set_grad_enabled(tape, 0);
  OK(mpt_model_forward(m, tape, xv, &out));
  mpt_tape_set_grad_enabled(tape, 1);
  /* A forward whose backward never came is forgotten at the next zero_grad (a new step). */
  OK(mpt_model_zero_grad(m, NULL));
  mpt_var *l2 = forward_loss(m, tape, 0, &b, (int64_t)g_rank * PER_RANK, PER_RANK, &xt, &yt);
  OK(mpt_tape_backward(tape, l2, 1.0f));
  OK(mpt_model_consume_grads(m));
  mpt_ddp_free(ddp);
  /* The model changed after wrapping (here: re-initialised on every rank with its own seed). */
  OK(mpt_ddp_init(&ddp, m, g_comm, NULL, NULL));
  st = mpt_ddp_init(&second, m, g_comm, NULL, NULL);
  EXPECT(st == MPT_ESTATE && second == NULL, "a second DDP on one model: %s",
         mpt_status_name(st));
  OK(mpt_model_init_params(m, 100 + (uint64_t)g_rank));
  OK(mpt_model_zero_grad(m, NULL));
  mpt_tape_reset(tape, 1);
  OK(mpt_tape_input(tape, &xt, &xv));
  st = mpt_model_forward(m, tape, xv, &out);
  EXPECT(st == MPT_ESTATE && strstr(mpt_last_error(), "changed after mpt_ddp_init"),
         "model changed after wrapping: %s: %s", mpt_status_name(st), mpt_last_error());
  mpt_ddp_free(ddp);
  /* Ops recorded without mpt_model_forward: DDP never saw a forward, backward refuses. */
  OK(mpt_ddp_init(&ddp, m, g_comm, NULL, NULL));
  mpt_tape_reset(tape, 1);
  mpt_var *w = NULL, *y = NULL, *loss = NULL;
  OK(mpt_tape_input(tape, &xt, &xv));
  OK(mpt_tape_param(tape, 0, &w));
  OK(mpt_nn_linear(tape, xv, w, NULL, &y));
  OK(mpt_nn_sum(tape, y, &loss));
  st = mpt_tape_backward(tape, loss, 1.0f);
  EXPECT(st == MPT_ESTATE && strstr(mpt_last_error(), "without a training forward"),
         "backward without mpt_model_forward: %s: %s", mpt_status_name(st), mpt_last_error());
  batch_free(&b);
  mpt_ddp_free(ddp);
  mpt_tape_free(tape);
  mpt_model_free(m);
  expect_agree();
}
END_TEST

static mpt_status failing_backward(mpt_tape *tape, mpt_node *node) {
  (void)tape;
  (void)node;
  return MPT_FAIL(MPT_EDEVICE, "failing_backward: the op failed on purpose");
}

/* y = x, whose backward fails: the last op before the loss, so it fails first in backward. */
static mpt_status failing_op(mpt_tape *tape, mpt_var *x, mpt_var **y) {
  const mpt_tensor *v = mpt_var_value(x);
  MPT_RETURN_IF(mpt_tape_new_var(tape, v->ndim, v->shape, MPT_F32, y));
  memcpy(mpt_var_value(*y)->data, v->data, (size_t)v->count * sizeof(float));
  return mpt_tape_record(tape, "failing", failing_backward, &x, 1, *y, NULL);
}

/* After a backward failed, this rank's collectives may no longer pair with the other ranks'
 * (here every rank fails alike, so the comm stays usable): DDP refuses every later pass,
 * naming the first failure, until it is freed and the model wrapped again. */
START_TEST(test_ddp_refuses_passes_after_a_failed_backward) {
  expect_begin();
  mpt_model *m = model_make(0, 8);
  mpt_tape *tape = NULL;
  OK(mpt_tape_init(&tape, m, NULL));
  mpt_ddp *ddp = NULL;
  OK(mpt_ddp_init(&ddp, m, g_comm, NULL, NULL));
  batch b = batch_make(0, (int64_t)g_world * PER_RANK, 11);
  mpt_tensor xt, yt;
  OK(mpt_model_zero_grad(m, NULL));
  mpt_var *loss = forward_loss(m, tape, 0, &b, (int64_t)g_rank * PER_RANK, PER_RANK, &xt, &yt);
  mpt_var *bad = NULL;
  OK(failing_op(tape, loss, &bad));
  mpt_status st = mpt_tape_backward(tape, bad, 1.0f);
  EXPECT(st == MPT_EDEVICE, "the failing backward gave %s", mpt_status_name(st));
  OK(mpt_model_zero_grad(m, NULL));
  mpt_tape_reset(tape, 1);
  mpt_var *xv = NULL, *out = NULL;
  OK(mpt_tape_input(tape, &xt, &xv));
  st = mpt_model_forward(m, tape, xv, &out);
  EXPECT(st == MPT_ESTATE && strstr(mpt_last_error(), "failed on purpose") &&
             strstr(mpt_last_error(), "backward failed earlier"),
         "the next forward: %s: %s", mpt_status_name(st), mpt_last_error());
  mpt_ddp_free(ddp);
  OK(mpt_ddp_init(&ddp, m, g_comm, NULL, NULL)); /* wrapped again: trains */
  loss = forward_loss(m, tape, 0, &b, (int64_t)g_rank * PER_RANK, PER_RANK, &xt, &yt);
  OK(mpt_tape_backward(tape, loss, 1.0f));
  EXPECT(same_on_all_ranks(mpt_model_grads(m), mpt_model_param_count(m)),
         "after wrapping again the gradients are not averaged");
  batch_free(&b);
  mpt_ddp_free(ddp);
  mpt_tape_free(tape);
  mpt_model_free(m);
  expect_agree();
}
END_TEST

START_TEST(test_ddp_init_rejects_bad_config) {
  mpt_model *m = model_make(0, 1);
  mpt_ddp *ddp = (mpt_ddp *)&ddp;
  mpt_ddp_config dc = mpt_ddp_config_default();
  dc.bucket_cap_mb = 0;
  ck_assert_int_eq(mpt_ddp_init(&ddp, m, g_comm, NULL, &dc), MPT_EINVAL);
  ck_assert_ptr_null(ddp);
  dc = mpt_ddp_config_default();
  dc.first_bucket_cap_mb = -1;
  ck_assert_int_eq(mpt_ddp_init(&ddp, m, g_comm, NULL, &dc), MPT_EINVAL);
  dc = mpt_ddp_config_default();
  dc.timeout_ms = 0;
  ck_assert_int_eq(mpt_ddp_init(&ddp, m, g_comm, NULL, &dc), MPT_EINVAL);
  ck_assert_int_eq(mpt_ddp_init(&ddp, NULL, g_comm, NULL, NULL), MPT_EINVAL);
  dc = mpt_ddp_config_default();
  dc.buffers = (mpt_ddp_buffer_mode)7;
  ck_assert_int_eq(mpt_ddp_init(&ddp, m, g_comm, NULL, &dc), MPT_EINVAL);
  mpt_model *unfinished = NULL; /* refused before any collective: no other rank is needed */
  mpt_linear l;
  OK(mpt_model_init(&unfinished, mpt_device_cpu()));
  OK(mpt_linear_add(unfinished, "fc", 2, 2, 1, &l));
  ck_assert_int_eq(mpt_ddp_init(&ddp, unfinished, g_comm, NULL, NULL), MPT_ESTATE);
  mpt_model_free(unfinished);
  ck_assert_int_eq(mpt_ddp_check_batches(NULL, 1), MPT_EINVAL);
  mpt_ddp_buffer_mode mode = MPT_DDP_BUFFERS_NONE;
  ck_assert_int_eq(mpt_ddp_buffer_mode_parse("average", &mode), MPT_OK);
  ck_assert_int_eq(mode, MPT_DDP_BUFFERS_AVERAGE);
  ck_assert_int_eq(mpt_ddp_buffer_mode_parse("mean", &mode), MPT_EINVAL);
  mpt_ddp_free(NULL);
  mpt_model_free(m);
}
END_TEST

static Suite *ddp_suite(void) {
  Suite *s = suite_create("ddp");
  TCase *plan = tcase_create("plan");
  tcase_add_test(plan, test_bucket_plan_matches_hand_computed_plan);
  tcase_add_test(plan, test_default_caps_give_small_first_bucket);
  tcase_add_test(plan, test_bucket_plans_are_contiguous_reverse_and_capped);
  tcase_add_test(plan, test_ddp_init_rejects_bad_config);
  suite_add_tcase(s, plan);
  TCase *eq = tcase_create("equivalence");
  tcase_add_loop_test(eq, test_ddp_matches_one_process_on_combined_batch, 0,
                      (int)(sizeof EQUIV / sizeof EQUIV[0]));
  tcase_add_loop_test(eq, test_gradient_accumulation_matches_one_process, 0, 2);
  suite_add_tcase(s, eq);
  TCase *sync = tcase_create("no_sync");
  tcase_add_test(sync, test_set_sync_applies_from_the_next_backward);
  suite_add_tcase(s, sync);
  TCase *loop = tcase_create("user_loop");
  tcase_add_loop_test(loop, test_ddp_step_with_a_call_left_out_is_an_error, 1, 8);
  tcase_add_test(loop, test_ddp_misuse_is_named);
  tcase_add_test(loop, test_ddp_refuses_passes_after_a_failed_backward);
  suite_add_tcase(s, loop);
  return s;
}

int main(void) {
  return mpi_check_main("test_ddp", 30000, &g_comm, &g_world, ddp_suite);
}
