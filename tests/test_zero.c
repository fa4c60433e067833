/* ZeRO-1, 2 and 3 in the DDP engine (ddp.h "ZeRO", src/ddp/zero.c), run under mpirun with
 * 2, 3 and 4 ranks by tests/test_zero.sh (stage 1), tests/test_zero2.sh (stage 2) and
 * tests/test_zero3.sh (stage 3: the program's argument; every "ZeRO-1" below is then ZeRO-2,
 * whose steps are ZeRO-1's with the gradient memory outside the shard given back after each
 * bucket's reduce-scatter, or ZeRO-3, which also keeps only the parameter shard between steps
 * and gathers each unit's buckets when a forward or backward takes its parameters).
 *
 * - Equivalence: the same model wrapped twice, plain DDP and ZeRO-1, trained side by side for 20
 *   steps on the same per-rank batches (AdamW with decay on the >= 2-D weights only through
 *   parameter groups, so shards cut groups; clipping by the global norm, active): after every
 *   step the global norms are the same float and after the 20 steps the parameters the same
 *   bytes, the ZeRO replicas bit-identical across ranks. MLP 784-62-63-10 (53279
 *   parameters), CNN (8549) and a tiny GPT (L 1, H 5, C 25, T 8, V 23: 11275): counts odd and not
 *   divisible by 3, so no W of 2, 3, 4 divides them; several buckets and one; overlap on and
 *   off; SGD with momentum; bf16 gradients (against plain DDP with bf16 gradients).
 *   Bit for bit at every W: plain DDP runs with config.allreduce = MPT_DDP_ALLREDUCE_RS_AG
 *   (ddp.h): its all-reduce of a bucket is the reduce-scatter ZeRO-1 issues for the bucket,
 *   followed by an all-gather, and its clipping sums the squares in ZeRO-1's per-shard
 *   partition and rank order. (With MPI_Allreduce instead, the parameters differed from
 *   ZeRO-1's by 2e-6 to 1.4e-5 relative after 20 AdamW steps at W = 3 and 4: MPI's
 *   all-reduce and reduce-scatter add the ranks in different orders, and AdamW turns ulps of
 *   an average that nearly cancels into more; bf16 sums diverged entirely.) A fault (a shard
 *   not stepped, a bucket not gathered, a sum instead of a mean, a norm of one shard only)
 *   moves parameters by 1e-3 and more; a different summation order by an ulp or more.
 * - Exact averages: small-integer gradients reduce-scattered (fp32 and bf16) are the exact
 *   average on every owned element; one NaN in one rank's shard makes every rank's non-finite
 *   check and clipping norm say so (the ranks skip a step together).
 * - Memory: the optimizer state of each rank is exactly its shard: hand-computed counts for
 *   the MLP (one bucket: ceil(N / W), the last shorter; a rank with nothing at W = 3 for a
 *   4-parameter model); the counts add up to N over the ranks.
 * - Bytes: after one step the engine counted (W-1)/W (4 N + 4 N) bytes for ZeRO-1, and
 *   2 (W-1)/W 4 N for plain DDP.
 * - Checkpoints: a ZeRO-1 run saved at step 4 (the state gathered into rank 0's whole optimizer
 *   only, the other ranks passing NULL, then one file) and resumed
 *   with ZeRO-1 ends bit-identical to the run that went on, and so does one resumed without
 *   ZeRO; a plain run's checkpoint resumed with ZeRO too. The ckpt functions refuse a sharded
 *   optimizer.
 * - Gradient memory (the stage's own property): after a backward, ZeRO-2 keeps resident (mincore)
 *   only the pages of the gradient buffer that hold this rank's shard (plus at most two pages
 *   per bucket cut by a shard's edges), and after zero_grad none (but the buffer's two end
 *   pages); ZeRO-1 keeps all of them.
 * - Parameter memory: after the step ZeRO-3 keeps resident only the parameter pages of the
 *   shard (as the gradients' above); the other stages all of them.
 * - Refusals: stage 4, an optimizer not made for the shard.
 *
 * MPI rules as tests/test_ddp.c: no forking, soft checks agreed across ranks per test. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "mpitrain/ckpt.h"
#include "mpitrain/comm.h"
#include "mpitrain/ddp.h"
#include "mpitrain/optim.h"
#include "mpitrain/transformer.h"

static mpt_comm *g_comm;
static int g_rank, g_world;

#define MPI_CHECK_COMM g_comm
#include "mpi_check.h"

enum { KIND_MLP, KIND_CNN, KIND_GPT, KIND_TINY };
enum { STEPS = 20, PER_RANK = 4, CLASSES = 10, TT = 8, VOCAB = 23, MAX_GROUPS = 64 };
#define MAX_NORM 0.05f
#define TOL 1e-6

static mpt_model *model_make(int kind, uint64_t seed) {
  mpt_model *m = NULL;
  if (kind == KIND_GPT) {
    mpt_gpt_config c = {.max_seq_len = TT, .vocab_size = VOCAB, .num_layers = 1,
                        .num_heads = 5, .channels = 25, .padded_vocab_size = 0};
    OK(mpt_model_init_gpt(&m, mpt_device_cpu(), &c, seed));
  } else if (kind == KIND_CNN) {
    mpt_cnn_config c = mpt_cnn_config_default();
    c.height = c.width = 12;
    c.conv1_channels = 8;
    c.conv2_channels = 16;
    c.kernel = 5;
    c.hidden = 33;
    c.num_classes = CLASSES;
    OK(mpt_model_init_cnn(&m, mpt_device_cpu(), &c, seed));
  } else {
    mpt_mlp_config c = mpt_mlp_config_default();
    c.input_size = kind == KIND_TINY ? 1 : 784;
    c.num_hidden = kind == KIND_TINY ? 0 : 2;
    c.hidden[0] = 62;
    c.hidden[1] = 63;
    c.num_classes = kind == KIND_TINY ? 2 : CLASSES;
    OK(mpt_model_init_mlp(&m, mpt_device_cpu(), &c, seed));
  }
  return m;
}

static int64_t features(int kind) {
  return kind == KIND_GPT ? TT + 1 : kind == KIND_CNN ? 144 : kind == KIND_TINY ? 1 : 784;
}

/* This rank's batch of step `step`: inputs uniform in (-1, 1) (GPT: token windows of T + 1),
 * labels in [0, classes). */
