/* Your own model and your own training loop, with DDP on Fashion-MNIST, through the public API
 * only: the seven calls of a step written out (examples/custom_model.c trains the same model
 * through the library's loop, mpt_trainer_run, with checkpoints, evaluation and preemption).
 *
 *   mpirun -np 2 ./examples/hand_loop [EPOCHS [TRAIN_LIMIT [MIN_ACCURACY]]]
 *
 * A residual MLP: h = relu(fc_in(x)), a block of two branches (the identity and
 * fc_b(relu(fc_a(h))), added, relu), then fc_out. h feeds both branches: backward adds both
 * gradients into h's. mpt_ddp_init wraps the model once (same model on every rank, rank 0's
 * parameters broadcast); the step is then the ordinary seven calls with no DDP call in it, and
 * backward returns gradients averaged over the ranks. Leaving out any of the seven is an error
 * at run time or does not compile. Exits 1 if the test accuracy stays below MIN_ACCURACY or
 * the replicas differ at the end. */
#include <stdio.h>
#include <stdlib.h>

#include "mpitrain.h"

static mpt_comm *comm;

/* Prints the failing call and the library's detail, then ends every rank. */
#define TRY(expr)                                                                    \
  do {                                                                               \
    mpt_status try_st_ = (expr);                                                     \
    if (try_st_ != MPT_OK) {                                                         \
      fprintf(stderr, "hand_loop: %s: %s\n", #expr, mpt_last_error());            \
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

/* Test accuracy over all ranks: each rank its shard; mpt_eval_batch runs in evaluation mode
 * and counts the real rows only (not the sampler's padding), so any world size gives the same. */
static double evaluate(mpt_tape *tape, const mpt_dataset *test) {
  mpt_sampler_config sc = mpt_sampler_config_default();
  sc.num_replicas = mpt_comm_world_size(comm);
  sc.rank = mpt_comm_rank(comm);
  sc.shuffle = 0;
  mpt_sampler *sampler;
  mpt_loader *loader;
  TRY(mpt_sampler_init(&sampler, test->count, &sc));
  TRY(mpt_loader_init(&loader, test, sampler, NULL));
  mpt_eval_sums sums = {0, 0, 0};
  mpt_batch b;
  int more;
  while ((more = mpt_loader_next(loader, &b)) == MPT_OK)
    TRY(mpt_eval_batch(tape, &b.images, &b.labels, b.num_real, &sums));
  if (more < 0) TRY((mpt_status)more);
  TRY(mpt_comm_allreduce_sync(comm, &sums.loss_sum, &sums.loss_sum, 3, MPT_F32, MPT_REDUCE_SUM));
  mpt_loader_free(loader);
  mpt_sampler_free(sampler);
  return mpt_eval_sums_accuracy(&sums);
}

int main(int argc, char **argv) {
  const int epochs = argc > 1 ? atoi(argv[1]) : 3;
  const int64_t limit = argc > 2 ? atoll(argv[2]) : 0;
  const double min_accuracy = argc > 3 ? atof(argv[3]) : 0.0;
  TRY(mpt_comm_init(&comm, NULL));
  const int rank = mpt_comm_rank(comm), world = mpt_comm_world_size(comm);
  /* BLAS threads: this host's cores shared by its ranks (else they fight over the cores). */
  TRY(mpt_cpu_set_threads(mpt_cpu_threads_per_rank(mpt_comm_local_size(comm), 1)));

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

  mpt_ddp *ddp;
  mpt_tape *tape;
  mpt_optimizer *opt;
  TRY(mpt_ddp_init(&ddp, model, comm, NULL, NULL)); /* once: from here on DDP is automatic */
  TRY(mpt_tape_init(&tape, model, NULL));
  mpt_optimizer_config oc = mpt_optimizer_config_default();
  oc.momentum = 0.9f;
  TRY(mpt_optimizer_init(&opt, &oc, mpt_device_cpu(), mpt_model_param_count(model)));

  mpt_sampler_config sc = mpt_sampler_config_default(); /* this rank's shard, reshuffled */
  sc.num_replicas = world;
  sc.rank = rank;
  mpt_sampler *sampler;
  mpt_loader *loader;
  mpt_loader_config lc = mpt_loader_config_default();
  lc.batch_size = 32; /* per rank */
  TRY(mpt_sampler_init(&sampler, train.count, &sc));
  TRY(mpt_loader_init(&loader, &train, sampler, &lc));

  double accuracy = 0;
  for (int epoch = 0; epoch < epochs; epoch++) {
    TRY(mpt_loader_start_epoch(loader, epoch));
    mpt_batch b;
    int more;
    while ((more = mpt_loader_next(loader, &b)) == MPT_OK) {
      mpt_var *x, *logits, *loss;
      TRY(mpt_model_zero_grad(model, NULL));                         /* 1 */
      mpt_tape_reset(tape, (uint64_t)b.index);                        /* 2 */
      TRY(mpt_tape_input(tape, &b.images, &x));                       /* 3 */
      TRY(mpt_model_forward(model, tape, x, &logits));                /* 4 */
      TRY(mpt_nn_cross_entropy(tape, logits, &b.labels, &loss));      /* 5 */
      TRY(mpt_tape_backward(tape, loss, 1.0f));                       /* 6: averaged */
      TRY(mpt_optimizer_step_model(opt, model, NULL, oc.lr));         /* 7 */
    }
    if (more < 0) TRY((mpt_status)more);
    accuracy = evaluate(tape, &test);
    if (rank == 0) printf("epoch %d  test accuracy %.4f  (%d ranks)\n", epoch + 1, accuracy, world);
  }

  /* The replicas must be bit-identical: compare a hash of the parameters across ranks. */
  uint32_t h = 2166136261u;
  const unsigned char *p = (const unsigned char *)mpt_model_params(model);
  for (int64_t i = 0; i < mpt_model_param_count(model) * (int64_t)sizeof(float); i++)
    h = (h ^ p[i]) * 16777619u;
  int32_t lo = (int32_t)(h >> 1), hi = lo;
  TRY(mpt_comm_allreduce_sync(comm, &lo, &lo, 1, MPT_I32, MPT_REDUCE_MIN));
  TRY(mpt_comm_allreduce_sync(comm, &hi, &hi, 1, MPT_I32, MPT_REDUCE_MAX));
  const int ok = lo == hi && accuracy >= min_accuracy;
  if (rank == 0 && !ok)
    fprintf(stderr, "hand_loop: FAILED: replicas %s, accuracy %.4f (want >= %.4f)\n",
            lo == hi ? "identical" : "DIFFER", accuracy, min_accuracy);

  mpt_loader_free(loader);
  mpt_sampler_free(sampler);
  mpt_optimizer_free(opt);
  mpt_tape_free(tape);
  mpt_ddp_free(ddp); /* unwraps the model */
  mpt_model_free(model);
  mpt_dataset_free(&train);
  mpt_dataset_free(&test);
  mpt_comm_free(comm);
  mpt_comm_finalize();
  return ok ? 0 : 1;
}
