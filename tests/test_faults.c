/* The DDP cases of docs/faults.md as tests of the engine (src/ddp/ddp.c), run
 * under mpirun with 2, 3 and 4 ranks (tests/test_faults_np2.mpi, _np3.mpi, _np4.mpi). Each case
 * uses the values given there, generalised to W ranks where the formula is plain (W = 2 gives
 * exactly the docs/faults.md numbers):
 *
 * - F03 uneven batches: rank r has 2 batches if r < ceil(W/2), else 1 (W = 2: 2,1; W = 4:
 *   2,2,1,1): mpt_ddp_check_batches fails with MPT_EMISMATCH on every rank naming each short
 *   rank; equal counts pass.
 * - F04 unused parameters: layers A and B (2x2 Linear each), forward uses only A: by default
 *   mpt_ddp_finalize of the FIRST step fails on every rank with MPT_EUNUSED naming B.weight and
 *   B.bias (and no A parameter), also when a bucket of A was already launched; with
 *   find_unused_parameters and only rank 0 using B, every rank holds (g0 + 0 + ...) / W.
 * - F05 different models: an extra [2] parameter, [4,5] in place of [4,4], or two parameters
 *   in another order on rank 1 makes mpt_ddp_init fail with MPT_EMISMATCH on every rank naming
 *   the mismatch; matching models seeded differently start bit-identical (parameters and
 *   buffers).
 * - F06 order of readiness: p1 = 1s, p2 = 2s, loss = sum(x1*p1 + x2*p2), rank 0 x1 = 1, x2 = 10,
 *   rank 1 x1 = 3, x2 = 20, the ranks build the branches in opposite orders, p1 and p2 in
 *   different buckets: averaged gradients p1 = 2s, p2 = 15s (W = 2).
 * - F07 mean exactly once: loss = mean_i(w * x_i), rank r x = [4r+1, 4r+3]: gradient 2W on
 *   every rank (4.0 for W = 2), equal to one process on all the x.
 * - F08 buffers: BatchNorm with momentum 1, rank r's data has mean 10r. Buffers are synchronised
 *   by mpt_ddp_sync_buffers BEFORE each forward, so after forward + backward + finalize each
 *   rank holds its own batch mean (checked: 10r); after the next sync every rank holds rank 0's
 *   0.0 (broadcast), the average 5(W-1) (5.0 for W = 2), or still its own 10r (none).
 *
 * F09 (mismatched collectives) is tested with the comm layer, F10 (a rank dies) by a script.
 * Same MPI rules as tests/test_ddp.c: CK_NOFORK, same tests in the same order on every rank,
 * soft checks agreed across ranks at the end of each test. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpitrain/comm.h"
#include "mpitrain/ddp.h"
#include "mpitrain/nn.h"

static mpt_comm *g_comm;
static int g_rank, g_world;

#define MPI_CHECK_COMM g_comm
#include "mpi_check.h"

/* Tiny caps (in MiB) so that every parameter of these models gets its own bucket. */
#define ONE_FLOAT_MB (4.0 / 1048576.0)

static mpt_ddp_config config_small(int overlap) {
  mpt_ddp_config c = mpt_ddp_config_default();
  c.overlap = overlap;
  c.first_bucket_cap_mb = c.bucket_cap_mb = ONE_FLOAT_MB;
  c.timeout_ms = 30000;
  return c;
}

/* ------------------------------------------------------------------------------------------ */
/* F03 uneven batches                                                                         */

