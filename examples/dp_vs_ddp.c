/* DataParallel against DistributedDataParallel: the same model, data and global batch, trained
 * both ways, side by side.
 *
 *   mpirun -np 2 ./examples/dp_vs_ddp [STEPS]
 *
 * DDP (PyTorch's DistributedDataParallel): one process per device. Each rank holds a whole
 * replica, reads its own shard of every global batch, and after backward the ranks all-reduce
 * (average) their gradients, overlapped with backward, so every replica takes the same step.
 * Nothing is copied but gradients.
 *
 * DP (PyTorch's DataParallel): ONE process drives all devices. Every step it copies the
 * parameters to each device's replica, scatters the batch, runs forward and backward in
 * parallel (a thread per device), gathers the outputs and adds all gradients onto the first
 * device, which alone steps. The first device does extra work every step and the whole model
 * is copied every step; on GPUs that is why DDP scales and DP does not.
 *
 * Here the devices are CPU "devices" (threads) so it runs anywhere; with W ranks, DDP uses W
 * processes and DP uses one process (rank 0) with W devices. Both see the same global batches
 * (the DistributedSampler's shards of a batch are the batch), so from the same start both
 * compute the same mean gradient and take the same step up to float rounding: the program
 * checks the parameters after the first step and exits 1 if they differ by more than 1e-5
 * (relative). (Later steps drift apart by rounding alone: with momentum, a max-pooling near-tie
 * that flips grows into a visible difference, as between any two GEMM libraries.) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpitrain.h"

static mpt_comm *comm;

#define TRY(expr)                                                                    \
  do {                                                                               \
    mpt_status try_st_ = (expr);                                                     \
    if (try_st_ != MPT_OK) {                                                         \
      fprintf(stderr, "dp_vs_ddp: %s: %s\n", #expr, mpt_last_error());               \
      mpt_comm_abort(comm, 1);                                                       \
    }                                                                                \
  } while (0)

enum { PER_DEVICE = 32 };

typedef struct result {
  double loss, accuracy, samples_per_s;
} result;

/* Trains a fresh cnn for `steps` steps of `world` x PER_DEVICE samples: with DDP when ndev is
 * 0, else with DataParallel over ndev CPU devices in this process alone. */
static result train(const mpt_dataset *ds, int steps, int world, int ndev, float **first) {
  mpt_cnn_config cc = mpt_cnn_config_default();
  mpt_model *model;
  TRY(mpt_model_init_cnn(&model, mpt_device_cpu(), &cc, 7));
  mpt_optimizer_config oc = mpt_optimizer_config_default();
  oc.lr = 0.05f;
  oc.momentum = 0.9f;
  mpt_optimizer *opt;
  TRY(mpt_optimizer_init(&opt, &oc, mpt_device_cpu(), mpt_model_param_count(model)));
  mpt_sampler_config sc = mpt_sampler_config_default(); /* the same global order for both */
  sc.num_replicas = ndev ? 1 : world;
  sc.rank = ndev ? 0 : mpt_comm_rank(comm);
  mpt_loader_config lc = mpt_loader_config_default();
  lc.batch_size = ndev ? (int64_t)world * PER_DEVICE : PER_DEVICE;
  mpt_sampler *sampler;
  mpt_loader *loader;
  TRY(mpt_sampler_init(&sampler, ds->count, &sc));
  TRY(mpt_loader_init(&loader, ds, sampler, &lc));
  /* BLAS threads: the cores shared by this host's ranks (DDP) or by the DP devices. */
  TRY(mpt_cpu_set_threads(ndev ? mpt_cpu_threads_per_rank(1, ndev)
                               : mpt_cpu_threads_per_rank(mpt_comm_local_size(comm), 1)));
  mpt_ddp *ddp = NULL;
  mpt_dp *dp = NULL;
  mpt_tape *tape = NULL;
  mpt_device devices[MPT_DP_MAX_DEVICES];
  for (int k = 0; k < ndev; k++) devices[k] = (mpt_device){MPT_DEVICE_CPU, k};
  if (ndev) TRY(mpt_dp_init(&dp, model, devices, ndev, NULL, NULL));
  else TRY(mpt_ddp_init(&ddp, model, comm, NULL, NULL));
  TRY(mpt_tape_init(&tape, model, NULL));
  float sums[3] = {0, 0, 0}; /* loss * rows, correct, rows: over the last half */
  const double t0 = mpt_time_ms();
  for (int step = 0; step < steps; step++) {
    mpt_batch b;
    if (mpt_loader_next(loader, &b) != MPT_OK) TRY(mpt_error_set(MPT_EIO, "no batch %d", step));
    float loss;
    int64_t correct = 0;
    TRY(mpt_model_zero_grad(model, NULL));
    if (dp) { /* scatter, parallel forward + backward, gather, reduce onto the first device */
      TRY(mpt_dp_step(dp, &b.images, &b.labels, 1.0f, 0, &loss, &correct));
    } else { /* each rank its shard; backward all-reduces */
      mpt_var *x, *logits, *l;
      mpt_tape_reset(tape, 0);
      TRY(mpt_tape_input(tape, &b.images, &x));
      TRY(mpt_model_forward(model, tape, x, &logits));
      TRY(mpt_nn_cross_entropy(tape, logits, &b.labels, &l));
      TRY(mpt_tape_backward(tape, l, 1.0f));
      TRY(mpt_var_item(tape, l, &loss));
      TRY(mpt_op_count_correct(NULL, mpt_var_value(logits)->data, b.labels.data, b.count, 10,
                               &correct));
    }
    TRY(mpt_optimizer_step_model(opt, model, NULL, oc.lr));
    if (step == 0) { /* keep the parameters after the first step for the check */
      const size_t nbytes = (size_t)mpt_model_param_count(model) * sizeof(float);
      if (!(*first = malloc(nbytes))) TRY(MPT_ENOMEM);
      memcpy(*first, mpt_model_params(model), nbytes);
    }
    if (2 * step >= steps) {
      sums[0] += loss * (float)b.count;
      sums[1] += (float)correct;
      sums[2] += (float)b.count;
    }
  }
  const double seconds = (mpt_time_ms() - t0) / 1000.0;
  if (ddp) TRY(mpt_comm_allreduce_sync(comm, sums, sums, 3, MPT_F32, MPT_REDUCE_SUM));
  mpt_tape_free(tape);
  mpt_dp_free(dp);
  mpt_ddp_free(ddp);
  mpt_loader_free(loader);
  mpt_sampler_free(sampler);
  mpt_optimizer_free(opt);
  mpt_model_free(model);
  return (result){sums[0] / sums[2], sums[1] / sums[2],
                  (double)steps * world * PER_DEVICE / seconds};
}

