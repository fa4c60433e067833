/* `mpitrain train`: one process, or DDP over the ranks of mpirun / srun.
 *
 * Per step: K micro-batches (K = --accumulate, each of --batch-size samples on this rank; the
 * last step of an epoch takes the batches left, fewer than K when the epoch's batch count is
 * not a multiple of K); before each forward the DDP engine synchronises buffers; the loss of
 * each micro-batch is scaled by its share of the step's samples (rows / group rows), so a step
 * equals one step on the combined batch; the last micro-batch's backward all-reduces the
 * buckets (no_sync on the others); then the optimizer steps with the scheduled learning rate.
 * Metrics are sums over ranks (loss * samples, correct answers, samples), so evaluation gives
 * the same accuracy for any world size: the DistributedSampler's padding rows are not counted.
 *
 * Failure: any error is printed with the rank and its detail; with more than one rank the job
 * is then aborted (MPI_Abort) so no rank waits for one that has stopped. */
#include "cli/train.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "cli/metrics.h"
#include "cli/preempt.h"
#include "cli/train_zero.h"
#include "mpitrain/ckpt.h"
#include "mpitrain/comm.h"
#include "mpitrain/data.h"
#include "mpitrain/ddp.h"
#include "mpitrain/dp.h"
#include "mpitrain/nn.h"
#include "mpitrain/ops.h"
#include "mpitrain/optim.h"

#include "cli/train_impl.h"

/* SIGTERM or SIGUSR1 (src/cli/preempt.c: the thread that takes them), named in the log */
static const char *stop_signal_name(void) {
  const int sig = mpt_cli_preempt_signal();
  return sig == SIGUSR1 ? "SIGUSR1" : sig ? "SIGTERM" : "a signal on another rank";
}

static mpt_status make_model(trainer *t) {
  const mpt_cli_options *o = t->o;
  if (strcmp(o->model, "cnn") == 0)
    return mpt_model_init_cnn(&t->model, t->device, &o->cnn, o->seed);
  return mpt_model_init_mlp(&t->model, t->device, &o->mlp, o->seed);
}

static mpt_status load_data(trainer *t) {
  const mpt_cli_options *o = t->o;
  if (o->synthetic) {
    int64_t ntrain = o->train_limit ? o->train_limit : 60000;
    int64_t ntest = o->test_limit ? o->test_limit : 10000;
    MPT_RETURN_IF(mpt_dataset_init_synthetic(&t->train, ntrain, 1, 28, 28, 10, o->seed));
    return mpt_dataset_init_synthetic(&t->test, ntest, 1, 28, 28, 10, o->seed + 1);
  }
  const char *dir = o->data_dir[0] ? o->data_dir : mpt_data_default_dir();
  if (!dir)
    return MPT_FAIL(MPT_ENOENT,
                    "Fashion-MNIST not found in /usr/share/datasets/fashion-mnist: install "
                    "Debian's dataset-fashion-mnist package (apt-get install "
                    "dataset-fashion-mnist) or pass --data DIR");
  mpt_dataset_config dc = mpt_dataset_config_default();
  dc.limit = o->train_limit;
  MPT_RETURN_IF(mpt_dataset_load_fashion_mnist(dir, "train", &dc, &t->train));
  dc.limit = o->test_limit;
  return mpt_dataset_load_fashion_mnist(dir, "test", &dc, &t->test);
}

static mpt_status make_loaders(trainer *t) {
  const mpt_cli_options *o = t->o;
  mpt_sampler_config sc = mpt_sampler_config_default();
  sc.num_replicas = t->world;
  sc.rank = t->rank;
  sc.shuffle = o->shuffle;
  sc.seed = o->seed;
  sc.drop_last = o->drop_last;
  MPT_RETURN_IF(mpt_sampler_init(&t->train_sampler, t->train.count, &sc));
  mpt_loader_config lc = mpt_loader_config_default();
  lc.batch_size = o->batch_size;
  lc.drop_last = o->drop_last;
  MPT_RETURN_IF(mpt_loader_init(&t->train_loader, &t->train, t->train_sampler, &lc));
  /* Evaluation: every sample exactly once over the ranks (padding rows are skipped). */
  sc.shuffle = 0;
  sc.drop_last = 0;
  MPT_RETURN_IF(mpt_sampler_init(&t->test_sampler, t->test.count, &sc));
  lc.batch_size = EVAL_BATCH;
  lc.drop_last = 0;
  return mpt_loader_init(&t->test_loader, &t->test, t->test_sampler, &lc);
}

/* Sum over ranks of n floats, in place. */
static mpt_status sum_over_ranks(trainer *t, float *v, int n) {
  if (t->world == 1) return MPT_OK;
  return mpt_comm_allreduce_sync(t->comm, v, v, n, MPT_F32, MPT_REDUCE_SUM);
}

/* Forward of `rows` rows of a batch on the tape; returns the loss var and the logits. */
/* The first `rows` rows of a host batch on the training device: the batch itself on the CPU; on
 * a GPU a copy on the compute stream into buffers allocated once (grown when a batch is larger). */
static mpt_status stage_batch(trainer *t, const mpt_batch *b, int64_t rows, void **x, void **y) {
  if (t->device.type == MPT_DEVICE_CPU) {
    *x = b->images.data;
    *y = b->labels.data;
    return MPT_OK;
  }
  int64_t sample = b->images.count / (b->count > 0 ? b->count : 1);
  if (rows > t->dev_rows) {
    mpt_device_free(t->device, t->dev_x);
    mpt_device_free(t->device, t->dev_y);
    t->dev_x = t->dev_y = NULL;
    t->dev_rows = 0;
    MPT_RETURN_IF(mpt_device_alloc(t->device, (size_t)(rows * sample) * sizeof(float), &t->dev_x));
    MPT_RETURN_IF(mpt_device_alloc(t->device, (size_t)rows * sizeof(int32_t), &t->dev_y));
    t->dev_rows = rows;
  }
  MPT_RETURN_IF(mpt_op_memcpy(t->stream, t->device, t->dev_x, mpt_device_cpu(), b->images.data,
                              (size_t)(rows * sample) * sizeof(float)));
  MPT_RETURN_IF(mpt_op_memcpy(t->stream, t->device, t->dev_y, mpt_device_cpu(), b->labels.data,
                              (size_t)rows * sizeof(int32_t)));
  *x = t->dev_x;
  *y = t->dev_y;
  return MPT_OK;
}

