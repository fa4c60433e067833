/* Tests for src/nn/eval.c: evaluation mode as one switch (mpt_tape_set_eval) and the evaluation
 * of a batch's real rows (mpt_eval_batch), run under mpirun with 2 and 3 ranks
 * (tests/test_eval_np2.mpi, _np3.mpi).
 *
 * - The switch gives bit for bit the logits of the two separate calls it stands for
 *   (mpt_model_set_training + mpt_tape_set_grad_enabled) on a CNN with BatchNorm and dropout,
 *   records nothing, leaves the running statistics alone, and differs from training mode (so
 *   the comparison can fail).
 * - docs/faults.md F01: N = 23 samples (a multiple of neither 2 nor 3), so the DistributedSampler
 *   pads; the evaluation summed over the ranks with mpt_eval_batch counts N samples with the
 *   same correct count and loss as one process over the whole dataset, whereas counting every
 *   row of the batches (the padding too) would not.
 * MPI rules as in tests/test_ddp.c: no forking, every rank runs the same tests, soft checks
 * agree over the ranks (tests/mpi_check.h). */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpitrain/comm.h"
#include "mpitrain/data.h"
#include "mpitrain/nn.h"

static mpt_comm *g_comm;
static int g_rank, g_world;
#define MPI_CHECK_COMM g_comm
#include "mpi_check.h"

enum { N = 23, HW = 8, CLASSES = 3, BATCH = 4 };

/* A small CNN with BatchNorm and dropout; a training forward on `ds` first moves the running
 * statistics away from their initial 0 / 1. */
static void make_model(mpt_model **m, mpt_tape **tape, const mpt_dataset *ds) {
  mpt_cnn_config c = mpt_cnn_config_default();
  c.height = c.width = HW;
  c.conv1_channels = 4;
  c.conv2_channels = 4;
  c.kernel = 3;
  c.hidden = 8;
  c.num_classes = CLASSES;
  c.batchnorm = 1;
  c.dropout = 0.5f;
  OK(mpt_model_init_cnn(m, mpt_device_cpu(), &c, 11));
  OK(mpt_tape_init(tape, *m, NULL));
  mpt_var *in, *out;
  mpt_tape_reset(*tape, 1);
  OK(mpt_tape_input(*tape, &ds->images, &in));
  OK(mpt_model_forward(*m, *tape, in, &out));
}

static void forward_copy(mpt_model *m, mpt_tape *tape, const mpt_dataset *ds, float *logits) {
  mpt_var *in, *out;
  mpt_tape_reset(tape, 2);
  OK(mpt_tape_input(tape, &ds->images, &in));
  OK(mpt_model_forward(m, tape, in, &out));
  memcpy(logits, mpt_var_value(out)->data, N * CLASSES * sizeof(float));
}

START_TEST(test_eval_switch_equals_the_two_separate_calls) {
  expect_begin();
  mpt_dataset ds;
  OK(mpt_dataset_init_synthetic(&ds, N, 1, HW, HW, CLASSES, 3));
  mpt_model *m;
  mpt_tape *tape;
  make_model(&m, &tape, &ds);
  const int64_t nbuf = mpt_model_buffer_count(m);
  float *stats = malloc((size_t)nbuf * sizeof(float));
  memcpy(stats, mpt_model_buffers(m), (size_t)nbuf * sizeof(float));
  static float a[N * CLASSES], b[N * CLASSES], b2[N * CLASSES], train[N * CLASSES];

  mpt_model_set_training(m, 0);
  mpt_tape_set_grad_enabled(tape, 0);
  forward_copy(m, tape, &ds, a);
  mpt_model_set_training(m, 1);
  mpt_tape_set_grad_enabled(tape, 1);

  mpt_tape_set_eval(tape, 1);
  EXPECT(mpt_model_training(m) == 0, "the switch left the model training");
  forward_copy(m, tape, &ds, b);
  for (int i = 0; i < mpt_model_num_params(m); i++)
    EXPECT(mpt_tape_param_uses(tape, i) == 0, "eval recorded a use of parameter %d", i);
  forward_copy(m, tape, &ds, b2); /* no dropout: the same again */
  EXPECT(memcmp(a, b, sizeof a) == 0, "the switch and the two calls give different logits");
  EXPECT(memcmp(b, b2, sizeof b) == 0, "two evaluation passes differ (dropout on?)");
  EXPECT(memcmp(stats, mpt_model_buffers(m), (size_t)nbuf * sizeof(float)) == 0,
         "evaluation changed the BatchNorm running statistics");

  mpt_tape_set_eval(tape, 0);
  EXPECT(mpt_model_training(m) == 1, "the switch did not restore training");
  forward_copy(m, tape, &ds, train);
  EXPECT(memcmp(a, train, sizeof a) != 0, "training mode gives the evaluation logits");
  int used = 0;
  for (int i = 0; i < mpt_model_num_params(m); i++) used += mpt_tape_param_uses(tape, i) > 0;
  EXPECT(used == mpt_model_num_params(m), "training forward recorded %d of %d parameters", used,
         mpt_model_num_params(m));
  free(stats);
  mpt_tape_free(tape);
  mpt_model_free(m);
  mpt_dataset_free(&ds);
  expect_agree();
}
END_TEST

/* Evaluates `ds` through a loader over (world, rank); returns the sums and, in *rows_all, the
 * number of rows the batches held (padding included). */