typedef struct batch {
  float x[PER_RANK * 784];
  int32_t y[PER_RANK], tok[PER_RANK * TT], tgt[PER_RANK * TT];
} batch;

static void batch_fill(batch *b, int kind, int step) {
  mpt_rng rng;
  mpt_rng_seed(&rng, 1000u * (uint64_t)step + (uint64_t)g_rank + 7);
  mpt_rng_fill_uniform(&rng, b->x, PER_RANK * features(kind), -1.0f, 1.0f);
  const int classes = kind == KIND_TINY ? 2 : CLASSES;
  for (int i = 0; i < PER_RANK; i++) b->y[i] = (int32_t)mpt_rng_below(&rng, (uint64_t)classes);
  for (int s = 0; s < PER_RANK; s++)
    for (int t = 0; t < TT; t++) {
      b->tok[s * TT + t] = (int32_t)mpt_rng_below(&rng, VOCAB);
      b->tgt[s * TT + t] = (int32_t)mpt_rng_below(&rng, VOCAB);
    }
}

static void forward_backward(mpt_model *m, mpt_tape *tape, int kind, batch *b) {
  int64_t xs_mlp[2] = {PER_RANK, features(kind)}, xs_cnn[4] = {PER_RANK, 1, 12, 12};
  int64_t ys[1] = {PER_RANK}, ts[2] = {PER_RANK, TT};
  mpt_tensor xt, yt;
  if (kind == KIND_GPT) {
    xt = mpt_tensor_view(b->tok, mpt_device_cpu(), MPT_I32, 2, ts);
    yt = mpt_tensor_view(b->tgt, mpt_device_cpu(), MPT_I32, 2, ts);
  } else {
    xt = kind == KIND_CNN ? mpt_tensor_view(b->x, mpt_device_cpu(), MPT_F32, 4, xs_cnn)
                          : mpt_tensor_view(b->x, mpt_device_cpu(), MPT_F32, 2, xs_mlp);
    yt = mpt_tensor_view(b->y, mpt_device_cpu(), MPT_I32, 1, ys);
  }
  mpt_var *xv = NULL, *out = NULL, *loss = NULL;
  OK(mpt_model_zero_grad(m, NULL));
  mpt_tape_reset(tape, 1);
  OK(mpt_tape_input(tape, &xt, &xv));
  OK(mpt_model_forward(m, tape, xv, &out));
  if (kind == KIND_GPT)
    OK(mpt_nn_cross_entropy_vocab(tape, out, &yt, VOCAB, &loss));
  else
    OK(mpt_nn_cross_entropy(tape, out, &yt, &loss));
  OK(mpt_tape_backward(tape, loss, 1.0f));
}

typedef struct run {
  mpt_model *m;
  mpt_tape *tape;
  mpt_ddp *ddp;
  mpt_optimizer *opt;
  int kind;
} run;

static mpt_optimizer_config optim_config(int sgd) {
  mpt_optimizer_config c = mpt_optimizer_config_default();
  c.kind = sgd ? MPT_OPTIM_SGD : MPT_OPTIM_ADAMW;
  c.lr = sgd ? 0.05f : 1e-2f;
  c.momentum = 0.9f;
  c.beta2 = 0.95f;
  return c;
}

/* of the runs made next: rs-ag, so that plain DDP sums as ZeRO-1 does (see the top) */
static mpt_ddp_allreduce_algo g_algo = MPT_DDP_ALLREDUCE_RS_AG;

/* The ZeRO stage of the runs made with zero != 0 (the program's argument, default 1). */
static int g_stage = 1;

static run run_make(int kind, uint64_t seed, int zero, int overlap, double cap_mb,
                    mpt_ddp_grad_comm wire, int sgd) {
  run r = {.kind = kind};
  r.m = model_make(kind, seed);
  OK(mpt_tape_init(&r.tape, r.m, NULL));
  mpt_ddp_config dc = mpt_ddp_config_default();
  dc.overlap = overlap;
  dc.bucket_cap_mb = cap_mb;
  dc.first_bucket_cap_mb = cap_mb < 1 ? cap_mb : 1;
  dc.timeout_ms = 30000;
  dc.grad_comm = wire;
  dc.zero = zero ? g_stage : 0;
  dc.allreduce = g_algo;
  dc.unit_buckets = g_stage == 3; /* ZeRO-3's plan (one bucket per unit) for both runs */
  OK(mpt_ddp_init(&r.ddp, r.m, g_comm, NULL, &dc));
  mpt_optimizer_config oc = optim_config(sgd);
  OK(mpt_ddp_optimizer_init(r.ddp, &r.opt, &oc, mpt_device_cpu()));
  mpt_param_group groups[MAX_GROUPS];
  int ng = 0;
  OK(mpt_param_groups_split_decay(r.m, 0.1f, groups, MAX_GROUPS, &ng));
  OK(mpt_optimizer_set_groups(r.opt, groups, ng));
  return r;
}

static void run_free(run *r) {
  mpt_optimizer_free(r->opt);
  mpt_ddp_free(r->ddp);
  mpt_tape_free(r->tape);
  mpt_model_free(r->m);
}

/* One step on step `step`'s batch; returns the global norm before clipping. */
static float run_step(run *r, int step) {
  batch *b = malloc(sizeof *b);
  ck_assert(b);
  batch_fill(b, r->kind, step);
  forward_backward(r->m, r->tape, r->kind, b);
  float norm = 0;
  OK(mpt_ddp_clip_grad_norm(r->ddp, NULL, MAX_NORM, &norm));
  OK(mpt_ddp_optimizer_step(r->ddp, r->opt, NULL, optim_config(0).lr));
  free(b);
  return norm;
}

typedef struct equiv_case {
  int kind, overlap;
  double cap_mb;
  mpt_ddp_grad_comm wire;
  int sgd;
} equiv_case;