static mpt_status forward_batch(trainer *t, const mpt_batch *b, int64_t rows, mpt_var **logits,
                                mpt_var **loss, mpt_tensor *labels) {
  int64_t shape[4] = {rows, b->images.shape[1], b->images.shape[2], b->images.shape[3]};
  void *xd, *yd;
  MPT_RETURN_IF(stage_batch(t, b, rows, &xd, &yd));
  mpt_tensor x = mpt_tensor_view(xd, t->device, MPT_F32, 4, shape);
  *labels = mpt_tensor_view(yd, t->device, MPT_I32, 1, shape);
  mpt_var *in;
  MPT_RETURN_IF(mpt_tape_input(t->tape, &x, &in));
  MPT_RETURN_IF(mpt_model_forward(t->model, t->tape, in, logits));
  return mpt_nn_cross_entropy(t->tape, *logits, labels, loss);
}

/* The test set in evaluation mode; mpt_eval_batch counts only the real rows of each batch. */
static mpt_status evaluate(trainer *t, double *loss_out, double *acc_out) {
  MPT_RETURN_IF(mpt_loader_start_epoch(t->test_loader, 0));
  mpt_eval_sums sums = {0, 0, 0};
  mpt_batch b;
  int r;
  while ((r = mpt_loader_next(t->test_loader, &b)) == MPT_OK) {
    if (b.num_real == 0) continue;
    void *xd, *yd;
    MPT_RETURN_IF(stage_batch(t, &b, b.num_real, &xd, &yd));
    int64_t shape[4] = {b.num_real, b.images.shape[1], b.images.shape[2], b.images.shape[3]};
    mpt_tensor x = mpt_tensor_view(xd, t->device, MPT_F32, 4, shape);
    mpt_tensor y = mpt_tensor_view(yd, t->device, MPT_I32, 1, shape);
    MPT_RETURN_IF(mpt_eval_batch(t->tape, &x, &y, b.num_real, &sums));
  }
  if (r < 0) return (mpt_status)r;
  MPT_RETURN_IF(sum_over_ranks(t, &sums.loss_sum, 3));
  *loss_out = sums.count > 0 ? sums.loss_sum / sums.count : NAN;
  *acc_out = sums.count > 0 ? sums.correct / sums.count : NAN;
  return MPT_OK;
}

/* On a GPU the host runs ahead of the device: the phases are timed by events on the compute
 * stream (trainer.phase_ev), read once the step's synchronisation has completed them. */
static mpt_status phase_events_init(trainer *t) {
  t->phase_nev = 3 * t->o->accumulate + 2;
  t->phase_ev = calloc((size_t)t->phase_nev, sizeof *t->phase_ev);
  if (!t->phase_ev) return MPT_FAIL(MPT_ENOMEM, "cannot allocate the phase timers");
  for (int i = 0; i < t->phase_nev; i++) MPT_RETURN_IF(mpt_event_init(&t->phase_ev[i], t->device));
  return MPT_OK;
}

static mpt_status phase_mark(trainer *t, int i) {
  return t->phase_ev && !t->dp ? mpt_event_record(t->phase_ev[i], t->stream) : MPT_OK;
}

/* After the step's synchronisation: device times of forward, backward (with the wait for the
 * last gradient bucket, which report_breakdown takes out again) and optimizer. */
static mpt_status phase_times(trainer *t, int K, double *fwd, double *bwd, double *opt) {
  if (!t->phase_ev || t->dp) return MPT_OK;
  double f = 0, b = 0, ms = 0;
  for (int k = 0; k < K; k++) {
    MPT_RETURN_IF(mpt_event_elapsed_ms(t->phase_ev[3 * k], t->phase_ev[3 * k + 1], &ms));
    f += ms;
    MPT_RETURN_IF(mpt_event_elapsed_ms(t->phase_ev[3 * k + 1], t->phase_ev[3 * k + 2], &ms));
    b += ms;
  }
  MPT_RETURN_IF(mpt_event_elapsed_ms(t->phase_ev[3 * K], t->phase_ev[3 * K + 1], opt));
  *fwd = f;
  *bwd = b;
  return MPT_OK;
}

/* The micro-batches of the epoch's step `step` (--accumulate K, or the batches left for the
 * last step) and the rows they hold together on this rank (the same on every rank: the sampler
 * gives each rank as many positions). */
static void step_group(trainer *t, int64_t step, int *kg, int64_t *rows) {
  const mpt_cli_options *o = t->o;
  const int64_t nb = mpt_loader_num_batches(t->train_loader), first = step * o->accumulate;
  const int64_t n = o->drop_last ? nb * o->batch_size : mpt_sampler_num_samples(t->train_sampler);
  int64_t k = nb - first < o->accumulate ? nb - first : o->accumulate;
  if (k < 0) k = 0;
  int64_t end = (first + k) * o->batch_size;
  *kg = (int)k;
  *rows = (end < n ? end : n) - first * o->batch_size;
}

/* One optimizer step over the micro-batches of the epoch's step `step` (step_group). Sets
 * *ran_out when the epoch ran out of batches before the step could start. */