int main(int argc, char **argv) {
  const int steps = argc > 1 ? atoi(argv[1]) : 100;
  TRY(mpt_comm_init(&comm, NULL));
  const int rank = mpt_comm_rank(comm), world = mpt_comm_world_size(comm);
  if (world > MPT_DP_MAX_DEVICES || steps < 2) {
    fprintf(stderr, "dp_vs_ddp: STEPS must be >= 2 (got %d), ranks at most %d (got %d)\n",
            steps, MPT_DP_MAX_DEVICES, world);
    mpt_comm_abort(comm, 2);
  }
  mpt_dataset ds;
  mpt_dataset_config dc = mpt_dataset_config_default();
  dc.limit = (int64_t)steps * world * PER_DEVICE;
  TRY(mpt_dataset_load_fashion_mnist(NULL, "train", &dc, &ds));
  if (ds.count < dc.limit) { /* one epoch at most */
    fprintf(stderr, "dp_vs_ddp: STEPS %d needs %lld samples, the training set has %lld: at most "
            "%lld steps with %d ranks\n", steps, (long long)dc.limit, (long long)ds.count,
            (long long)(ds.count / (world * PER_DEVICE)), world);
    mpt_comm_abort(comm, 2);
  }

  mpt_cnn_config cc = mpt_cnn_config_default();
  mpt_model *shape;
  TRY(mpt_model_init_cnn(&shape, mpt_device_cpu(), &cc, 7));
  const int64_t count = mpt_model_param_count(shape);
  mpt_model_free(shape);
  float *ddp_first = NULL, *dp_first = NULL;
  const result ddp = train(&ds, steps, world, 0, &ddp_first);
  result dp = {0, 0, 0};
  int differ = 0;
  if (rank == 0) { /* DP runs in one process; the other ranks wait */
    dp = train(&ds, steps, world, world, &dp_first);
    double diff = 0, scale = 1e-3;
    for (int64_t i = 0; i < count; i++) {
      diff = fmax(diff, fabs((double)ddp_first[i] - (double)dp_first[i]));
      scale = fmax(scale, fabs((double)dp_first[i]));
    }
    differ = diff / scale > 1e-5;
    printf("cnn on Fashion-MNIST, %d steps of %d samples (last half averaged)\n", steps,
           world * PER_DEVICE);
    printf("%-4s %-22s %8s %8s %12s\n", "mode", "layout", "loss", "accuracy", "samples/s");
    printf("%-4s %d processes x 1 device  %8.4f %8.4f %12.0f\n", "DDP", world, ddp.loss,
           ddp.accuracy, ddp.samples_per_s);
    printf("%-4s 1 process x %d devices  %8.4f %8.4f %12.0f\n", "DP", world, dp.loss,
           dp.accuracy, dp.samples_per_s);
    printf("parameters after the first step: max relative difference %.2e (%s)\n",
           diff / scale, differ ? "FAILED: more than 1e-5" : "the same up to rounding");
  }
  TRY(mpt_comm_broadcast_sync(comm, &differ, 1, MPT_I32, 0));
  free(dp_first);
  free(ddp_first);
  mpt_dataset_free(&ds);
  mpt_comm_free(comm);
  mpt_comm_finalize();
  return differ ? 1 : 0;
}