START_TEST(test_f03_uneven_batch_counts_fail_on_every_rank_naming_short_ranks) {
  mpt_model *m = NULL;
  int64_t shape[1] = {3};
  expect_begin();
  OK(mpt_model_init(&m, mpt_device_cpu()));
  OK(mpt_model_add_param(m, "w", 1, shape, MPT_INIT_ONES, 1, NULL));
  OK(mpt_model_finalize(m));
  mpt_ddp *ddp = NULL;
  OK(mpt_ddp_init(&ddp, m, g_comm, NULL, NULL));
  EXPECT(mpt_ddp_check_batches(ddp, 5) == MPT_OK, "equal counts (5) rejected: %s",
         mpt_last_error());
  const int longer = (g_world + 1) / 2; /* ranks [0, longer) have 2 batches */
  mpt_status st = mpt_ddp_check_batches(ddp, g_rank < longer ? 2 : 1);
  if (g_world == 1) {
    EXPECT(st == MPT_OK, "one rank cannot be uneven: %s", mpt_status_name(st));
  } else {
    const char *msg = mpt_last_error();
    EXPECT(st == MPT_EMISMATCH, "uneven counts gave %s, want MPT_EMISMATCH",
           mpt_status_name(st));
    for (int r = 0; r < g_world; r++) {
      char name[32];
      snprintf(name, sizeof name, "%d (1 batches)", r);
      if (r >= longer)
        EXPECT(strstr(msg, name) != NULL, "the error does not name short rank %d: %s", r, msg);
      snprintf(name, sizeof name, "%d (2 batches)", r);
      EXPECT(strstr(msg, name) == NULL, "the error names rank %d, which is not short: %s", r,
             msg);
    }
  }
  /* The comm is still usable: an equal check afterwards passes. */
  EXPECT(mpt_ddp_check_batches(ddp, 1) == MPT_OK, "equal counts after an error: %s",
         mpt_last_error());
  mpt_ddp_free(ddp);
  mpt_model_free(m);
  expect_agree();
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* F04 unused parameters                                                                      */

typedef struct ab_ctx {
  mpt_linear a, b;
  int use_b;
} ab_ctx;

/* y = A(x) [+ B(x)] */
static mpt_status ab_forward(mpt_model *model, mpt_tape *tape, void *vctx, mpt_var *x,
                             mpt_var **y) {
  (void)model;
  const ab_ctx *c = vctx;
  mpt_var *ya = NULL, *yb = NULL;
  mpt_status st = mpt_linear_forward(tape, &c->a, x, &ya);
  if (st != MPT_OK || !c->use_b) {
    *y = ya;
    return st;
  }
  st = mpt_linear_forward(tape, &c->b, x, &yb);
  if (st != MPT_OK) return st;
  return mpt_nn_add(tape, ya, yb, y);
}

/* Layers A and B (2 -> 2 with bias) registered in the given order (b_first: B, then A). */
static mpt_model *ab_model(ab_ctx *ctx, int b_first) {
  mpt_model *m = NULL;
  OK(mpt_model_init(&m, mpt_device_cpu()));
  if (b_first) OK(mpt_linear_add(m, "B", 2, 2, 1, &ctx->b));
  OK(mpt_linear_add(m, "A", 2, 2, 1, &ctx->a));
  if (!b_first) OK(mpt_linear_add(m, "B", 2, 2, 1, &ctx->b));
  mpt_model_set_forward(m, ab_forward, ctx, NULL);
  OK(mpt_model_finalize(m));
  OK(mpt_model_init_params(m, 11));
  return m;
}

/* One DDP step of loss = sum(y) on x = [[4r+1, 4r+2], [4r+3, 4r+4]]; returns backward's status
 * and the sequence numbers used in backward (*during) and in all (*total). */
static mpt_status ab_step(mpt_model *m, mpt_ddp *ddp, mpt_tape *tape, uint64_t *during,
                          uint64_t *total) {
  float x[4];
  for (int i = 0; i < 4; i++) x[i] = (float)(4 * g_rank + 1 + i);
  int64_t shape[2] = {2, 2};
  mpt_tensor xt = mpt_tensor_view(x, mpt_device_cpu(), MPT_F32, 2, shape);
  mpt_var *xv = NULL, *y = NULL, *loss = NULL;
  /* No optimizer in these tests: the last step's gradients are dropped on purpose. */
  if (mpt_model_grads_state(m) == MPT_GRADS_READY) OK(mpt_model_consume_grads(m));
  OK(mpt_model_zero_grad(m, NULL));
  mpt_tape_reset(tape, 1);
  OK(mpt_tape_input(tape, &xt, &xv));
  OK(mpt_model_forward(m, tape, xv, &y));
  OK(mpt_nn_sum(tape, y, &loss));
  uint64_t s0 = mpt_comm_sequence(g_comm);
  (void)ddp; /* attached to the model: backward returns DDP's verdict */
  mpt_status st = mpt_tape_backward(tape, loss, 1.0f);
  /* The end of backward launches nothing once a parameter is missing: whatever ran, ran
   * during backward. */
  *during = *total = mpt_comm_sequence(g_comm) - s0;
  return st;
}

/* Loop index: bit 0 = overlap, bit 1 = B registered first (so A's bucket is launched during
 * backward before the failure is found). */
START_TEST(test_f04_unused_parameters_fail_first_step_naming_them) {
  const int overlap = _i & 1, b_first = (_i >> 1) & 1;
  ab_ctx ctx = {.use_b = 0};
  expect_begin();
  mpt_model *m = ab_model(&ctx, b_first);
  mpt_tape *tape = NULL;
  OK(mpt_tape_init(&tape, m, NULL));
  mpt_ddp_config dc = config_small(overlap);
  mpt_ddp *ddp = NULL;
  OK(mpt_ddp_init(&ddp, m, g_comm, NULL, &dc));
  EXPECT(mpt_ddp_num_buckets(ddp) == 4, "%d buckets, want one per parameter (4)",
         mpt_ddp_num_buckets(ddp));
  uint64_t during = 0, total = 0;
  mpt_status st = ab_step(m, ddp, tape, &during, &total);
  const char *msg = mpt_last_error();
  EXPECT(st == MPT_EUNUSED, "backward of the first step gave %s, want MPT_EUNUSED: %s",
         mpt_status_name(st), msg);
  EXPECT(strstr(msg, "B.weight") && strstr(msg, "B.bias") && !strstr(msg, "A."),
         "the error should name B.weight and B.bias only: %s", msg);
  /* A's buckets come first in index order only when B was registered first; with overlap they
   * were launched during backward, without it nothing is launched once a parameter is
   * missing. */
  uint64_t want = b_first && overlap ? 2 : 0;
  EXPECT(during == want && total == want, "%llu all-reduces during backward, %llu in all, "
         "want %llu", (unsigned long long)during, (unsigned long long)total,
         (unsigned long long)want);
  if (want) { /* backward waited for them: A's gradient is the average already */
    const float *gw = mpt_model_grad(m, ctx.a.weight).data;
    const float *gb = mpt_model_grad(m, ctx.a.bias).data;
    float w0 = (float)(4 * g_world), w1 = (float)(4 * g_world + 2);
    EXPECT(gw[0] == w0 && gw[1] == w1 && gw[2] == w0 && gw[3] == w1 && gb[0] == 2 && gb[1] == 2,
           "A's averaged gradient is [%g %g %g %g] [%g %g], want [%g %g %g %g] [2 2]", gw[0],
           gw[1], gw[2], gw[3], gb[0], gb[1], w0, w1, w0, w1);
  }
  mpt_ddp_free(ddp);
  mpt_tape_free(tape);
  mpt_model_free(m);
  expect_agree();
}
END_TEST

/* With find_unused_parameters, only rank 0 uses B: B's gradient is g0 / W on every rank, where
 * rank 0's local g0 is dW = column sums of x = [[4, 6], [4, 6]], db = [2, 2]. A is used by all:
 * dW row = [8r + 4, 8r + 6], averaged [4W, 4W + 2]; db = [2, 2]. */
START_TEST(test_f04_find_unused_parameters_counts_them_as_zero) {
  const int overlap = _i;
  ab_ctx ctx = {.use_b = g_rank == 0};
  expect_begin();
  mpt_model *m = ab_model(&ctx, 0);
  mpt_tape *tape = NULL;
  OK(mpt_tape_init(&tape, m, NULL));
  mpt_ddp_config dc = config_small(overlap);
  dc.find_unused_parameters = 1;
  mpt_ddp *ddp = NULL;
  OK(mpt_ddp_init(&ddp, m, g_comm, NULL, &dc));
  for (int step = 0; step < 2; step++) {
    uint64_t during = 0, total = 0;
    mpt_status st = ab_step(m, ddp, tape, &during, &total);
    EXPECT(st == MPT_OK, "step %d: finalize gave %s: %s", step, mpt_status_name(st),
           mpt_last_error());
    EXPECT(total == 4, "step %d: %llu all-reduces, want 4 (B's too)", step,
           (unsigned long long)total);
    const float *bw = mpt_model_grad(m, ctx.b.weight).data;
    const float *bb = mpt_model_grad(m, ctx.b.bias).data;
    const float *aw = mpt_model_grad(m, ctx.a.weight).data;
    const float *ab = mpt_model_grad(m, ctx.a.bias).data;
    const float W = (float)g_world;
    const float want_bw[4] = {4 / W, 6 / W, 4 / W, 6 / W}, want_bb[2] = {2 / W, 2 / W};
    const float want_aw[4] = {4 * W, 4 * W + 2, 4 * W, 4 * W + 2};
    for (int i = 0; i < 4; i++) {
      EXPECT(fabsf(bw[i] - want_bw[i]) <= 1e-6f * want_bw[i], "step %d: dB.weight[%d] = %.9g, "
             "want %.9g", step, i, bw[i], want_bw[i]);
      EXPECT(aw[i] == want_aw[i], "step %d: dA.weight[%d] = %.9g, want %.9g", step, i, aw[i],
             want_aw[i]);
    }
    for (int i = 0; i < 2; i++) {
      EXPECT(fabsf(bb[i] - want_bb[i]) <= 1e-6f * want_bb[i], "step %d: dB.bias[%d] = %.9g, "
             "want %.9g", step, i, bb[i], want_bb[i]);
      EXPECT(ab[i] == 2.0f, "step %d: dA.bias[%d] = %.9g, want 2", step, i, ab[i]);
    }
    if (g_world == 2) /* the docs/faults.md values, exactly: (g0 + 0) / 2 */
      EXPECT(bw[0] == 2 && bw[1] == 3 && bw[2] == 2 && bw[3] == 3 && bb[0] == 1 && bb[1] == 1,
             "dB = [%g %g %g %g] [%g %g], want [2 3 2 3] [1 1]", bw[0], bw[1], bw[2], bw[3],
             bb[0], bb[1]);
  }
  mpt_ddp_free(ddp);
  mpt_tape_free(tape);
  mpt_model_free(m);
  expect_agree();
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* F05 different models                                                                       */

/* L.weight [4, cols], L.bias [4], M.bias [4] (registered before L.bias when swap), + extra
 * [2], and the buffer "stat" [3]. */
static mpt_model *sig_model(int64_t cols, int extra, int swap, uint64_t seed) {
  mpt_model *m = NULL;
  int64_t w[2] = {4, cols}, b[1] = {4}, e[1] = {2}, s[1] = {3};
  OK(mpt_model_init(&m, mpt_device_cpu()));
  OK(mpt_model_add_param(m, "L.weight", 2, w, MPT_INIT_FAN_IN, cols, NULL));
  if (swap) OK(mpt_model_add_param(m, "M.bias", 1, b, MPT_INIT_FAN_IN, cols, NULL));
  OK(mpt_model_add_param(m, "L.bias", 1, b, MPT_INIT_FAN_IN, cols, NULL));
  if (!swap) OK(mpt_model_add_param(m, "M.bias", 1, b, MPT_INIT_FAN_IN, cols, NULL));
  if (extra) OK(mpt_model_add_param(m, "extra", 1, e, MPT_INIT_FAN_IN, 2, NULL));
  OK(mpt_model_add_buffer(m, "stat", 1, s, MPT_INIT_ZEROS, NULL));
  OK(mpt_model_finalize(m));
  OK(mpt_model_init_params(m, seed));
  return m;
}

/* Loop index 0: rank 1 has an extra [2] parameter; 1: rank 1 has [4,5] in place of [4,4];
 * 2: rank 1 registers M.bias before L.bias (same shapes, another order). */
START_TEST(test_f05_different_models_fail_init_on_every_rank) {
  const int kind = _i, odd = g_rank == 1;
  expect_begin();
  if (g_world < 2) return; /* needs a rank 1 */
  mpt_model *m = sig_model(odd && kind == 1 ? 5 : 4, odd && kind == 0, odd && kind == 2, 4);
  mpt_ddp *ddp = (mpt_ddp *)&ddp; /* must come back NULL */
  uint64_t s0 = mpt_comm_sequence(g_comm);
  mpt_status st = mpt_ddp_init(&ddp, m, g_comm, NULL, NULL);
  const char *msg = mpt_last_error();
  EXPECT(st == MPT_EMISMATCH && ddp == NULL, "init gave %s (engine %p), want MPT_EMISMATCH: %s",
         mpt_status_name(st), (void *)ddp, msg);
  if (kind == 0)
    EXPECT(strstr(msg, "rank 1 has 4 parameters") != NULL, "the error does not name rank 1 and "
           "its 4 parameters: %s", msg);
  else if (kind == 1)
    EXPECT(strstr(msg, "L.weight") && strstr(msg, "shape") && strstr(msg, "[4, 4]") &&
               strstr(msg, "rank 1 has float32 [4, 5]"),
           "the error does not name L.weight and both shapes: %s", msg);
  else
    EXPECT(strstr(msg, "parameter 1 ") && strstr(msg, "name") && strstr(msg, "rank 1"),
           "the error does not name parameter 1, its name and rank 1: %s", msg);
  /* Only the model check ran (all-gathers): nothing was broadcast or all-reduced, and the
   * ranks issued the same number of collectives (checked by the agreement below). */
  uint64_t used = mpt_comm_sequence(g_comm) - s0;
  EXPECT(used == (kind ? 2u : 1u), "init issued %llu collectives, want %d",
         (unsigned long long)used, kind ? 2 : 1);
  mpt_model_free(m);
  expect_agree();
}
END_TEST

START_TEST(test_f05_matching_models_start_bit_identical) {
  expect_begin();
  mpt_model *m = sig_model(4, 0, 0, 100 + (uint64_t)g_rank); /* different seeds */
  mpt_model *r0 = sig_model(4, 0, 0, 100);                   /* what rank 0 holds */
  float *stat = mpt_model_buffers(m);
  for (int i = 0; i < 3; i++) stat[i] = (float)(g_rank * 10 + i);
  mpt_ddp *ddp = NULL;
  OK(mpt_ddp_init(&ddp, m, g_comm, NULL, NULL));
  const int64_t n = mpt_model_param_count(m);
  EXPECT(memcmp(mpt_model_params(m), mpt_model_params(r0), (size_t)n * sizeof(float)) == 0,
         "the parameters are not rank 0's, bit for bit");
  EXPECT(stat[0] == 0.0f && stat[1] == 1.0f && stat[2] == 2.0f,
         "buffer 'stat' = [%g %g %g], want rank 0's [0 1 2]", stat[0], stat[1], stat[2]);
  mpt_ddp_free(ddp);
  mpt_model_free(r0);
  mpt_model_free(m);
  expect_agree();
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* F06 order of readiness                                                                     */

typedef struct branch_ctx {
  mpt_tensor x2;
  int p2_first;
} branch_ctx;

/* sum(x1 * p1 + x2 * p2), the x2 * p2 branch recorded first when p2_first. */
static mpt_status branch_forward(mpt_model *model, mpt_tape *tape, void *vctx, mpt_var *x1,
                                 mpt_var **y) {
  (void)model;
  const branch_ctx *c = vctx;
  mpt_var *p1 = NULL, *p2 = NULL, *x2 = NULL, *a = NULL, *b = NULL, *s = NULL;
  mpt_status st = mpt_tape_param(tape, 0, &p1);
  if (st == MPT_OK) st = mpt_tape_param(tape, 1, &p2);
  if (st == MPT_OK) st = mpt_tape_input(tape, &c->x2, &x2);
  if (st == MPT_OK && c->p2_first) st = mpt_nn_mul(tape, x2, p2, &b);
  if (st == MPT_OK) st = mpt_nn_mul(tape, x1, p1, &a);
  if (st == MPT_OK && !c->p2_first) st = mpt_nn_mul(tape, x2, p2, &b);
  if (st == MPT_OK) st = c->p2_first ? mpt_nn_add(tape, b, a, &s) : mpt_nn_add(tape, a, b, &s);
  if (st == MPT_OK) st = mpt_nn_sum(tape, s, y);
  return st;
}

/* Rank r: x1 = 2r + 1, x2 = 10 (r + 1) (rank 0: 1 and 10, rank 1: 3 and 20); odd ranks record
 * p2's branch first. Averages: p1 = W, p2 = 5 (W + 1) (W = 2: 2 and 15). */
START_TEST(test_f06_buckets_are_keyed_by_parameter_not_arrival) {
  const int overlap = _i;
  int64_t shape[1] = {4};
  float x1[4], x2[4];
  for (int i = 0; i < 4; i++) {
    x1[i] = (float)(2 * g_rank + 1);
    x2[i] = (float)(10 * (g_rank + 1));
  }
  branch_ctx ctx = {.x2 = mpt_tensor_view(x2, mpt_device_cpu(), MPT_F32, 1, shape),
                    .p2_first = g_rank % 2};
  expect_begin();
  mpt_model *m = NULL;
  OK(mpt_model_init(&m, mpt_device_cpu()));
  OK(mpt_model_add_param(m, "p1", 1, shape, MPT_INIT_ONES, 1, NULL));
  OK(mpt_model_add_param(m, "p2", 1, shape, MPT_INIT_ONES, 1, NULL));
  mpt_model_set_forward(m, branch_forward, &ctx, NULL);
  OK(mpt_model_finalize(m));
  OK(mpt_model_init_params(m, 0));
  for (int i = 0; i < 4; i++) mpt_model_params(m)[4 + i] = 2.0f; /* p2 = 2s */
  mpt_tape *tape = NULL;
  OK(mpt_tape_init(&tape, m, NULL));
  mpt_ddp_config dc = config_small(overlap);
  mpt_ddp *ddp = NULL;
  OK(mpt_ddp_init(&ddp, m, g_comm, NULL, &dc));
  EXPECT(mpt_ddp_num_buckets(ddp) == 2 && mpt_ddp_param_bucket(ddp, 1) == 0 &&
             mpt_ddp_param_bucket(ddp, 0) == 1,
         "want p2 in bucket 0 and p1 in bucket 1, got %d buckets (%d, %d)",
         mpt_ddp_num_buckets(ddp), mpt_ddp_param_bucket(ddp, 0), mpt_ddp_param_bucket(ddp, 1));
  mpt_tensor x1t = mpt_tensor_view(x1, mpt_device_cpu(), MPT_F32, 1, shape);
  mpt_var *xv = NULL, *loss = NULL;
  OK(mpt_model_zero_grad(m, NULL));
  mpt_tape_reset(tape, 1);
  OK(mpt_tape_input(tape, &x1t, &xv));
  OK(mpt_model_forward(m, tape, xv, &loss));
  mpt_status st = mpt_tape_backward(tape, loss, 1.0f);
  EXPECT(st == MPT_OK, "backward: %s: %s", mpt_status_name(st), mpt_last_error());
  const float *g = mpt_model_grads(m);
  const float w1 = (float)g_world, w2 = 5.0f * (float)(g_world + 1);
  for (int i = 0; i < 4; i++) {
    EXPECT(g[i] == w1, "dp1[%d] = %g, want %g", i, g[i], w1);
    EXPECT(g[4 + i] == w2, "dp2[%d] = %g, want %g", i, g[4 + i], w2);
  }
  if (g_world == 2)
    EXPECT(g[0] == 2 && g[4] == 15, "dp1 = %g, dp2 = %g, want 2 and 15", g[0], g[4]);
  mpt_ddp_free(ddp);
  mpt_tape_free(tape);
  mpt_model_free(m);
  expect_agree();
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* F07 mean exactly once                                                                      */

static mpt_status linear_only_forward(mpt_model *model, mpt_tape *tape, void *ctx, mpt_var *x,
                                     mpt_var **y) {
  (void)model;
  return mpt_linear_forward(tape, ctx, x, y);
}

/* Scalar w as a 1x1 Linear without bias on x [n, 1]: loss = mean_i(w * x_i). Returns dloss/dw
 * for x_i = start + 2i, computed on `m` (with DDP when ddp != NULL). */
static float mean_grad(mpt_model *m, mpt_ddp *ddp, const mpt_linear *lin, int64_t n,
                       float start) {
  (void)lin; /* the model's forward applies it */
  float *x = malloc((size_t)n * sizeof *x);
  ck_assert(x);
  for (int64_t i = 0; i < n; i++) x[i] = start + 2.0f * (float)i;
  int64_t shape[2] = {n, 1};
  mpt_tensor xt = mpt_tensor_view(x, mpt_device_cpu(), MPT_F32, 2, shape);
  mpt_tape *tape = NULL;
  mpt_var *xv = NULL, *y = NULL, *loss = NULL;
  OK(mpt_tape_init(&tape, m, NULL));
  OK(mpt_model_zero_grad(m, NULL));
  OK(mpt_tape_input(tape, &xt, &xv));
  OK(mpt_model_forward(m, tape, xv, &y));
  OK(mpt_nn_mean(tape, y, &loss));
  (void)ddp; /* attached to m: backward averages */
  mpt_status st = mpt_tape_backward(tape, loss, 1.0f);
  EXPECT(st == MPT_OK, "backward: %s: %s", mpt_status_name(st), mpt_last_error());
  float g = mpt_model_grads(m)[0];
  mpt_tape_free(tape);
  free(x);
  return g;
}

START_TEST(test_f07_gradient_is_divided_by_world_size_exactly_once) {
  expect_begin();
  mpt_model *m = NULL, *one = NULL;
  mpt_linear lin, lin1;
  OK(mpt_model_init(&m, mpt_device_cpu()));
  OK(mpt_linear_add(m, "w", 1, 1, 0, &lin));
  mpt_model_set_forward(m, linear_only_forward, &lin, NULL);
  OK(mpt_model_finalize(m));
  OK(mpt_model_init_params(m, 1));
  OK(mpt_model_init(&one, mpt_device_cpu()));
  OK(mpt_linear_add(one, "w", 1, 1, 0, &lin1));
  mpt_model_set_forward(one, linear_only_forward, &lin1, NULL);
  OK(mpt_model_finalize(one));
  OK(mpt_model_init_params(one, 1));
  mpt_ddp *ddp = NULL;
  OK(mpt_ddp_init(&ddp, m, g_comm, NULL, NULL));
  /* rank r: x = [4r + 1, 4r + 3]; one process: x = [1, 3, ..., 4W - 1] */
  float g = mean_grad(m, ddp, &lin, 2, (float)(4 * g_rank + 1));
  float g1 = mean_grad(one, NULL, &lin1, 2 * g_world, 1.0f);
  const float want = 2.0f * (float)g_world;
  EXPECT(g == want, "DDP gradient %.9g, want %g (%g = divided twice, %g = summed)", g, want,
         want / (float)g_world, want * (float)g_world);
  EXPECT(fabsf(g1 - want) <= 1e-6f * want, "one process on all x: %.9g, want %g", g1, want);
  if (g_world == 2) EXPECT(g == 4.0f && g1 == 4.0f, "W = 2: %g and %g, want 4.0", g, g1);
  mpt_ddp_free(ddp);
  mpt_model_free(m);
  mpt_model_free(one);
  expect_agree();
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* F08 buffers                                                                                */

typedef struct bn_ctx {
  mpt_batchnorm bn;
} bn_ctx;

static mpt_status bn_forward(mpt_model *model, mpt_tape *tape, void *vctx, mpt_var *x,
                             mpt_var **y) {
  (void)model;
  return mpt_batchnorm_forward(tape, &((bn_ctx *)vctx)->bn, x, y);
}

/* Loop index = mpt_ddp_buffer_mode. Rank r's data [10r - 1, 10r + 1]: batch mean 10r, unbiased
 * variance 2. */
START_TEST(test_f08_buffers_follow_the_buffer_mode) {
  const mpt_ddp_buffer_mode mode = (mpt_ddp_buffer_mode)_i;
  bn_ctx ctx;
  expect_begin();
  mpt_model *m = NULL;
  OK(mpt_model_init(&m, mpt_device_cpu()));
  OK(mpt_batchnorm_add(m, "bn", 1, &ctx.bn));
  ctx.bn.momentum = 1.0f;
  mpt_model_set_forward(m, bn_forward, &ctx, NULL);
  OK(mpt_model_finalize(m));
  OK(mpt_model_init_params(m, 1));
  mpt_tape *tape = NULL;
  OK(mpt_tape_init(&tape, m, NULL));
  mpt_ddp_config dc = mpt_ddp_config_default();
  dc.buffers = mode;
  dc.timeout_ms = 30000;
  mpt_ddp *ddp = NULL;
  OK(mpt_ddp_init(&ddp, m, g_comm, NULL, &dc));
  const float *rmean = mpt_model_buffer(m, ctx.bn.running_mean).data;
  const float *rvar = mpt_model_buffer(m, ctx.bn.running_var).data;
  const float mine = 10.0f * (float)g_rank;
  float x[2] = {mine - 1.0f, mine + 1.0f};
  int64_t shape[2] = {2, 1};
  mpt_tensor xt = mpt_tensor_view(x, mpt_device_cpu(), MPT_F32, 2, shape);
  for (int step = 0; step < 2; step++) {
    mpt_var *xv = NULL, *y = NULL, *loss = NULL;
    if (step > 0) OK(mpt_model_consume_grads(m)); /* no optimizer here: say so */
    OK(mpt_model_zero_grad(m, NULL));
    mpt_tape_reset(tape, 1);
    OK(mpt_tape_input(tape, &xt, &xv));
    OK(mpt_model_forward(m, tape, xv, &y)); /* DDP synchronises the buffers first */
    OK(mpt_nn_sum(tape, y, &loss));
    OK(mpt_tape_backward(tape, loss, 1.0f));
    /* after the step: this rank's own batch statistics (momentum 1) */
    EXPECT(rmean[0] == mine && rvar[0] == 2.0f, "step %d: after the step running mean %g, var "
           "%g; want this rank's %g and 2", step, rmean[0], rvar[0], mine);
  }
  OK(mpt_ddp_sync_buffers(ddp)); /* what the next forward would see */
  float want = mode == MPT_DDP_BUFFERS_BROADCAST ? 0.0f
               : mode == MPT_DDP_BUFFERS_AVERAGE ? 5.0f * (float)(g_world - 1)
                                                 : mine;
  EXPECT(rmean[0] == want && rvar[0] == 2.0f, "mode %d: synchronised running mean %g, var %g; "
         "want %g and 2", (int)mode, rmean[0], rvar[0], want);
  if (g_world == 2 && mode != MPT_DDP_BUFFERS_NONE)
    EXPECT(rmean[0] == (mode == MPT_DDP_BUFFERS_BROADCAST ? 0.0f : 5.0f),
           "W = 2: running mean %g", rmean[0]);
  mpt_ddp_free(ddp);
  mpt_tape_free(tape);
  mpt_model_free(m);
  expect_agree();
}
END_TEST

static Suite *faults_suite(void) {
  Suite *s = suite_create("ddp_faults");
  TCase *tc = tcase_create("faults");
  tcase_add_test(tc, test_f03_uneven_batch_counts_fail_on_every_rank_naming_short_ranks);
  tcase_add_loop_test(tc, test_f04_unused_parameters_fail_first_step_naming_them, 0, 4);
  tcase_add_loop_test(tc, test_f04_find_unused_parameters_counts_them_as_zero, 0, 2);
  tcase_add_loop_test(tc, test_f05_different_models_fail_init_on_every_rank, 0, 3);
  tcase_add_test(tc, test_f05_matching_models_start_bit_identical);
  tcase_add_loop_test(tc, test_f06_buckets_are_keyed_by_parameter_not_arrival, 0, 2);
  tcase_add_test(tc, test_f07_gradient_is_divided_by_world_size_exactly_once);
  tcase_add_loop_test(tc, test_f08_buffers_follow_the_buffer_mode, 0, 3);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  return mpi_check_main("test_faults", 30000, &g_comm, &g_world, faults_suite);
}