static mpt_status train_step(trainer *t, int64_t step, double *sums, int *ran_out) {
  const mpt_cli_options *o = t->o;
  int K;
  int64_t group_rows;
  step_group(t, step, &K, &group_rows);
  double t0 = mpt_time_ms(), fwd = 0, bwd = 0;
  *ran_out = 0;
  if (K < 1 || group_rows < 1) {
    *ran_out = 1;
    return MPT_OK;
  }
  MPT_RETURN_IF(mpt_model_zero_grad(t->model, t->stream));
  for (int k = 0; k < K; k++) {
    mpt_batch b;
    int r = mpt_loader_next(t->train_loader, &b);
    if (r < 0) return (mpt_status)r;
    if (r != MPT_OK) {
      if (k == 0) {
        *ran_out = 1;
        return MPT_OK;
      }
      return MPT_FAIL(MPT_ESTATE, "step %" PRId64 ": the epoch ran out of batches after %d of "
                      "the step's %d micro-batches on rank %d", t->global_step, k, K, t->rank);
    }
    /* this micro-batch's share of the step's mean loss (a short last batch weighs less) */
    const float share = (float)((double)b.count / (double)group_rows);
    double f0 = mpt_time_ms();
    /* DDP synchronises buffers before each training forward it sees; DataParallel's
     * replicas run theirs, so the buffers are synchronised here for them. */
    if (t->ddp && t->dp) MPT_RETURN_IF(mpt_ddp_sync_buffers(t->ddp));
    uint64_t seed = o->seed * 1000003u + (uint64_t)t->global_step * 131u + (uint64_t)k +
                    (uint64_t)t->rank * 7919u;
    if (t->dp) {
      trainer_maybe_poison(t, &b, k); /* forward + loss + backward on every device, reduced onto the first */
      float l;
      int64_t correct = 0;
      int64_t shape[4] = {b.count, b.images.shape[1], b.images.shape[2], b.images.shape[3]};
      mpt_tensor x = mpt_tensor_view(b.images.data, mpt_device_cpu(), MPT_F32, 4, shape);
      mpt_tensor y = mpt_tensor_view(b.labels.data, mpt_device_cpu(), MPT_I32, 1, shape);
      MPT_RETURN_IF(mpt_dp_step(t->dp, &x, &y, share, seed, &l, &correct));
      if (!isfinite(l) && !o->skip_nonfinite)
        return MPT_FAIL(MPT_ENONFINITE,
                        "non-finite loss %g at step %" PRId64 " on rank %d (--skip-nonfinite "
                        "skips such steps)",
                        (double)l, t->global_step, t->rank);
      if (!isfinite(l)) {
        t->step_nonfinite = 1;
        l = 0;
      }
      sums[0] += (double)l * (double)b.count;
      sums[1] += (double)correct;
      sums[2] += (double)b.count;
      double f1 = mpt_time_ms();
      fwd += f1 - f0; /* DP: forward and backward together */
      continue;
    }
    trainer_maybe_poison(t, &b, k);
    MPT_RETURN_IF(phase_mark(t, 3 * k));
    mpt_tape_reset(t->tape, seed);
    mpt_var *logits, *loss;
    mpt_tensor labels;
    MPT_RETURN_IF(forward_batch(t, &b, b.count, &logits, &loss, &labels));
    float l;
    MPT_RETURN_IF(mpt_var_item(t->tape, loss, &l));
    if (!isfinite(l) && !o->skip_nonfinite)
      return MPT_FAIL(MPT_ENONFINITE,
                      "non-finite loss %g at step %" PRId64 " (epoch %" PRId64
                      ", micro-batch %d) on rank %d (--skip-nonfinite skips such steps)",
                      (double)l, t->global_step, b.epoch + 1, k, t->rank);

    if (!isfinite(l)) {
      t->step_nonfinite = 1;
      l = 0;
    }
    int64_t correct = 0;
    MPT_RETURN_IF(mpt_op_count_correct(t->stream, mpt_var_value(logits)->data, labels.data,
                                       b.count, mpt_var_value(logits)->shape[1], &correct));
    sums[0] += (double)l * (double)b.count;
    sums[1] += (double)correct;
    sums[2] += (double)b.count;
    double f1 = mpt_time_ms();
    MPT_RETURN_IF(phase_mark(t, 3 * k + 1));
    if (t->trace) mpt_trace_add(t->trace, "forward", 0, f0, f1 - f0, t->global_step);
    if (t->ddp) mpt_ddp_set_sync(t->ddp, k == K - 1); /* no_sync but for the last */
    /* With DDP, backward returns with the gradients averaged over the ranks. */
    MPT_RETURN_IF(mpt_tape_backward(t->tape, loss, share));
    double b1 = mpt_time_ms();
    MPT_RETURN_IF(phase_mark(t, 3 * k + 2));
    if (t->trace) mpt_trace_add(t->trace, "backward", 0, f1, b1 - f1, t->global_step);
    fwd += f1 - f0;
    bwd += b1 - f1;
  }
  if (t->dp && t->ddp) { /* hybrid: each rank's DP-reduced gradients, averaged over ranks */
    double c0 = mpt_time_ms();
    MPT_RETURN_IF(mpt_ddp_allreduce_grads(t->ddp));
    t->sum_dp_allreduce += mpt_time_ms() - c0;
  }
  double o0 = mpt_time_ms();
  MPT_RETURN_IF(phase_mark(t, 3 * K));
  int skip = 0;
  if (o->skip_nonfinite) {
    /* The gradients are averaged over ranks and bit-identical everywhere, and NaN/Inf survive
     * the average: every rank takes the same decision without another collective. */
    int nonfinite = 0;
    MPT_RETURN_IF(t->ddp ? mpt_ddp_grads_nonfinite(t->ddp, t->stream, &nonfinite) /* ZeRO */
                         : mpt_op_check_finite(t->stream, mpt_model_grads(t->model),
                                               mpt_model_param_count(t->model), &nonfinite));
    skip = nonfinite || (t->world == 1 && t->step_nonfinite);
  }
  t->step_nonfinite = 0;
  t->consecutive_skipped = skip ? t->consecutive_skipped + 1 : 0;
  if (skip) {
    t->skipped_nonfinite++;
    mpt_log(MPT_LOG_WARN, "step %" PRId64 ": non-finite gradients, optimizer step skipped (%" PRId64
            " so far)", t->global_step, t->skipped_nonfinite);
    MPT_RETURN_IF(mpt_model_consume_grads(t->model)); /* skipped on purpose */
    /* every step, not only when a checkpoint is due: 3 skips in a row stop the run */
    MPT_RETURN_IF(trainer_check_model_healthy(t, "after a skipped step"));
  } else {
    float lr = mpt_lr_at(&t->schedule, o->optim.lr, t->global_step);
    MPT_RETURN_IF(t->ddp ? mpt_ddp_optimizer_step(t->ddp, t->opt, t->stream, lr) /* ZeRO */
                         : mpt_optimizer_step_model(t->opt, t->model, t->stream, lr));
  }
  MPT_RETURN_IF(phase_mark(t, 3 * K + 1));
  MPT_RETURN_IF(mpt_stream_synchronize(t->stream, o->timeout_s * 1e3));
  if (t->grad_comm && mpt_comm_error(t->grad_comm) != MPT_OK)
    return MPT_FAIL(mpt_comm_error(t->grad_comm),
                    "the gradient all-reduce failed on rank %d (see the error above)", t->rank);
  double o1 = mpt_time_ms(), opt = o1 - o0;
  MPT_RETURN_IF(phase_times(t, K, &fwd, &bwd, &opt));
  if (t->trace) mpt_trace_add(t->trace, "optimizer", 0, o0, o1 - o0, t->global_step);
  t->sum_forward += fwd;
  t->sum_backward += bwd;
  t->sum_optimizer += opt;
  t->sum_total += o1 - t0;
  t->timed_steps++;
  t->global_step++;
  return MPT_OK;
}

