/* Your own model, trained with DDP on Fashion-MNIST by the library's training loop
 * (mpitrain/trainer.h), through the public API only.
 *
 *   mpirun -np 2 ./examples/custom_model [EPOCHS [TRAIN_LIMIT [MIN_ACCURACY [CHECKPOINT_DIR
 *                                          [STOP_AT_STEP]]]]]
 *
 * A residual MLP: h = relu(fc_in(x)), a block of two branches (the identity and
 * fc_b(relu(fc_a(h))), added, relu), then fc_out. The model is yours; the task (what the loop
 * needs from a model family: the data, the loss of a micro-batch, a metric) is filled here by
 * hand, as for a family of your own; mpt_trainer_run then does the epochs with DDP (rank 0's
 * parameters broadcast, gradients averaged in buckets during backward), evaluation, checkpoints
 * and resume (with CHECKPOINT_DIR: a run stopped at STOP_AT_STEP, or preempted, is continued
 * by the next one with the same arguments but STOP_AT_STEP), SIGTERM / SIGUSR1
 * preemption and the logs. examples/hand_loop.c trains the same model with the seven calls of
 * a step written out. Exits 1 if the test accuracy stays below MIN_ACCURACY or the replicas
 * differ at the end, 75 when preempted. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "mpitrain.h"

static mpt_comm *comm;

/* Prints the failing call and the library's detail, then ends every rank. */
#define TRY(expr)                                                                    \
  do {                                                                               \
    mpt_status try_st_ = (expr);                                                     \
    if (try_st_ != MPT_OK) {                                                         \
      fprintf(stderr, "custom_model: %s: %s\n", #expr, mpt_last_error());            \
      mpt_comm_abort(comm, 1);                                                       \
    }                                                                                \
  } while (0)

typedef struct resnet {
  mpt_linear in, a, b, out;
} resnet;

static mpt_status resnet_forward(mpt_model *model, mpt_tape *tape, void *ctx, mpt_var *x,
                                 mpt_var **y) {
  (void)model;
  const resnet *r = ctx;
  mpt_var *h, *u;
  MPT_RETURN_IF(mpt_nn_flatten(tape, x, &x)); /* [N, 1, 28, 28] -> [N, 784] */
  MPT_RETURN_IF(mpt_linear_forward(tape, &r->in, x, &h));
  MPT_RETURN_IF(mpt_nn_relu(tape, h, &h));
  MPT_RETURN_IF(mpt_linear_forward(tape, &r->a, h, &u)); /* branch 2 */
  MPT_RETURN_IF(mpt_nn_relu(tape, u, &u));
  MPT_RETURN_IF(mpt_linear_forward(tape, &r->b, u, &u));
  MPT_RETURN_IF(mpt_nn_add(tape, h, u, &u)); /* + branch 1, the identity */
  MPT_RETURN_IF(mpt_nn_relu(tape, u, &u));
  return mpt_linear_forward(tape, &r->out, u, y);
}

/* The task's loss: the mean cross-entropy of the logits against the labels. */
static mpt_status loss(void *ctx, mpt_tape *tape, mpt_var *logits, const mpt_tensor *labels,
                       mpt_var **out) {
  (void)ctx;
  return mpt_nn_cross_entropy(tape, logits, labels, out);
}

/* The task's metric: the rows whose largest logit is the label (the loop makes it accuracy). */
static mpt_status correct(void *ctx, mpt_stream *stream, const mpt_tensor *logits,
                          const mpt_tensor *labels, int64_t rows, double *sum) {
  (void)ctx;
  int64_t n = 0;
  MPT_RETURN_IF(mpt_op_count_correct(stream, logits->data, labels->data, rows,
                                     logits->shape[1], &n));
  *sum = (double)n;
  return MPT_OK;
}

int main(int argc, char **argv) {
  const int epochs = argc > 1 ? atoi(argv[1]) : 3;
  const int64_t limit = argc > 2 ? atoll(argv[2]) : 0;
  const double min_accuracy = argc > 3 ? atof(argv[3]) : 0.0;
  const char *checkpoint_dir = argc > 4 ? argv[4] : NULL;
  const int64_t stop_at_step = argc > 5 ? atoll(argv[5]) : 0;
  TRY(mpt_trainer_catch_signals()); /* before MPI's start-up: a signal then is not fatal */
  TRY(mpt_comm_init(&comm, NULL));

  mpt_dataset train, test;
  mpt_dataset_config dc = mpt_dataset_config_default();
  dc.limit = limit;
  TRY(mpt_dataset_load_fashion_mnist(NULL, "train", &dc, &train));
  TRY(mpt_dataset_load_fashion_mnist(NULL, "test", NULL, &test));

  resnet r;
  mpt_model *model;
  TRY(mpt_model_init(&model, mpt_device_cpu()));
  TRY(mpt_linear_add(model, "fc_in", 784, 128, 1, &r.in));
  TRY(mpt_linear_add(model, "fc_a", 128, 128, 1, &r.a));
  TRY(mpt_linear_add(model, "fc_b", 128, 128, 1, &r.b));
  TRY(mpt_linear_add(model, "fc_out", 128, 10, 1, &r.out));
  mpt_model_set_forward(model, resnet_forward, &r, NULL);
  TRY(mpt_model_finalize(model));
  TRY(mpt_model_init_params(model, 42));

  /* The task: data sources over the datasets, the loss and the metric. */
  mpt_data_source *train_src, *test_src;
  TRY(mpt_data_source_init_dataset(&train_src, &train));
  TRY(mpt_data_source_init_dataset(&test_src, &test));
  mpt_train_task task = {0};
  task.name = "residual classifier";
  task.unit = "samples";
  task.units_per_row = 1;
  task.eval_name = "test";
  task.metric_name = "acc";
  task.train = train_src;
  task.eval = test_src;
  task.loss = loss;
  task.metric = correct;

  mpt_trainer_config cfg = mpt_trainer_config_default();
  cfg.epochs = epochs;
  cfg.batch_size = 32; /* per rank */
  cfg.optim.lr = 0.01f;
  cfg.optim.momentum = 0.9f;
  cfg.model_name = "resnet-mlp";
  cfg.checkpoint_dir = checkpoint_dir;
  cfg.resume = checkpoint_dir ? "auto" : NULL; /* a second run continues the first */
  cfg.stop_at_step = stop_at_step;
  cfg.progress_interval_s = 0;
  mpt_train_result res;
  TRY(mpt_trainer_run(comm, model, &task, &cfg, &res));

  /* The replicas must be bit-identical: compare a hash of the parameters across ranks. */
  uint32_t h = 2166136261u;
  const unsigned char *p = (const unsigned char *)mpt_model_params(model);
  for (int64_t i = 0; i < mpt_model_param_count(model) * (int64_t)sizeof(float); i++)
    h = (h ^ p[i]) * 16777619u;
  int32_t lo = (int32_t)(h >> 1), hi = lo;
  TRY(mpt_comm_allreduce_sync(comm, &lo, &lo, 1, MPT_I32, MPT_REDUCE_MIN));
  TRY(mpt_comm_allreduce_sync(comm, &hi, &hi, 1, MPT_I32, MPT_REDUCE_MAX));
  const int ok = lo == hi && (res.preempted || res.stopped || res.steps_run == 0 ||
                              res.eval_metric >= min_accuracy);
  if (mpt_comm_rank(comm) == 0)
    printf("custom_model: %lld steps, test accuracy %.4f, replicas %s%s\n",
           (long long)res.global_step, res.eval_metric, lo == hi ? "identical" : "DIFFER",
           res.preempted ? " (preempted)" : "");
  if (mpt_comm_rank(comm) == 0 && !ok)
    fprintf(stderr, "custom_model: FAILED: accuracy %.4f (want >= %.4f)\n", res.eval_metric,
            min_accuracy);

  mpt_data_source_free(train_src);
  mpt_data_source_free(test_src);
  mpt_model_free(model);
  mpt_dataset_free(&train);
  mpt_dataset_free(&test);
  mpt_comm_free(comm);
  mpt_comm_finalize();
  return !ok ? 1 : res.preempted ? MPT_TRAIN_EXIT_PREEMPTED : 0;
}