static mpt_eval_sums eval_shard(mpt_tape *tape, const mpt_dataset *ds, int world, int rank,
                                int64_t *rows_all) {
  mpt_sampler_config sc = mpt_sampler_config_default();
  sc.num_replicas = world;
  sc.rank = rank;
  sc.seed = 9;
  mpt_sampler *s;
  OK(mpt_sampler_init(&s, ds->count, &sc));
  mpt_loader_config lc = mpt_loader_config_default();
  lc.batch_size = BATCH;
  mpt_loader *l;
  OK(mpt_loader_init(&l, ds, s, &lc));
  mpt_eval_sums sums = {0, 0, 0};
  *rows_all = 0;
  mpt_batch b;
  int r;
  while ((r = mpt_loader_next(l, &b)) == MPT_OK) {
    OK(mpt_eval_batch(tape, &b.images, &b.labels, b.num_real, &sums));
    *rows_all += b.count;
  }
  ck_assert_int_eq(r, MPT_LOADER_END);
  mpt_loader_free(l);
  mpt_sampler_free(s);
  return sums;
}

START_TEST(test_eval_skips_padding_so_w_ranks_equal_one_process) {
  expect_begin();
  mpt_dataset ds;
  OK(mpt_dataset_init_synthetic(&ds, N, 1, HW, HW, CLASSES, 3));
  mpt_model *m;
  mpt_tape *tape;
  make_model(&m, &tape, &ds);
  EXPECT(mpt_model_training(m) == 1, "model not training before evaluation");

  int64_t rows_one, rows_mine;
  mpt_eval_sums one = eval_shard(tape, &ds, 1, 0, &rows_one);
  mpt_eval_sums all = eval_shard(tape, &ds, g_world, g_rank, &rows_mine);
  EXPECT(mpt_model_training(m) == 1 && mpt_tape_grad_enabled(tape) == 1,
         "mpt_eval_batch did not restore training mode with gradients");
  /* Any mix of the two flags comes back as it was. */
  for (int mix = 0; mix < 4; mix++) {
    mpt_eval_sums ignored = {0, 0, 0};
    mpt_model_set_training(m, mix & 1);
    mpt_tape_set_grad_enabled(tape, mix >> 1);
    OK(mpt_eval_batch(tape, &ds.images, &ds.labels, N, &ignored));
    EXPECT(mpt_model_training(m) == (mix & 1) && mpt_tape_grad_enabled(tape) == (mix >> 1),
           "mpt_eval_batch changed the flags (training %d, grad %d)", mix & 1, mix >> 1);
    EXPECT(ignored.count == N && ignored.correct == one.correct, "direct evaluation differs");
  }
  mpt_tape_set_eval(tape, 0);
  OK(mpt_comm_allreduce_sync(g_comm, &all.loss_sum, &all.loss_sum, 3, MPT_F32,
                             MPT_REDUCE_SUM));
  int32_t rows = (int32_t)rows_mine, rows_total = 0;
  OK(mpt_comm_allreduce_sync(g_comm, &rows, &rows_total, 1, MPT_I32, MPT_REDUCE_SUM));

  EXPECT(one.count == N && rows_one == N, "one process counted %g of %d", (double)one.count, N);
  /* The batches held padding (so counting every row would be wrong) ... */
  int64_t padded = (N + g_world - 1) / g_world * g_world;
  EXPECT(rows_total == padded, "the ranks' batches held %d rows, expected %lld", rows_total,
         (long long)padded);
  if (g_world > 1) EXPECT(padded != N, "no padding at W = %d: the test proves nothing", g_world);
  /* ... and the sums over the ranks count each sample once, as one process does. */
  EXPECT(all.count == N, "W = %d counted %g samples, expected %d", g_world, (double)all.count, N);
  EXPECT(all.correct == one.correct, "W = %d: %g correct, one process %g", g_world,
         (double)all.correct, (double)one.correct);
  EXPECT(fabs(mpt_eval_sums_loss(&all) - mpt_eval_sums_loss(&one)) <=
             1e-5 * fabs(mpt_eval_sums_loss(&one)),
         "W = %d: loss %.9g, one process %.9g", g_world, mpt_eval_sums_loss(&all),
         mpt_eval_sums_loss(&one));
  EXPECT(mpt_eval_sums_accuracy(&all) == (double)one.correct / N, "accuracy %g",
         mpt_eval_sums_accuracy(&all));

  /* Arguments. */
  mpt_eval_sums z = {0, 0, 0};
  int64_t shape[1] = {N};
  mpt_tensor bad = mpt_tensor_view(ds.images.data, mpt_device_cpu(), MPT_F32, 1, shape);
  EXPECT(mpt_eval_batch(tape, &ds.images, &ds.labels, N + 1, &z) == MPT_EINVAL, "num_real > N");
  EXPECT(mpt_eval_batch(tape, &ds.images, &ds.labels, -1, &z) == MPT_EINVAL, "num_real < 0");
  EXPECT(mpt_eval_batch(tape, &ds.images, &bad, N, &z) == MPT_EINVAL, "F32 labels");
  EXPECT(mpt_eval_batch(tape, &ds.images, &ds.labels, 0, &z) == MPT_OK, "num_real 0");
  EXPECT(z.count == 0 && z.loss_sum == 0 && z.correct == 0, "num_real 0 added something");
  EXPECT(isnan(mpt_eval_sums_loss(&z)) && isnan(mpt_eval_sums_accuracy(&z)), "empty sums");
  mpt_tape_free(tape);
  mpt_model_free(m);
  mpt_dataset_free(&ds);
  expect_agree();
}
END_TEST

static Suite *make_suite(void) {
  Suite *s = suite_create("eval");
  TCase *tc = tcase_create("eval");
  tcase_add_test(tc, test_eval_switch_equals_the_two_separate_calls);
  tcase_add_test(tc, test_eval_skips_padding_so_w_ranks_equal_one_process);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  return mpi_check_main("test_eval", 30000, &g_comm, &g_world, make_suite);
}