/* Starts the agreement on "stop after this step" (asynchronous: it completes on the comm stream
 * while the step computes). */
static mpt_status stop_vote_start(trainer *t) {
  t->stop_local = t->stop_global = mpt_cli_preempt_signal() ? 1 : 0;
  if (t->world == 1) return MPT_OK;
  mpt_stream *cs = mpt_comm_stream(t->comm);
  MPT_RETURN_IF(mpt_comm_allreduce(t->comm, cs, &t->stop_local, &t->stop_global, 1, MPT_I32,
                                   MPT_REDUCE_MAX));
  return mpt_event_record(t->stop_event, cs);
}

static mpt_status stop_vote_finish(trainer *t) {
  if (t->world == 1) return MPT_OK;
  return mpt_comm_wait_event(t->comm, t->stop_event);
}

static mpt_status run_epoch(trainer *t, int64_t epoch, mpt_epoch_metrics *m) {
  const mpt_cli_options *o = t->o;
  double e0 = mpt_time_ms();
  MPT_RETURN_IF(trainer_check_epoch(t, epoch));
  MPT_RETURN_IF(mpt_loader_start_epoch(t->train_loader, epoch));
  /* loss x rows, correct, rows: in double (in float, 100000 steps of batch 1 that each have the
   * loss 3.1510 averaged 3.1536: faults.md F44), rounded to float once for the all-reduce */
  double sums[3] = {0, 0, 0};
  int64_t step = 0;
  if (t->skip_steps > 0) { /* resume mid-epoch: the same batches an uninterrupted run used */
    mpt_batch b;
    for (int64_t i = 0; i < t->skip_steps * o->accumulate; i++) {
      int r = mpt_loader_next(t->train_loader, &b);
      if (r < 0) return (mpt_status)r;
    }
    step = t->skip_steps;
    t->skip_steps = 0;
  }
  int interrupted = 0;
  for (; step < t->steps_per_epoch; step++) {
    int ran_out;
    trainer_maybe_kill_self(t);
    MPT_RETURN_IF(stop_vote_start(t));
    MPT_RETURN_IF(train_step(t, step, sums, &ran_out));
    MPT_RETURN_IF(stop_vote_finish(t));
    if (ran_out) break;
    trainer_maybe_perturb(t);
    if (o->check_replicas > 0 && t->global_step % o->check_replicas == 0)
      MPT_RETURN_IF(trainer_check_replicas(t));
    if (t->stop_global) {
      t->preempted = 1;
      mpt_log(MPT_LOG_WARN, "%s received: stopping after step %" PRId64 " (epoch %" PRId64
              ")", stop_signal_name(), t->global_step, epoch + 1);
    } else if (o->stop_at_step > 0 && t->global_step >= o->stop_at_step) {
      t->stopped = 1;
      mpt_log(MPT_LOG_INFO, "stopping after global step %" PRId64 " (--stop-at-step)",
              t->global_step);
    }
    interrupted = t->preempted || t->stopped;
    int every = o->checkpoint_dir[0] && o->checkpoint_every > 0 &&
                t->global_step % o->checkpoint_every == 0;
    if (o->checkpoint_dir[0] && (every || interrupted))
      MPT_RETURN_IF(trainer_save_checkpoint(t, epoch, step + 1));
    if (interrupted) {
      step++;
      break;
    }
    trainer_progress_line(t, epoch, step + 1, sums);
    if (t->progress && (step % 20 == 0 || step + 1 == t->steps_per_epoch)) {
      double s = (mpt_time_ms() - e0) / 1e3;
      mpt_progress_draw(stderr, epoch + 1, step + 1, t->steps_per_epoch,
                        sums[2] > 0 ? sums[0] / sums[2] : 0,
                        s > 0 ? sums[2] * t->world / s : 0);
    }
  }
  if (t->progress) mpt_progress_clear(stderr);
  double train_s = (mpt_time_ms() - e0) / 1e3;
  float fsums[3] = {(float)sums[0], (float)sums[1], (float)sums[2]};
  MPT_RETURN_IF(sum_over_ranks(t, fsums, 3));
  for (int i = 0; i < 3; i++) sums[i] = fsums[i];
  m->epoch = epoch + 1;
  m->steps = step;
  /* the scheduled learning rate of the epoch's first and last steps (global step = epoch x
   * steps per epoch + step, also after a resume) */
  m->lr_first = mpt_lr_at(&t->schedule, o->optim.lr, epoch * t->steps_per_epoch);
  m->lr_last = mpt_lr_at(&t->schedule, o->optim.lr, t->global_step > 0 ? t->global_step - 1 : 0);
  m->train_loss = sums[2] > 0 ? sums[0] / sums[2] : NAN;
  m->train_accuracy = sums[2] > 0 ? sums[1] / sums[2] : NAN;
  m->samples_per_sec = train_s > 0 ? sums[2] / train_s : 0;
  m->test_loss = m->test_accuracy = NAN;
  if (interrupted) { /* no evaluation of a partial epoch: the time may be short */
    m->seconds = (mpt_time_ms() - e0) / 1e3;
    mpt_log(MPT_LOG_INFO,
            "epoch %3" PRId64 "/%" PRId64 "  interrupted after step %" PRId64 "  train loss %.4f"
            "  acc %.4f  %8.0f samples/s",
            m->epoch, o->epochs, step, m->train_loss, m->train_accuracy, m->samples_per_sec);
    return MPT_OK;
  }
  MPT_RETURN_IF(evaluate(t, &m->test_loss, &m->test_accuracy));
  m->seconds = (mpt_time_ms() - e0) / 1e3;
  mpt_log(MPT_LOG_INFO,
          "epoch %3" PRId64 "/%" PRId64 "  train loss %.4f  acc %.4f  test loss %.4f  acc %.4f"
          "  %8.0f samples/s  %6.1f s",
          m->epoch, o->epochs, m->train_loss, m->train_accuracy, m->test_loss,
          m->test_accuracy, m->samples_per_sec, m->seconds);
  MPT_RETURN_IF(trainer_check_model_healthy(t, "at the end of the epoch"));
  if (t->test.count > 0 && !isfinite(m->test_loss))
    return MPT_FAIL(MPT_ENONFINITE, "the test loss is %g at the end of epoch %" PRId64 " (global "
                    "step %" PRId64 ", %" PRId64 " step(s) skipped for non-finite gradients): the "
                    "model no longer computes finite outputs; the learning rate %g is probably "
                    "too high", m->test_loss, m->epoch, t->global_step, t->skipped_nonfinite,
                    (double)o->optim.lr);
  if (o->checkpoint_dir[0] && o->checkpoint_every == 0)
    MPT_RETURN_IF(trainer_save_checkpoint(t, epoch + 1, 0));
  return MPT_OK;
}