static const equiv_case CASES[] = {
    {KIND_MLP, 1, 0.01, MPT_DDP_GRAD_FP32, 0}, {KIND_MLP, 0, 25, MPT_DDP_GRAD_FP32, 0},
    {KIND_CNN, 1, 0.01, MPT_DDP_GRAD_FP32, 0}, {KIND_CNN, 0, 0.01, MPT_DDP_GRAD_FP32, 0},
    {KIND_GPT, 1, 0.01, MPT_DDP_GRAD_FP32, 0}, {KIND_GPT, 1, 25, MPT_DDP_GRAD_FP32, 0},
    {KIND_MLP, 1, 0.01, MPT_DDP_GRAD_FP32, 1}, {KIND_MLP, 1, 0.01, MPT_DDP_GRAD_BF16, 0},
    {KIND_TINY, 1, 25, MPT_DDP_GRAD_FP32, 0},
};

START_TEST(test_zero1_equals_plain_ddp) {
  const equiv_case *c = &CASES[_i];
  expect_begin();
  run d = run_make(c->kind, 11, 0, c->overlap, c->cap_mb, c->wire, c->sgd);
  run z = run_make(c->kind, 11 + (uint64_t)g_rank, 1, c->overlap, c->cap_mb, c->wire, c->sgd);
  const int64_t n = mpt_model_param_count(d.m);
  float *start = malloc(sizeof(float) * (size_t)n);
  ck_assert(start);
  memcpy(start, mpt_model_params(d.m), sizeof(float) * (size_t)n);
  if (c->kind != KIND_TINY)
    EXPECT(n % 2 != 0 && n % 3 != 0, "%lld parameters: divisible by 2 or 3", (long long)n);
  if (c->cap_mb < 1)
    EXPECT(mpt_ddp_num_buckets(z.ddp) > 1, "want several buckets, got %d",
           mpt_ddp_num_buckets(z.ddp));
  double worst_norm = 0, first_norm = 0;
  for (int s = 0; s < STEPS; s++) {
    float nd = run_step(&d, s), nz = run_step(&z, s);
    double rel = fabs((double)nd - (double)nz) / fmax((double)nd, 1e-30);
    if (rel > worst_norm) worst_norm = rel;
    if (s == 0) first_norm = rel;
    if (s == 0 && c->kind != KIND_TINY)
      EXPECT(nd > MAX_NORM, "norm %g: clipping at %g inactive", nd, (double)MAX_NORM);
  }
  OK(mpt_ddp_gather_params(z.ddp)); /* ZeRO-3: whole to compare (else nothing) */
  const double err = rel_diff(mpt_model_params(z.m), mpt_model_params(d.m), n);
  const double moved = rel_diff(mpt_model_params(d.m), start, n);
  /* the same sums in the same order (see the top): bit-identical at every W */
  const int same = memcmp(mpt_model_params(z.m), mpt_model_params(d.m), sizeof(float) *
                          (size_t)n) == 0;
  EXPECT(same && worst_norm == 0, "kind %d at %d ranks: ZeRO-1 parameters differ from DDP's by "
         "%.3g relative (first norms %.3g, worst %.3g; want the same bits)", c->kind, g_world,
         err, first_norm, worst_norm);
  EXPECT(moved > 1e-3, "training did not move the parameters (%.3g)", moved);
  EXPECT(same_on_all_ranks(mpt_model_params(z.m), n), "ZeRO replicas differ across ranks");
  if (g_rank == 0)
    printf("zero%d case %d at %d ranks: %lld parameters, %d bucket(s), params rel diff %.3g, "
           "norm rel diff %.3g, moved %.3g\n", g_stage, _i, g_world, (long long)n,
           mpt_ddp_num_buckets(z.ddp), err, worst_norm, moved);
  free(start);
  run_free(&d);
  run_free(&z);
  expect_agree();
}
END_TEST

/* Plain DDP with the backend's all-reduce (MPT_DDP_ALLREDUCE_NATIVE, the default: MPI_Allreduce)
 * against rs-ag, 20 steps of the MLP (two buckets), clipping on: at W = 2 the same bits (a sum of
 * two is the same in either order; the norms' sums of squares are added in other orders, whole
 * buffer against shards, but give the same float clipping coefficient on these inputs); at W > 2
 * SGD within 1e-6 relative (other summation orders: measured 3e-8 at W = 3, 6e-8 at W = 4),
 * AdamW only run (measured 4e-7 and 9e-6: see the top). Also the names and a bad value. */