static mpt_status write_trace(trainer *t) {
  if (mpt_trace_dropped(t->trace) > 0)
    mpt_log(MPT_LOG_WARN, "--trace: %" PRId64 " event(s) dropped on rank %d (the trace holds %"
            PRId64 "): the trace is incomplete", mpt_trace_dropped(t->trace), t->rank,
            mpt_trace_count(t->trace));
  for (int r = 0; r < t->world; r++) {
    if (r == t->rank) MPT_RETURN_IF(mpt_trace_append(t->trace, t->o->trace, r == 0, r == t->world - 1));
    if (t->world > 1) MPT_RETURN_IF(mpt_comm_barrier_sync(t->comm));
  }
  return MPT_OK;
}

static mpt_status report_breakdown(trainer *t, mpt_step_breakdown *bd) {
  /* The slowest rank's figures: max over ranks of the per-step means. */
  double n = t->timed_steps ? (double)t->timed_steps : 1;
  mpt_ddp_stats ds = t->ddp ? mpt_ddp_get_stats(t->ddp) : (mpt_ddp_stats){0};
  /* DP: the all-reduce of the reduced gradients follows backward, so all of it is exposed. */
  double exposed = t->dp ? t->sum_dp_allreduce : ds.sum_exposed_comm_ms;
  /* On a GPU the backward events include the compute stream's wait for the last bucket: that
   * part is the exposed communication, reported on its own. */
  const double backward =
      t->sum_backward - (t->phase_ev && !t->dp && t->ddp ? ds.sum_exposed_comm_ms : 0);
  double allreduce = t->dp ? t->sum_dp_allreduce : ds.sum_allreduce_ms;
  float v[6] = {(float)(t->sum_forward / n), (float)(backward / n),
                (float)(exposed / n), (float)(t->sum_optimizer / n),
                (float)(t->sum_total / n), (float)(allreduce / n)};
  if (t->world > 1)
    MPT_RETURN_IF(mpt_comm_allreduce_sync(t->comm, v, v, 6, MPT_F32, MPT_REDUCE_MAX));
  bd->forward_ms = v[0];
  bd->backward_ms = v[1];
  bd->exposed_comm_ms = v[2];
  bd->optimizer_ms = v[3];
  bd->total_ms = v[4];
  bd->allreduce_ms = v[5];
  bd->hidden_fraction =
      !t->dp && ds.sum_allreduce_ms > 0 ? ds.sum_hidden_ms / ds.sum_allreduce_ms : 0;
  bd->steps = t->timed_steps;
  bd->forward_includes_backward = t->dp != NULL;
  if (t->dp) /* each replica thread runs forward and backward in one pass: one figure */
    mpt_log(MPT_LOG_INFO,
            "per-step breakdown (ms, mean over %" PRId64 " steps, slowest rank): forward+backward "
            "%.3f (DP: one pass per device)  exposed comm %.3f  optimizer %.3f  total %.3f",
            bd->steps, bd->forward_ms, bd->exposed_comm_ms, bd->optimizer_ms, bd->total_ms);
  else
    mpt_log(MPT_LOG_INFO,
            "per-step breakdown (ms, mean over %" PRId64 " steps, slowest rank): forward %.3f  "
            "backward %.3f  exposed comm %.3f  optimizer %.3f  total %.3f",
            bd->steps, bd->forward_ms, bd->backward_ms, bd->exposed_comm_ms, bd->optimizer_ms,
            bd->total_ms);
  if (t->ddp)
    mpt_log(MPT_LOG_INFO,
            "all-reduce %.3f ms per step in %d bucket(s), %.0f%% hidden behind backward "
            "(rank 0)",
            bd->allreduce_ms, mpt_ddp_num_buckets(t->ddp), 100.0 * bd->hidden_fraction);
  if (t->dp) {
    mpt_dp_stats ps = mpt_dp_get_stats(t->dp);
    double m = ps.steps ? (double)ps.steps : 1;
    char per[512] = "";
    size_t used = 0;
    for (int k = 0; k < mpt_dp_num_devices(t->dp) && used < sizeof per; k++) {
      char name[32];
      used += (size_t)snprintf(per + used, sizeof per - used, "%s%s %.3f", k ? ", " : "",
                               mpt_device_str(mpt_dp_device(t->dp, k), name, sizeof name),
                               ps.sum_replica_ms[k] / m);
    }
    mpt_log(MPT_LOG_INFO,
            "DP over %d devices (rank 0): step %.3f ms; replica work (ms) %s; the first device "
            "spends %.3f ms beyond the others (broadcast %.3f, gather %.3f, reduce %.3f)",
            mpt_dp_num_devices(t->dp), ps.sum_step_ms / m, per, ps.sum_first_extra_ms / m,
            ps.sum_broadcast_ms / m, ps.sum_gather_ms / m, ps.sum_reduce_ms / m);
  }
  return MPT_OK;
}

static mpt_status train_run(trainer *t) {
  const mpt_cli_options *o = t->o;
  MPT_RETURN_IF(trainer_check_same_options(t));
  MPT_RETURN_IF(trainer_resolve_resume_auto(t)); /* may point t->o at the resolved options */
  o = t->o;
  if (t->rank == 0 && o->save_params[0])
    MPT_RETURN_IF(trainer_check_output_path("--save-params", o->save_params));
  if (t->rank == 0 && o->metrics_json[0])
    MPT_RETURN_IF(trainer_check_output_path("--metrics-json", o->metrics_json));
  if (t->rank == 0 && o->trace[0]) MPT_RETURN_IF(trainer_check_output_path("--trace", o->trace));
  if (t->rank == 0) MPT_RETURN_IF(trainer_check_outputs(o));
  if (t->rank == 0 && o->checkpoint_dir[0]) MPT_RETURN_IF(trainer_check_checkpoint_dir(o));
  if (t->rank == 0 && (o->checkpoint_dir[0] || o->resume[0]))
    MPT_RETURN_IF(trainer_check_run_options(o));
  if (strcmp(o->device, "cuda") == 0 && !mpt_device_available(MPT_DEVICE_CUDA))
    return MPT_FAIL(MPT_ENOTSUP, "--device cuda: no CUDA device is visible to this process (or "
                                 "the build has no CUDA backend: configure --with-cuda)");
  mpt_device devices[MPT_DP_MAX_DEVICES];
  int ndev = 1;
  if (o->mode == MPT_MODE_DP)
    MPT_RETURN_IF(mpt_dp_parse_devices(o->devices, devices, MPT_DP_MAX_DEVICES, &ndev));
  t->device = o->mode == MPT_MODE_DP ? devices[0] : mpt_device_cpu();
  if (t->device.type != MPT_DEVICE_CPU)
    return MPT_FAIL(MPT_ENOTSUP, "--mode dp over CUDA devices is not wired into the trainer yet "
                                 "(use DDP: one rank per GPU)");
  /* --device cuda, or by default when every rank sees a GPU: one GPU per rank, by local rank
   * (collective: every rank takes the same branch). */
  int32_t use_cuda = strcmp(o->device, "cuda") == 0 ||
                     (o->device[0] == '\0' && o->mode != MPT_MODE_DP &&
                      mpt_device_available(MPT_DEVICE_CUDA));
  if (o->device[0] == '\0' && t->world > 1)
    MPT_RETURN_IF(mpt_comm_allreduce_sync(t->comm, &use_cuda, &use_cuda, 1, MPT_I32,
                                          MPT_REDUCE_MIN));
  if (use_cuda && o->mode == MPT_MODE_DP)
    return MPT_FAIL(MPT_ENOTSUP, "--mode dp with --device cuda is not wired into the trainer "
                                 "yet (use DDP: one rank per GPU)");
  if (use_cuda) MPT_RETURN_IF(mpt_comm_bind_device(t->comm, MPT_DEVICE_CUDA, -1, &t->device));
  int threads = o->threads; /* default: the cores of this host, shared by its ranks and devices */
  if (threads == 0) threads = mpt_cpu_threads_per_rank(mpt_comm_local_size(t->comm), ndev);
  MPT_RETURN_IF(mpt_cpu_set_threads(threads));
  MPT_RETURN_IF(mpt_nn_set_conv_algo(o->conv_algo));
  MPT_RETURN_IF(mpt_stream_init(&t->stream, t->device, MPT_STREAM_INLINE));
  if (t->device.type != MPT_DEVICE_CPU) MPT_RETURN_IF(phase_events_init(t));
  if (o->conv_algo == MPT_CONV_ALGO_LIBRARY && !mpt_op_conv2d_available(t->stream))
    return MPT_FAIL(MPT_ENOTSUP, "--conv-algo onednn: this build has no oneDNN convolutions "
                    "for the %s device (configure --with-onednn; apt-get install libdnnl-dev)",
                    t->device.type == MPT_DEVICE_CPU ? "cpu" : "cuda");
  MPT_RETURN_IF(mpt_event_init(&t->stop_event, mpt_device_cpu()));
  MPT_RETURN_IF(trainer_check_model_fits(t, ndev));
  MPT_RETURN_IF(load_data(t));
  MPT_RETURN_IF(trainer_check_data_shape(t));
  MPT_RETURN_IF(trainer_check_same_data(t));
  MPT_RETURN_IF(make_model(t));
  MPT_RETURN_IF(trainer_tape_init(t));
  if (t->world > 1) {
    mpt_comm *gc = t->comm;
    if (t->device.type != MPT_DEVICE_CPU) { /* gradients stay on the GPU: NCCL, else MPI staged */
      MPT_RETURN_IF(trainer_grad_comm_init(o, t->device, &t->grad_comm));
      gc = t->grad_comm;
    }
    mpt_ddp_config dc = o->ddp;
    dc.timeout_ms = o->timeout_s * 1e3;
    MPT_RETURN_IF(mpt_ddp_init(&t->ddp, t->model, gc, t->stream, &dc));
  }
  if (o->mode == MPT_MODE_DP) {
    const mpt_dp_config pc = trainer_dp_config(o);
    MPT_RETURN_IF(mpt_dp_init(&t->dp, t->model, devices, ndev, t->stream, &pc));
  }
  MPT_RETURN_IF(trainer_opt_init(t->ddp, t->model, &o->optim, t->device, &t->opt));
  if (o->no_decay_bias_norm) { /* decay the >= 2-D weights only (llm.c, nanoGPT) */
    mpt_param_group groups[64];
    int ngroups = 0;
    MPT_RETURN_IF(mpt_param_groups_split_decay(t->model, o->optim.weight_decay, groups, 64,
                                               &ngroups));
    MPT_RETURN_IF(mpt_optimizer_set_groups(t->opt, groups, ngroups));
  }
  MPT_RETURN_IF(make_loaders(t));
  int64_t batches = mpt_loader_num_batches(t->train_loader);
  if (t->ddp) MPT_RETURN_IF(mpt_ddp_check_batches(t->ddp, batches));
  /* the last step of an epoch takes the batches left (fewer than --accumulate) */
  t->steps_per_epoch = (batches + o->accumulate - 1) / o->accumulate;
  if (o->max_steps > 0 && o->max_steps < t->steps_per_epoch) t->steps_per_epoch = o->max_steps;
  if (t->steps_per_epoch < 1)
    return MPT_FAIL(MPT_EINVAL,
                    "an epoch has no batch of %" PRId64 " on this rank (%" PRId64 " samples%s): "
                    "nothing to train",
                    o->batch_size, mpt_sampler_num_samples(t->train_sampler),
                    o->drop_last ? ", --drop-last" : "");
  t->schedule = o->schedule;
  if (t->schedule.step_size <= 0) t->schedule.step_size = t->steps_per_epoch;
  if (t->schedule.kind == MPT_LR_COSINE)
    t->schedule.total_steps = t->steps_per_epoch * o->epochs;
  if (t->schedule.total_steps <= t->schedule.warmup_steps)
    t->schedule.total_steps = t->schedule.warmup_steps + 1;
  MPT_RETURN_IF(mpt_lr_schedule_validate(&t->schedule));
  if (o->trace[0]) {
    /* per step: forward, backward (per micro-batch), optimizer, buckets; DP: per micro-batch a
     * broadcast, and per device forward, backward, gather and reduce */
    int64_t cap = t->steps_per_epoch * o->epochs * (3 * o->accumulate + 2 +
                                                    (t->ddp ? mpt_ddp_num_buckets(t->ddp) : 0) +
                                                    (t->dp ? o->accumulate * (1 + 4 * ndev) : 0));
    if (cap > 2000000) cap = 2000000;
    MPT_RETURN_IF(mpt_trace_init(&t->trace, t->rank, cap < 16 ? 16 : cap));
    if (t->ddp) mpt_ddp_set_trace(t->ddp, t->trace);
    if (t->dp) mpt_dp_set_trace(t->dp, t->trace);
  }

  trainer_log_rank_line(t->comm, t->device, o->quiet);
  mpt_log(MPT_LOG_INFO,
          "model %s: %" PRId64 " parameters; %" PRId64 " training and %" PRId64
          " test samples; batch %" PRId64 " per rank x %d rank(s) x %d micro-batch(es); "
          "%" PRId64 " steps per epoch; %s lr %g; %d BLAS thread(s) per rank (OpenBLAS %s); "
          "convolutions: %s",
          o->model, mpt_model_param_count(t->model), t->train.count, t->test.count,
          o->batch_size, t->world, o->accumulate, t->steps_per_epoch,
          mpt_optimizer_kind_name(o->optim.kind), (double)o->optim.lr, threads,
          mpt_cpu_blas_name(),
          strcmp(o->model, "cnn") != 0 ? "none in this model"
          : o->conv_algo != MPT_CONV_ALGO_IM2COL && mpt_op_conv2d_available(t->stream)
              ? "oneDNN" : "im2col + GEMM");
  if (t->ddp)
    mpt_log(MPT_LOG_INFO, "DDP: %d bucket(s) (first cap %g MiB, cap %g MiB), overlap %s, "
            "gradients %s on the wire, %s%s", mpt_ddp_num_buckets(t->ddp),
            o->ddp.first_bucket_cap_mb, o->ddp.bucket_cap_mb, o->ddp.overlap ? "on" : "off",
            mpt_ddp_grad_comm_name(o->ddp.grad_comm),
            o->ddp.zero ? "ZeRO-1 (reduce-scatter, all-gather of the parameters)"
                        : "all-reduce ",
            o->ddp.zero ? "" : mpt_ddp_allreduce_algo_name(o->ddp.allreduce));
  trainer_log_configuration(t);
  MPT_RETURN_IF(trainer_memory_report(t->comm, "at start", t->model, t->opt, t->ddp, 0));

  t->epochs = calloc((size_t)o->epochs, sizeof *t->epochs);
  if (!t->epochs) return MPT_FAIL(MPT_ENOMEM, "cannot allocate metrics");
  if (o->resume[0]) MPT_RETURN_IF(trainer_resume(t));
  if (t->start_epoch >= o->epochs) /* e.g. --resume auto of a finished run: nothing to redo */
    mpt_log(MPT_LOG_INFO, "the checkpoint ends the run (%" PRId64 " epoch(s) done): nothing left "
            "to train", o->epochs);
  t->loop_start_ms = mpt_time_ms();
  t->loop_start_step = t->global_step;
  for (int64_t e = t->start_epoch; e < o->epochs; e++) {
    MPT_RETURN_IF(run_epoch(t, e, &t->epochs[t->nepochs]));
    t->nepochs++;
    if (t->preempted || t->stopped) break;
  }
  if (o->skip_nonfinite)
    mpt_log(MPT_LOG_INFO, "%" PRId64 " optimizer step(s) skipped for non-finite gradients",
            t->skipped_nonfinite);
  MPT_RETURN_IF(trainer_memory_report(t->comm, "at the end", t->model, t->opt, t->ddp,
                                      t->global_step - t->loop_start_step));
  mpt_step_breakdown bd;
  MPT_RETURN_IF(report_breakdown(t, &bd));
  if (o->save_params[0]) MPT_RETURN_IF(trainer_save_params(t, o->save_params));
  if (t->trace) MPT_RETURN_IF(write_trace(t));
  if (o->metrics_json[0] && t->rank == 0) {
    mpt_run_info info = {o->model,
                         o->batch_size,
                         t->world,
                         o->seed,
                         mpt_optimizer_kind_name(o->optim.kind),
                         o->optim.lr,
                         o->epochs,
                         mpt_launcher_name(mpt_comm_launcher(t->comm)),
                         o->ddp.bucket_cap_mb,
                         o->ddp.overlap,
                         o->accumulate,
                         t->dp ? (t->world > 1 ? "dp+ddp" : "dp")
                               : (t->world > 1 ? "ddp" : "single")};
    MPT_RETURN_IF(mpt_metrics_write_json(o->metrics_json, &info, t->epochs, t->nepochs, &bd));
  }
  return MPT_OK;
}