START_TEST(test_native_allreduce_matches_rs_ag) {
  expect_begin();
  mpt_ddp_allreduce_algo a = MPT_DDP_ALLREDUCE_NATIVE;
  EXPECT(mpt_ddp_allreduce_algo_parse("rs-ag", &a) == MPT_OK && a == MPT_DDP_ALLREDUCE_RS_AG &&
             mpt_ddp_allreduce_algo_parse("native", &a) == MPT_OK &&
             a == MPT_DDP_ALLREDUCE_NATIVE && mpt_ddp_allreduce_algo_parse("ring", &a) ==
             MPT_EINVAL && strcmp(mpt_ddp_allreduce_algo_name(MPT_DDP_ALLREDUCE_RS_AG),
                                  "rs-ag") == 0, "allreduce algorithm names");
  mpt_model *m = model_make(KIND_TINY, 1);
  mpt_ddp *bad = NULL;
  mpt_ddp_config dc = mpt_ddp_config_default();
  dc.allreduce = (mpt_ddp_allreduce_algo)7;
  EXPECT(mpt_ddp_init(&bad, m, g_comm, NULL, &dc) == MPT_EINVAL && !bad,
         "allreduce algorithm 7 was accepted");
  mpt_model_free(m);
  for (int sgd = 0; sgd <= 1; sgd++) {
    g_algo = MPT_DDP_ALLREDUCE_NATIVE;
    run nat = run_make(KIND_MLP, 5, 0, 1, 0.01, MPT_DDP_GRAD_FP32, sgd);
    g_algo = MPT_DDP_ALLREDUCE_RS_AG;
    run rsag = run_make(KIND_MLP, 5, 0, 1, 0.01, MPT_DDP_GRAD_FP32, sgd);
    const int64_t n = mpt_model_param_count(nat.m);
    for (int s = 0; s < STEPS; s++) {
      run_step(&nat, s);
      run_step(&rsag, s);
    }
    const float *pn = mpt_model_params(nat.m), *pr = mpt_model_params(rsag.m);
    const double err = rel_diff(pr, pn, n);
    if (g_world == 2)
      EXPECT(memcmp(pn, pr, sizeof(float) * (size_t)n) == 0, "sgd %d at 2 ranks: native and "
             "rs-ag differ by %.3g relative (want the same bits)", sgd, err);
    else if (sgd)
      EXPECT(err <= TOL, "sgd at %d ranks: native and rs-ag differ by %.3g relative", g_world,
             err);
    EXPECT(same_on_all_ranks(pn, n) && same_on_all_ranks(pr, n), "replicas differ across ranks");
    if (g_rank == 0)
      printf("native vs rs-ag, sgd %d at %d ranks: params rel diff %.3g\n", sgd, g_world, err);
    run_free(&nat);
    run_free(&rsag);
  }
  /* bf16 gradients: the native all-reduce and rs-ag both reduce through the comm's bfloat16
   * reduce-scatter (float32 sum in rank order, one rounding), so the averaged gradients are the
   * same bits at every W (per-hop roundings in MPI_Allreduce's own tree would differ at W > 2). */
  g_algo = MPT_DDP_ALLREDUCE_NATIVE;
  run nat = run_make(KIND_MLP, 5, 0, 1, 0.01, MPT_DDP_GRAD_BF16, 0);
  g_algo = MPT_DDP_ALLREDUCE_RS_AG;
  run rsag = run_make(KIND_MLP, 5, 0, 1, 0.01, MPT_DDP_GRAD_BF16, 0);
  batch *b = malloc(sizeof *b);
  ck_assert(b);
  batch_fill(b, KIND_MLP, 0);
  forward_backward(nat.m, nat.tape, KIND_MLP, b);
  forward_backward(rsag.m, rsag.tape, KIND_MLP, b);
  const int64_t n = mpt_model_param_count(nat.m);
  EXPECT(memcmp(mpt_model_grads(nat.m), mpt_model_grads(rsag.m), sizeof(float) * (size_t)n) ==
         0, "bf16 at %d ranks: native and rs-ag average gradients differ", g_world);
  OK(mpt_model_consume_grads(nat.m));
  OK(mpt_model_consume_grads(rsag.m));
  free(b);
  run_free(&nat);
  run_free(&rsag);
  expect_agree();
}
END_TEST

/* Hand-computed shards of the MLP's 53279 parameters in one bucket: ceil(53279 / W) per rank,
 * the last rank what is left. */
static int64_t want_mlp_shard(int world, int rank) {
  static const int64_t w2[] = {26640, 26639}, w3[] = {17760, 17760, 17759},
                       w4[] = {13320, 13320, 13320, 13319};
  return world == 2 ? w2[rank] : world == 3 ? w3[rank] : w4[rank];
}

/* The same MLP with one bucket per unit (ZeRO-3): fc1 48670, fc2 3969, fc3 640 parameters,
 * each split by mpt_comm_shard (W = 3: 16224 16224 16222, 1323 x 3, 214 214 212). */
static int64_t want_mlp_unit_shard(int world, int rank) {
  static const int64_t w2[] = {26640, 26639}, w3[] = {17761, 17761, 17757},
                       w4[] = {13321, 13321, 13321, 13316};
  return world == 2 ? w2[rank] : world == 3 ? w3[rank] : w4[rank];
}

START_TEST(test_zero1_optimizer_state_is_the_shard) {
  expect_begin();
  run z = run_make(KIND_MLP, 5, 1, 1, 25, MPT_DDP_GRAD_FP32, 0);
  run d = run_make(KIND_MLP, 5, 0, 1, 25, MPT_DDP_GRAD_FP32, 0);
  mpt_optimizer_state sz, sd;
  OK(mpt_optimizer_get_state(z.opt, &sz));
  OK(mpt_optimizer_get_state(d.opt, &sd));
  /* ZeRO-3: one bucket per unit (fc1, fc2, fc3), each a unit's exact parameter range */
  const int want_buckets = g_stage == 3 ? 3 : 1;
  EXPECT(mpt_ddp_num_buckets(z.ddp) == want_buckets, "%d buckets, want %d",
         mpt_ddp_num_buckets(z.ddp), want_buckets);
  if (g_stage == 3) {
    const int *first = NULL;
    const int nu = mpt_model_units(z.m, &first);
    EXPECT(nu == 3, "%d units", nu);
    for (int u = 0; u < nu && u < mpt_ddp_num_buckets(z.ddp); u++) {
      const mpt_ddp_bucket_info *bk = mpt_ddp_bucket(z.ddp, nu - 1 - u); /* launched last first */
      const int last = u + 1 < nu ? first[u + 1] - 1 : mpt_model_num_params(z.m) - 1;
      EXPECT(bk->last_param == first[u] && bk->first_param == last, "bucket %d holds parameters "
             "%d..%d, unit %d is %d..%d", nu - 1 - u, bk->last_param, bk->first_param, u,
             first[u], last);
    }
  }
  EXPECT(mpt_model_param_count(z.m) == 53279, "%lld parameters",
         (long long)mpt_model_param_count(z.m));
  const int64_t want_shard = g_stage == 3 ? want_mlp_unit_shard(g_world, g_rank)
                                          : want_mlp_shard(g_world, g_rank);
  EXPECT(sz.nbuffers == 2 && sz.count == want_shard,
         "rank %d: %d state buffers of %lld, want 2 of %lld", g_rank, sz.nbuffers,
         (long long)sz.count, (long long)want_shard);
  EXPECT(sd.count == 53279, "plain DDP state of %lld", (long long)sd.count);
  EXPECT(mpt_ddp_shard_count(z.ddp) == sz.count, "shard %lld, state %lld",
         (long long)mpt_ddp_shard_count(z.ddp), (long long)sz.count);
  /* bytes of one step: ring model, fp32 */
  run_step(&z, 0);
  run_step(&d, 0);
  const double n = 53279, f = (double)(g_world - 1) / g_world;
  if (g_stage == 3) { /* one all-gather per unit. Whole after init, the first step's forward
                       * gives back every unit but fc1 when it takes fc1, then gathers fc2 and
                       * fc3, and moving to fc3 gives fc1 back: backward gathers fc1 again (3
                       * all-gathers, N elements), besides the reduce-scatter's N. The second
                       * step starts from the shards: fc1, fc2, fc3 in forward, fc1 again in
                       * backward (4 all-gathers, N + 48670 elements) */
    /* (summed per collective: equal up to the rounding of (W-1)/W) */
    EXPECT(fabs(mpt_ddp_sent_bytes(z.ddp) - 2 * f * 4 * n) <= 1e-9 * n, "ZeRO-3 sent %.0f bytes "
           "in the first step, want %.0f", mpt_ddp_sent_bytes(z.ddp), 2 * f * 4 * n);
    EXPECT(mpt_ddp_param_gathers(z.ddp) == 3, "%lld gathers in the first step, want 3",
           (long long)mpt_ddp_param_gathers(z.ddp));
    const double before = mpt_ddp_sent_bytes(z.ddp), want2 = f * 4 * (2 * n + 48670);
    run_step(&z, 1);
    EXPECT(fabs(mpt_ddp_sent_bytes(z.ddp) - before - want2) <= 1e-9 * n, "ZeRO-3 sent %.0f bytes in the "
           "second step, want %.0f", mpt_ddp_sent_bytes(z.ddp) - before, want2);
    EXPECT(mpt_ddp_param_gathers(z.ddp) == 3 + 4, "%lld gathers after the second step, want 7 "
           "(one per unit: 3 in forward, fc1 again in backward)",
           (long long)mpt_ddp_param_gathers(z.ddp));
    EXPECT(mpt_ddp_step_bytes(z.ddp) == 2 * f * 4 * n, "step bytes %.0f",
           mpt_ddp_step_bytes(z.ddp));
  } else {
    EXPECT(mpt_ddp_sent_bytes(z.ddp) == f * 4 * n + f * 4 * n, "ZeRO sent %.0f bytes, want %.0f",
           mpt_ddp_sent_bytes(z.ddp), 2 * f * 4 * n);
    EXPECT(mpt_ddp_step_bytes(z.ddp) == mpt_ddp_sent_bytes(z.ddp), "step bytes %.0f",
           mpt_ddp_step_bytes(z.ddp));
  }
  EXPECT(mpt_ddp_sent_bytes(d.ddp) == 2 * f * 4 * n, "DDP sent %.0f bytes, want %.0f",
         mpt_ddp_sent_bytes(d.ddp), 2 * f * 4 * n);
  run_free(&z);
  run_free(&d);
  /* 4 parameters: at W = 3 shards of 2, 2, 0 (rank 2 holds no state); at W = 4 one each */
  run t = run_make(KIND_TINY, 5, 1, 1, 25, MPT_DDP_GRAD_FP32, 0);
  OK(mpt_optimizer_get_state(t.opt, &sz));
  const int64_t want = g_world == 2 ? 2 : g_world == 3 ? (g_rank < 2 ? 2 : 0) : 1;
  EXPECT(sz.count == want && mpt_optimizer_num_ranges(t.opt) == 1,
         "tiny model, rank %d: state of %lld in %d range(s), want %lld in 1", g_rank,
         (long long)sz.count, mpt_optimizer_num_ranges(t.opt), (long long)want);
  int64_t mine = sz.count, all = 0;
  int32_t m32 = (int32_t)mine, a32 = 0;
  OK(mpt_comm_allreduce_sync(g_comm, &m32, &a32, 1, MPT_I32, MPT_REDUCE_SUM));
  all = a32;
  EXPECT(all == 4, "the shards add up to %lld, want 4", (long long)all);
  run_free(&t);
  expect_agree();
}
END_TEST

/* Whole optimizer of the run's kind, for checkpoints. */
static mpt_optimizer *whole_make(const run *r) {
  mpt_optimizer_config oc = optim_config(0);
  mpt_optimizer *w = NULL;
  OK(mpt_optimizer_init(&w, &oc, mpt_device_cpu(), mpt_model_param_count(r->m)));
  return w;
}

START_TEST(test_zero1_checkpoint_resume_is_exact) {
  expect_begin();
  char dir[] = "/tmp/mpt_zero_ckptXXXXXX";
  int32_t ok = 1;
  if (g_rank == 0) ok = mkdtemp(dir) != NULL;
  OK(mpt_comm_broadcast_sync(g_comm, dir, (int64_t)sizeof dir, MPT_U8, 0));
  OK(mpt_comm_broadcast_sync(g_comm, &ok, 1, MPT_I32, 0));
  ck_assert(ok);
  const int half = 4;
  for (int from_zero = 1; from_zero >= 0; from_zero--) {
    run a = run_make(KIND_MLP, 3, from_zero, 1, 0.01, MPT_DDP_GRAD_FP32, 0);
    const int64_t n = mpt_model_param_count(a.m);
    for (int s = 0; s < half; s++) run_step(&a, s);
    /* the writer (rank 0) alone holds the whole state; the others take part in the gather */
    mpt_optimizer *w = g_rank == 0 ? whole_make(&a) : NULL;
    OK(mpt_ddp_optimizer_gather(a.ddp, a.opt, w));
    if (w) {
      mpt_optimizer_state ws;
      OK(mpt_optimizer_get_state(w, &ws));
      EXPECT(ws.step_count == half, "gathered step count %lld", (long long)ws.step_count);
    }
    OK(mpt_ddp_gather_params(a.ddp)); /* ZeRO-3: the writer saves whole parameters */
    mpt_ckpt_meta meta = mpt_ckpt_meta_default();
    meta.global_step = half + 10 * (1 - from_zero);
    meta.world_size = g_world;
    char path[512];
    if (from_zero)
      EXPECT(mpt_ckpt_save_collective(g_comm, dir, 0, a.m, a.opt, &meta, path, sizeof path) ==
                 MPT_EINVAL, "a sharded optimizer was saved");
    OK(mpt_ckpt_save_collective(g_comm, dir, 0, a.m, w, &meta, path, sizeof path));
    mpt_optimizer_free(w);
    for (int s = half; s < 2 * half; s++) run_step(&a, s);
    for (int to_zero = 1; to_zero >= 0; to_zero--) {
      run b = run_make(KIND_MLP, 99, to_zero, 1, 0.01, MPT_DDP_GRAD_FP32, 0);
      mpt_optimizer *wb = whole_make(&b);
      mpt_ckpt_meta got;
      OK(mpt_ckpt_load_collective(g_comm, path, b.m, wb, &got));
      OK(mpt_ddp_optimizer_scatter(b.ddp, wb, b.opt));
      mpt_optimizer_free(wb);
      OK(mpt_ddp_release_params(b.ddp)); /* ZeRO-3: re-sharded, gathered again by use */
      for (int s = half; s < 2 * half; s++) run_step(&b, s);
      OK(mpt_ddp_gather_params(a.ddp));
      OK(mpt_ddp_gather_params(b.ddp));
      const float *pa = mpt_model_params(a.m), *pb = mpt_model_params(b.m);
      /* with or without ZeRO-1 the same bits (see the top), so across the switch too */
      EXPECT(memcmp(pa, pb, sizeof(float) * (size_t)n) == 0,
             "zero %d -> zero %d: the resumed run differs from the one that went on "
             "(%.3g relative)", from_zero, to_zero, rel_diff(pb, pa, n));
      run_free(&b);
    }
    run_free(&a);
    if (g_rank == 0) unlink(path);
  }
  OK(mpt_comm_barrier_sync(g_comm));
  if (g_rank == 0) rmdir(dir);
  expect_agree();
}
END_TEST