static void trainer_free(trainer *t) {
  mpt_loader_free(t->train_loader);
  mpt_loader_free(t->test_loader);
  mpt_sampler_free(t->train_sampler);
  mpt_sampler_free(t->test_sampler);
  mpt_dp_free(t->dp);
  mpt_ddp_free(t->ddp);
  mpt_comm_free(t->grad_comm);
  mpt_device_free(t->device, t->dev_x);
  mpt_device_free(t->device, t->dev_y);
  free(t->host_params);
  mpt_optimizer_free(t->opt);
  mpt_tape_free(t->tape);
  mpt_model_free(t->model);
  mpt_dataset_free(&t->train);
  mpt_dataset_free(&t->test);
  mpt_trace_free(t->trace);
  mpt_event_free(t->stop_event);
  for (int i = 0; t->phase_ev && i < t->phase_nev; i++) mpt_event_free(t->phase_ev[i]);
  free(t->phase_ev);
  mpt_stream_free(t->stream);
  free(t->epochs);
}

int mpt_cli_train(const mpt_cli_options *o) {
  trainer t;
  memset(&t, 0, sizeof t);
  t.o = o;
  mpt_comm_config cc = mpt_comm_config_default();
  cc.timeout_ms = o->timeout_s * 1e3;
  cc.check_collectives = o->check_collectives;
  /* The preemption signals are caught from the start: one that arrives during start-up (a
   * loaded machine's MPI_Init can take seconds) stops the run after its first step, exit 75,
   * instead of killing the rank and, with it, the job. Before MPI and every other thread: they
   * inherit the block, and only the preemption thread takes the signals (src/cli/preempt.c). */
  mpt_status pst = mpt_cli_preempt_start();
  if (pst != MPT_OK) {
    fprintf(stderr, "mpitrain: error: %s: %s\n", mpt_status_message(pst), mpt_last_error());
    return 1;
  }
  /* --timeout covers MPI_Init_thread too, with a floor: a short collective deadline must not
   * kill a healthy start-up (a singleton's MPI_Init alone takes about 0.5 s here) */
  trainer_watchdog *wd = NULL;
  mpt_status st = trainer_watchdog_start(o->timeout_s > 10 ? o->timeout_s : 10, &wd);
  if (st == MPT_OK) st = mpt_comm_init(&t.comm, &cc);
  trainer_watchdog_stop(wd);
  if (st != MPT_OK) {
    fprintf(stderr, "mpitrain: error: %s: %s\n", mpt_status_message(st), mpt_last_error());
    mpt_comm_abort(NULL, 1);
  }
  t.rank = mpt_comm_rank(t.comm);
  t.world = mpt_comm_world_size(t.comm);
  st = trainer_log_setup(&t); /* --log-file, --quiet: before anything looks at stderr */
  t.progress = t.rank == 0 && (o->progress == 1 || (o->progress == -1 && isatty(2)));
  if (st == MPT_OK) st = train_run(&t);
  if (st == MPT_OK) st = trainer_log_check(&t);
  if (st != MPT_OK) {
    mpt_log(MPT_LOG_ERROR, "%s: %s", mpt_status_message(st), mpt_last_error());
    trainer_log_failure_note(&t, st);
    if (t.world > 1) {
      mpt_log(MPT_LOG_ERROR, "rank %d failed: aborting the job", t.rank);
      mpt_comm_abort(t.comm, 1);
    }
    trainer_free(&t);
    mpt_comm_free(t.comm);
    mpt_comm_finalize();
    mpt_cli_preempt_stop();
    return 1;
  }
  int preempted = t.preempted;
  trainer_free(&t);
  mpt_comm_free(t.comm);
  mpt_comm_finalize();
  mpt_cli_preempt_stop();
  if (preempted) {
    fprintf(stderr, "mpitrain: preempted (%s): exit status %d\n", stop_signal_name(),
            MPT_EXIT_PREEMPTED);
    return MPT_EXIT_PREEMPTED;
  }
  return 0;
}