/* Gradients that are small integers on every rank (exact in bfloat16, and so are their partial
 * sums), reduced by mpt_ddp_allreduce_grads (under ZeRO-1: reduce-scatter): every owned element
 * is the exact average, fp32 and bf16 alike. */
START_TEST(test_zero1_shards_hold_the_exact_average) {
  expect_begin();
  for (int wire = 0; wire < 2; wire++) {
    run z = run_make(KIND_MLP, 3, 1, 1, 0.01, wire ? MPT_DDP_GRAD_BF16 : MPT_DDP_GRAD_FP32, 0);
    const int64_t n = mpt_model_param_count(z.m);
    float *g = mpt_model_grads(z.m);
    for (int64_t i = 0; i < n; i++) g[i] = (float)((g_rank + 1) * (int)(i % 13 + 1));
    OK(mpt_ddp_allreduce_grads(z.ddp));
    const mpt_optim_range *r = NULL;
    const int nr = mpt_ddp_shard(z.ddp, &r);
    int64_t owned = 0, bad = 0;
    const float sum_r = (float)(g_world * (g_world + 1) / 2);
    for (int k = 0; k < nr; k++)
      for (int64_t i = r[k].offset; i < r[k].offset + r[k].count; i++, owned++)
        if (g[i] != sum_r * (float)(i % 13 + 1) / (float)g_world && bad++ == 0)
          EXPECT(0, "%s: element %lld is %.9g, want %.9g", wire ? "bf16" : "fp32",
                 (long long)i, g[i], sum_r * (float)(i % 13 + 1) / (float)g_world);
    EXPECT(owned == mpt_ddp_shard_count(z.ddp) && owned > 0, "owned %lld", (long long)owned);
    /* one NaN in the last rank's shard only: every rank must see it (skip together), and the
     * clipping norm is NaN on every rank */
    int nonfinite = -1;
    OK(mpt_ddp_grads_nonfinite(z.ddp, NULL, &nonfinite));
    EXPECT(nonfinite == 0, "finite gradients reported non-finite");
    if (g_rank == g_world - 1) g[r[0].offset] = NAN;
    OK(mpt_ddp_grads_nonfinite(z.ddp, NULL, &nonfinite));
    EXPECT(nonfinite == 1, "rank %d: the NaN of rank %d's shard was not seen", g_rank,
           g_world - 1);
    float norm = 0;
    OK(mpt_ddp_clip_grad_norm(z.ddp, NULL, 1.0f, &norm));
    EXPECT(isnan(norm), "rank %d: norm %g with a NaN in rank %d's shard", g_rank, norm,
           g_world - 1);
    run_free(&z);
  }
  expect_agree();
}
END_TEST

/* Pages of [p, p + nbytes) resident in memory (mincore), and the number of whole pages. */
static int64_t resident_pages(const void *p, size_t nbytes, int64_t *whole) {
  const long page = sysconf(_SC_PAGESIZE);
  const uintptr_t m = (uintptr_t)page - 1, a = ((uintptr_t)p + m) & ~m,
                  e = ((uintptr_t)p + nbytes) & ~m;
  *whole = e > a ? (int64_t)((e - a) / (uintptr_t)page) : 0;
  if (*whole == 0) return 0;
  unsigned char *v = malloc((size_t)*whole);
  ck_assert(v);
  ck_assert_int_eq(mincore((void *)a, e - a, v), 0);
  int64_t n = 0;
  for (int64_t i = 0; i < *whole; i++) n += v[i] & 1;
  free(v);
  return n;
}

/* After a backward the gradient buffer's resident pages: ZeRO-2 the shard's (and the pages that
 * straddle a shard edge: at most 2 per bucket); ZeRO-1 all of them. After zero_grad (every
 * element zero): ZeRO-2 none but the two end pages; ZeRO-1 all. Two steps. */
START_TEST(test_zero_gradient_pages_after_backward) {
  expect_begin();
  mpt_mlp_config c = mpt_mlp_config_default();
  c.input_size = 784;
  c.num_hidden = 2;
  c.hidden[0] = 301;
  c.hidden[1] = 299;
  c.num_classes = CLASSES;
  run r = {.kind = KIND_MLP}; /* a larger MLP: 329583 parameters, 1.3 MB of gradients */
  OK(mpt_model_init_mlp(&r.m, mpt_device_cpu(), &c, 4));
  OK(mpt_tape_init(&r.tape, r.m, NULL));
  mpt_ddp_config dc = mpt_ddp_config_default();
  dc.bucket_cap_mb = dc.first_bucket_cap_mb = 0.25;
  dc.timeout_ms = 30000;
  dc.zero = g_stage;
  OK(mpt_ddp_init(&r.ddp, r.m, g_comm, NULL, &dc));
  mpt_optimizer_config oc = optim_config(0);
  OK(mpt_ddp_optimizer_init(r.ddp, &r.opt, &oc, mpt_device_cpu()));
  const int64_t n = mpt_model_param_count(r.m);
  const long page = sysconf(_SC_PAGESIZE);
  for (int step = 0; step < 2; step++) {
    batch *b = malloc(sizeof *b);
    ck_assert(b);
    batch_fill(b, KIND_MLP, step);
    forward_backward(r.m, r.tape, KIND_MLP, b);
    free(b);
    int64_t whole = 0;
    const int64_t res = resident_pages(mpt_model_grads(r.m), sizeof(float) * (size_t)n, &whole);
    const int64_t shard_pages = (mpt_ddp_shard_count(r.ddp) * 4 + page - 1) / page;
    const int64_t most = shard_pages + 2 * mpt_ddp_num_buckets(r.ddp);
    if (g_stage >= 2)
      EXPECT(res <= most && whole > 4 * most / 3, "ZeRO-2 step %d: %lld of %lld gradient pages "
             "resident after backward, want at most %lld (the shard's)", step, (long long)res,
             (long long)whole, (long long)most);
    else
      EXPECT(res == whole, "ZeRO-1 step %d: %lld of %lld gradient pages resident, want all",
             step, (long long)res, (long long)whole);
    float norm = 0;
    OK(mpt_ddp_clip_grad_norm(r.ddp, NULL, MAX_NORM, &norm));
    OK(mpt_ddp_optimizer_step(r.ddp, r.opt, NULL, oc.lr));
    /* ZeRO-3: after the step only the parameter shard is resident (its pages, and at most
     * two per bucket cut by the shard's edges); the other stages keep the whole buffer */
    int64_t pwhole = 0;
    const int64_t pres = resident_pages(mpt_model_params(r.m), sizeof(float) * (size_t)n, &pwhole);
    if (g_stage == 3 && g_world > 1)
      EXPECT(pres <= most && pwhole > 4 * most / 3, "ZeRO-3 step %d: %lld of %lld parameter "
             "pages resident after the step, want at most %lld (the shard's)", step,
             (long long)pres, (long long)pwhole, (long long)most);
    else
      EXPECT(pres == pwhole, "ZeRO-%d step %d: %lld of %lld parameter pages resident, want "
             "all", g_stage, step, (long long)pres, (long long)pwhole);
    if (g_rank == 0 && step == 1)
      printf("zero%d at %d ranks: %lld of %lld parameter pages resident after the step\n",
             g_stage, g_world, (long long)pres, (long long)pwhole);
    /* zero_grad: every element zero; ZeRO-2 by giving the pages back (at most the two end
     * pages, which the buffer may share with other memory, written), ZeRO-1 by writing them */
    OK(mpt_model_zero_grad(r.m, NULL));
    const float *g = mpt_model_grads(r.m);
    /* counted before reading them: a page read maps the zero page, which mincore counts */
    const int64_t res0 = resident_pages(g, sizeof(float) * (size_t)n, &whole);
    int64_t nonzero = 0;
    for (int64_t i = 0; i < n; i++) nonzero += g[i] != 0.0f;
    EXPECT(nonzero == 0, "step %d: %lld gradients not zero after zero_grad", step,
           (long long)nonzero);
    if (g_rank == 0 && step == 1)
      printf("zero%d at %d ranks: %lld of %lld gradient pages resident after backward (shard "
             "%lld pages, %d buckets), %lld after zero_grad\n", g_stage, g_world, (long long)res,
             (long long)whole, (long long)shard_pages, mpt_ddp_num_buckets(r.ddp),
             (long long)res0);
    if (g_stage >= 2)
      EXPECT(res0 <= 2, "ZeRO-2 step %d: %lld of %lld gradient pages resident after zero_grad, "
             "want at most 2", step, (long long)res0, (long long)whole);
    else
      EXPECT(res0 == whole, "ZeRO-1 step %d: %lld of %lld gradient pages resident after "
             "zero_grad, want all", step, (long long)res0, (long long)whole);
  }
  OK(mpt_ddp_gather_params(r.ddp));
  EXPECT(same_on_all_ranks(mpt_model_params(r.m), n), "replicas differ across ranks");
  run_free(&r);
  expect_agree();
}
END_TEST

/* A GPT built with its initialisation deferred (mpt_model_init_gpt_deferred): its units
 * written in reverse order give the bytes of mpt_model_init_gpt for the seed, and a forward
 * before is refused. Wrapped by the engine, the deferred model starts from those bytes on every
 * rank; ZeRO-3 initialises it unit by unit and keeps only the shard's pages resident (mincore:
 * at most two more per bucket cut by the shard's edges), where the other stages hold it whole;
 * a model deferred on rank 0 only is refused on every rank (MPT_EMISMATCH). */
START_TEST(test_zero_deferred_init) {
  expect_begin();
  mpt_gpt_config gc = {.max_seq_len = 16, .vocab_size = 256, .num_layers = 2, .num_heads = 4,
                       .channels = 64, .padded_vocab_size = 0};
  mpt_model *ref = NULL, *m = NULL, *w = NULL;
  OK(mpt_model_init_gpt(&ref, mpt_device_cpu(), &gc, 21));
  const int64_t n = mpt_model_param_count(ref);
  const size_t nbytes = sizeof(float) * (size_t)n;
  OK(mpt_model_init_gpt_deferred(&m, mpt_device_cpu(), &gc, 21));
  const int units = mpt_model_units(m, NULL);
  EXPECT(units == 4 && mpt_model_init_pending(m) == 4, "%d units, %d pending, want 4 and 4",
         units, mpt_model_init_pending(m));
  EXPECT(mpt_model_init_pending(ref) == 0, "an ordinary GPT has units pending");
  mpt_tape *tape = NULL;
  OK(mpt_tape_init(&tape, m, NULL));
  int32_t tok[16] = {0};
  int64_t ts[2] = {1, 16};
  mpt_tensor xt = mpt_tensor_view(tok, mpt_device_cpu(), MPT_I32, 2, ts);
  mpt_var *xv = NULL, *out = NULL;
  mpt_tape_reset(tape, 1);
  OK(mpt_tape_input(tape, &xt, &xv));
  EXPECT(mpt_model_forward(m, tape, xv, &out) == MPT_ESTATE, "a forward with units pending "
         "was not refused");
  for (int u = units - 1; u >= 0; u--) OK(mpt_model_init_unit(m, u));
  EXPECT(mpt_model_init_pending(m) == 0, "%d units still pending", mpt_model_init_pending(m));
  EXPECT(memcmp(mpt_model_params(m), mpt_model_params(ref), nbytes) == 0, "the units written "
         "in reverse differ from mpt_model_init_gpt's values");
  EXPECT(mpt_model_init_unit(m, 0) == MPT_ESTATE, "a unit written after the initialisation "
         "ended");
  mpt_tape_free(tape);
  mpt_model_free(m);

  OK(mpt_model_init_gpt_deferred(&w, mpt_device_cpu(), &gc, 21));
  EXPECT(mpt_model_init_unit(w, units) == MPT_EINVAL, "unit %d of %d accepted", units, units);
  mpt_ddp_config dc = mpt_ddp_config_default();
  dc.timeout_ms = 30000;
  dc.zero = g_stage;
  mpt_ddp *ddp = NULL;
  OK(mpt_ddp_init(&ddp, w, g_comm, NULL, &dc));
  EXPECT(mpt_model_init_pending(w) == 0, "units pending after mpt_ddp_init");
  int64_t whole = 0;
  const long page = sysconf(_SC_PAGESIZE);
  const int64_t res = resident_pages(mpt_model_params(w), nbytes, &whole);
  const int64_t most = (mpt_ddp_shard_count(ddp) * 4 + page - 1) / page +
                       2 * mpt_ddp_num_buckets(ddp);
  if (g_stage == 3)
    EXPECT(res <= most && whole > 4 * most / 3, "ZeRO-3: %lld of %lld parameter pages resident "
           "after init, want at most %lld (the shard's)", (long long)res, (long long)whole,
           (long long)most);
  else
    EXPECT(res == whole, "ZeRO-%d: %lld of %lld parameter pages resident after init, want all",
           g_stage, (long long)res, (long long)whole);
  if (g_rank == 0)
    printf("zero%d at %d ranks, deferred GPT: %lld of %lld parameter pages resident after "
           "init (%d buckets)\n", g_stage, g_world, (long long)res, (long long)whole,
           mpt_ddp_num_buckets(ddp));
  OK(mpt_ddp_gather_params(ddp));
  EXPECT(memcmp(mpt_model_params(w), mpt_model_params(ref), nbytes) == 0, "rank %d: the "
         "deferred model wrapped differs from mpt_model_init_gpt's values", g_rank);
  mpt_ddp_free(ddp);
  mpt_model_free(w);
  /* ZeRO-3: a deferred model on rank 0 only is refused on every rank (the collectives of the
   * unit-by-unit start would not pair) */
  if (g_stage == 3 && g_world > 1) {
    if (g_rank == 0)
      OK(mpt_model_init_gpt_deferred(&w, mpt_device_cpu(), &gc, 21));
    else
      OK(mpt_model_init_gpt(&w, mpt_device_cpu(), &gc, 21));
    ddp = NULL;
    const mpt_status st = mpt_ddp_init(&ddp, w, g_comm, NULL, &dc);
    EXPECT(st == MPT_EMISMATCH && !ddp, "rank %d: deferred on rank 0 only: %s, want "
           "MPT_EMISMATCH", g_rank, mpt_status_name(st));
    mpt_ddp_free(ddp);
    mpt_model_free(w);
  }
  mpt_model_free(ref);
  expect_agree();
}
END_TEST

START_TEST(test_zero_refuses_bad_uses) {
  mpt_model *m = model_make(KIND_MLP, 1);
  mpt_ddp_config dc = mpt_ddp_config_default();
  dc.zero = 4;
  mpt_ddp *d = NULL;
  ck_assert_int_eq(mpt_ddp_init(&d, m, g_comm, NULL, &dc), MPT_EINVAL);
  ck_assert_ptr_nonnull(strstr(mpt_last_error(), "ZeRO stage 4"));
  dc.zero = g_stage;
  OK(mpt_ddp_init(&d, m, g_comm, NULL, &dc));
  mpt_optimizer_config oc = optim_config(0);
  mpt_optimizer *whole = NULL;
  OK(mpt_optimizer_init(&whole, &oc, mpt_device_cpu(), mpt_model_param_count(m)));
  ck_assert_int_eq(mpt_ddp_optimizer_step(d, whole, NULL, 0.1f), MPT_EINVAL);
  ck_assert_ptr_nonnull(strstr(mpt_last_error(), "mpt_ddp_optimizer_init"));
  mpt_optimizer_free(whole);
  mpt_ddp_free(d);
  mpt_model_free(m);
}
END_TEST

int main(int argc, char **argv) {
  if (argc > 1) g_stage = atoi(argv[1]);
  if (g_stage < 1 || g_stage > 3) {
    fprintf(stderr, "usage: test_zero [1|2|3] (the ZeRO stage)\n");
    return 2;
  }
  mpt_comm_config cc = mpt_comm_config_default();
  cc.timeout_ms = 60000;
  mpt_status st = mpt_comm_init(&g_comm, &cc);
  if (st != MPT_OK) {
    fprintf(stderr, "test_zero: %s: %s\n", mpt_status_name(st), mpt_last_error());
    mpt_comm_finalize();
    return EXIT_FAILURE;
  }
  g_rank = mpt_comm_rank(g_comm);
  g_world = mpt_comm_world_size(g_comm);
  Suite *s = suite_create("zero1");
  TCase *tc = tcase_create("zero1");
  tcase_add_test(tc, test_zero_refuses_bad_uses);
  tcase_add_test(tc, test_zero_deferred_init);
  tcase_add_test(tc, test_zero_gradient_pages_after_backward);
  tcase_add_test(tc, test_zero1_optimizer_state_is_the_shard);
  tcase_add_test(tc, test_zero1_shards_hold_the_exact_average);
  tcase_add_loop_test(tc, test_zero1_equals_plain_ddp, 0,
                      (int)(sizeof CASES / sizeof CASES[0]));
  tcase_add_test(tc, test_zero1_checkpoint_resume_is_exact);
  tcase_add_test(tc, test_native_allreduce_matches_rs_ag);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_NOFORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  mpt_comm_free(g_comm);
  mpt_comm_finalize();
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
