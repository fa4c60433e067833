/* One optimizer step of the loop (trainer.h, "The step"): the micro-batches of the step, each
 * forward + the task's loss + backward on the tape (or mpt_dp_step over DataParallel's
 * replicas), no_sync on all but the last, then the non-finite checks, clipping and the
 * optimizer step, and the phase times for the end-of-run breakdown.
 *
 * Weights: a step trains on its real samples only (the distributed sampler pads the last step
 * of an epoch with repeats when the ranks cannot share the data evenly: those rows are left out
 * of the forward, and a micro-batch of repeats only weighs 0). Micro-batch k holds real_k of
 * the step's R real samples over all ranks (R follows from the positions, resume.c: no
 * collective), and its loss (a mean over its units) is scaled by W real_k / R; the DDP engine
 * divides the sum over the ranks by W, so the step's gradient is that of the mean over the R
 * samples, as one step on the combined batch, whatever the number of ranks that shares them
 * (docs/checkpoints.md). Without padding this is samples_k / S of the rank's S samples.
 *
 * Runs on the training thread; on a GPU the work is enqueued on the compute stream and the step
 * ends with one synchronisation. */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/fault.h"
#include "train/train_impl.h"

void mpt__train_step_group(const mpt__trainer *t, int64_t step, int *kg, int64_t *samples,
                           int64_t *real_global) {
  const int K = t->c.accumulate;
  const int64_t nb = t->batches_per_epoch, first = step * K, per = t->samples_per_batch;
  const int64_t n = t->c.drop_last ? nb * per : mpt_sampler_num_samples(t->train_sampler);
  int64_t k = nb - first < K ? nb - first : K;
  if (k < 0) k = 0;
  const int64_t end = (first + k) * per;
  *kg = (int)k;
  *samples = (end < n ? end : n) - first * per;
  /* this rank's list positions [first per, first per + samples) are the global positions
   * [W first per, W (first per + samples)) of the epoch's order, real below its sample count
   * (drop_last: all real) */
  const int64_t lo = t->world * first * per, hi = t->world * (first * per + *samples);
  const int64_t count = mpt_sampler_dataset_count(t->train_sampler);
  const int64_t real_end = t->c.drop_last || hi < count ? hi : count;
  *real_global = real_end > lo ? real_end - lo : 0;
}

/* MPT_TEST_RECORD_SAMPLES=FILE (fault-injection builds: src/core/fault.h): each rank appends
 * "<global step> <sample index>" for every real sample it trains on to FILE.<rank>, so that a
 * test can compare the samples of each step across runs on different numbers of ranks. */
static void record_samples(const mpt__trainer *t, const mpt_batch *b) {
  const char *v = mpt__test_env("MPT_TEST_RECORD_SAMPLES");
  if (!v || !v[0]) return;
  char path[4200];
  snprintf(path, sizeof path, "%s.%d", v, t->rank);
  FILE *f = fopen(path, "a");
  if (!f) return;
  for (int64_t i = 0; i < b->num_real; i++)
    fprintf(f, "%" PRId64 " %" PRId64 "\n", t->global_step, b->sample_indices[i]);
  fclose(f);
}

/* The first `rows` rows of a task batch (the real ones): the tensors' leading extent cut. */
static void keep_rows(mpt_train_batch *b, int64_t rows) {
  if (rows >= b->rows || b->rows < 1) return;
  mpt_tensor *ts[2] = {&b->input, &b->target};
  for (int i = 0; i < 2; i++) {
    if (ts[i]->ndim < 1 || ts[i]->shape[0] != b->rows) continue;
    ts[i]->count = ts[i]->count / b->rows * rows;
    ts[i]->shape[0] = rows;
  }
  b->rows = rows;
}

mpt_status mpt__train_view(const mpt__trainer *t, const mpt_batch *b, mpt_train_batch *out) {
  if (t->task->batch_view) return t->task->batch_view(t->task->ctx, b, out);
  out->input = b->images;
  out->target = b->labels;
  if (out->target.ndim == 2 && out->target.shape[1] == 1) { /* one label per sample: [rows] */
    out->target.ndim = 1;
  }
  out->rows = b->count;
  out->real_rows = b->num_real;
  return MPT_OK;
}

/* Grows a device allocation to at least `need` bytes (contents are not kept). */
static mpt_status ensure(mpt_device device, void **ptr, size_t *cap, size_t need) {
  if (need <= *cap) return MPT_OK;
  mpt_device_free(device, *ptr);
  *ptr = NULL;
  *cap = 0;
  MPT_RETURN_IF(mpt_device_alloc(device, need, ptr));
  *cap = need;
  return MPT_OK;
}

mpt_status mpt__train_stage(mpt__trainer *t, const mpt_train_batch *b, int64_t rows,
                            mpt_tensor *x, mpt_tensor *y) {
  int64_t xs[MPT_MAX_DIMS], ys[MPT_MAX_DIMS];
  memcpy(xs, b->input.shape, sizeof xs);
  memcpy(ys, b->target.shape, sizeof ys);
  xs[0] = ys[0] = rows;
  const int64_t xrow = b->rows > 0 ? b->input.count / b->rows : 0;
  const int64_t yrow = b->rows > 0 ? b->target.count / b->rows : 0;
  if (t->device.type == MPT_DEVICE_CPU) {
    *x = mpt_tensor_view(b->input.data, b->input.device, b->input.dtype, b->input.ndim, xs);
    *y = mpt_tensor_view(b->target.data, b->target.device, b->target.dtype, b->target.ndim, ys);
    return MPT_OK;
  }
  const size_t xb = (size_t)(rows * xrow) * mpt_dtype_size(b->input.dtype);
  const size_t yb = (size_t)(rows * yrow) * mpt_dtype_size(b->target.dtype);
  MPT_RETURN_IF(ensure(t->device, &t->dev_x, &t->dev_x_nbytes, xb ? xb : 1));
  MPT_RETURN_IF(ensure(t->device, &t->dev_y, &t->dev_y_nbytes, yb ? yb : 1));
  MPT_RETURN_IF(mpt_op_memcpy(t->stream, t->device, t->dev_x, mpt_device_cpu(), b->input.data,
                              xb));
  MPT_RETURN_IF(mpt_op_memcpy(t->stream, t->device, t->dev_y, mpt_device_cpu(),
                              b->target.data, yb));
  *x = mpt_tensor_view(t->dev_x, t->device, b->input.dtype, b->input.ndim, xs);
  *y = mpt_tensor_view(t->dev_y, t->device, b->target.dtype, b->target.ndim, ys);
  return MPT_OK;
}

mpt_status mpt__train_phase_events_init(mpt__trainer *t) {
  t->phase_nev = 3 * t->c.accumulate + 2;
  t->phase_ev = calloc((size_t)t->phase_nev, sizeof *t->phase_ev);
  if (!t->phase_ev) return MPT_FAIL(MPT_ENOMEM, "cannot allocate the phase timers");
  for (int i = 0; i < t->phase_nev; i++) MPT_RETURN_IF(mpt_event_init(&t->phase_ev[i], t->device));
  return MPT_OK;
}

static mpt_status phase_mark(mpt__trainer *t, int i) {
  return t->phase_ev && !t->dp ? mpt_event_record(t->phase_ev[i], t->stream) : MPT_OK;
}

/* After the step's synchronisation: device times of forward, backward and optimizer. */
static mpt_status phase_times(mpt__trainer *t, int K, double *fwd, double *bwd, double *opt) {
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

/* A non-finite loss: an error naming the step, unless skip_nonfinite (the step is skipped). */
static mpt_status nonfinite_loss(mpt__trainer *t, float *l, int k) {
  if (isfinite(*l)) return MPT_OK;
  if (!t->c.skip_nonfinite)
    return MPT_FAIL(MPT_ENONFINITE, "non-finite loss %g at step %" PRId64 " (micro-batch %d) on "
                    "rank %d (--skip-nonfinite skips such steps)", (double)*l, t->global_step + 1, k,
                    t->rank);
  t->step_nonfinite = 1;
  *l = 0;
  return MPT_OK;
}

/* Micro-batch k of the step (forward, loss, backward), on the tape or through DataParallel. */
static mpt_status micro_batch(mpt__trainer *t, mpt_train_batch *b, int k, int K, float share,
                              double *sums, double *fwd, double *bwd) {
  const mpt_train_task *task = t->task;
  const uint64_t seed = t->c.seed * 1000003u + (uint64_t)t->global_step * 131u + (uint64_t)k +
                        (uint64_t)t->rank * 7919u;
  const double f0 = mpt_time_ms();
  mpt__train_maybe_poison(t, b, k);
  float l = 0;
  double metric = 0;
  if (t->dp) { /* forward + loss + backward on every device, reduced onto the first */
    /* DDP synchronises buffers before each training forward it sees; DataParallel's replicas
     * run theirs, so the buffers are synchronised here for them */
    if (t->ddp) MPT_RETURN_IF(mpt_ddp_sync_buffers(t->ddp));
    MPT_RETURN_IF(mpt_dp_step(t->dp, &b->input, &b->target, share, seed, &l, NULL));
    if (task->metric)
      MPT_RETURN_IF(task->metric(task->ctx, t->stream, mpt_dp_output(t->dp), &b->target,
                                 b->rows, &metric));
    MPT_RETURN_IF(nonfinite_loss(t, &l, k));
    *fwd += mpt_time_ms() - f0; /* DP: forward and backward together */
  } else {
    mpt_tensor x, y;
    mpt_var *in, *out, *loss;
    MPT_RETURN_IF(phase_mark(t, 3 * k));
    mpt_tape_reset(t->tape, seed);
    MPT_RETURN_IF(mpt__train_stage(t, b, b->rows, &x, &y));
    MPT_RETURN_IF(mpt_tape_input(t->tape, &x, &in));
    MPT_RETURN_IF(mpt_model_forward(t->model, t->tape, in, &out));
    MPT_RETURN_IF(task->loss(task->ctx, t->tape, out, &y, &loss));
    MPT_RETURN_IF(mpt_var_item(t->tape, loss, &l)); /* synchronises a GPU's stream */
    mpt__train_maybe_slow(t, mpt_time_ms() - f0);
    MPT_RETURN_IF(nonfinite_loss(t, &l, k));
    if (task->metric)
      MPT_RETURN_IF(task->metric(task->ctx, t->stream, mpt_var_value(out), &y, b->rows, &metric));
    const double f1 = mpt_time_ms();
    MPT_RETURN_IF(phase_mark(t, 3 * k + 1));
    if (t->trace) mpt_trace_add(t->trace, "forward", 0, f0, f1 - f0, t->global_step);
    if (t->ddp) mpt_ddp_set_sync(t->ddp, k == K - 1); /* no_sync but for the last */
    /* with DDP, backward returns with the gradients averaged over the ranks */
    MPT_RETURN_IF(mpt_tape_backward(t->tape, loss, share));
    const double b1 = mpt_time_ms();
    MPT_RETURN_IF(phase_mark(t, 3 * k + 2));
    if (t->trace) mpt_trace_add(t->trace, "backward", 0, f1, b1 - f1, t->global_step);
    *fwd += f1 - f0;
    *bwd += b1 - f1;
  }
  const double real = (double)b->real_rows; /* a micro-batch of repeats counts nothing */
  sums[0] += (double)l * real;
  sums[1] += b->real_rows > 0 ? metric : 0;
  sums[2] += real;
  t->log_loss_rows += (double)l * real;
  t->log_rows += real;
  return MPT_OK;
}

/* Clipping, the non-finite decision and the optimizer step, after the gradients are final. */
static mpt_status update(mpt__trainer *t) {
  const mpt_trainer_config *c = &t->c;
  int skip = 0;
  t->last_norm = NAN;
  if (c->grad_clip > 0) {
    float norm = NAN;
    MPT_RETURN_IF(t->ddp ? mpt_ddp_clip_grad_norm(t->ddp, t->stream, (float)c->grad_clip, &norm)
                         : mpt_clip_grad_norm(t->model, t->stream, (float)c->grad_clip, &norm));
    t->last_norm = norm;
    if (!isfinite(norm) && !c->skip_nonfinite)
      return MPT_FAIL(MPT_ENONFINITE, "step %" PRId64 ": the gradient norm is %g on rank %d "
                      "(--skip-nonfinite skips such steps)", t->global_step + 1, (double)norm,
                      t->rank);
    skip = !isfinite(norm);
  }
  if (c->skip_nonfinite && !skip) {
    /* The gradients are averaged over ranks and bit-identical everywhere, and NaN/Inf survive
     * the average: every rank takes the same decision without another collective. */
    int nonfinite = 0;
    MPT_RETURN_IF(t->ddp ? mpt_ddp_grads_nonfinite(t->ddp, t->stream, &nonfinite)
                         : mpt_op_check_finite(t->stream, mpt_model_grads(t->model),
                                               mpt_model_param_count(t->model), &nonfinite));
    skip = nonfinite || (t->world == 1 && t->step_nonfinite);
  }
  t->step_nonfinite = 0;
  t->consecutive_skipped = skip ? t->consecutive_skipped + 1 : 0;
  if (skip) {
    t->skipped_nonfinite++;
    mpt_log(MPT_LOG_WARN, "step %" PRId64 ": non-finite gradients, optimizer step skipped (%"
            PRId64 " so far)", t->global_step + 1, t->skipped_nonfinite);
    MPT_RETURN_IF(mpt_model_consume_grads(t->model)); /* skipped on purpose */
    /* every step, not only when a checkpoint is due: 3 skips in a row stop the run */
    return mpt__train_check_model_healthy(t, "after a skipped step", t->global_step + 1);
  }
  const float lr = mpt_lr_at(&t->schedule, c->optim.lr, t->global_step);
  return t->ddp ? mpt_ddp_optimizer_step(t->ddp, t->opt, t->stream, lr) /* ZeRO */
                : mpt_optimizer_step_model(t->opt, t->model, t->stream, lr);
}

mpt_status mpt__train_step(mpt__trainer *t, int64_t step, double *sums, int *ran_out) {
  const mpt_trainer_config *c = &t->c;
  int K;
  int64_t group, real_global;
  mpt__train_step_group(t, step, &K, &group, &real_global);
  const double t0 = mpt_time_ms();
  double fwd = 0, bwd = 0;
  *ran_out = 0;
  if (K < 1 || group < 1 || real_global < 1) {
    *ran_out = 1;
    return MPT_OK;
  }
  int64_t calls0 = 0;
  double ms0 = 0, flop0 = 0;
  if (c->profile) mpt_op_gemm_counted(&calls0, &ms0, &flop0);
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
                      "the step's %d micro-batches on rank %d", t->global_step + 1, k, K, t->rank);
    }
    record_samples(t, &b);
    mpt_train_batch tb;
    MPT_RETURN_IF(mpt__train_view(t, &b, &tb));
    /* the real rows only; a micro-batch of repeats runs whole (every rank's backward takes
     * part in the gradient collectives) with the weight 0 */
    if (tb.real_rows > 0) keep_rows(&tb, tb.real_rows);
    /* this micro-batch's share of the step's mean loss over its real samples, all ranks' */
    const float share = (float)((double)t->world * (double)b.num_real / (double)real_global);
    MPT_RETURN_IF(micro_batch(t, &tb, k, K, share, sums, &fwd, &bwd));
  }
  if (t->dp && t->ddp) { /* hybrid: each rank's DP-reduced gradients, averaged over ranks */
    const double c0 = mpt_time_ms();
    MPT_RETURN_IF(mpt_ddp_allreduce_grads(t->ddp));
    t->sum_dp_allreduce += mpt_time_ms() - c0;
  }
  const double o0 = mpt_time_ms();
  MPT_RETURN_IF(phase_mark(t, 3 * K));
  mpt_comm_set_purpose(t->comm, "optimizer"); /* clipping norm, ZeRO-1's all-gathers */
  MPT_RETURN_IF(update(t));
  MPT_RETURN_IF(phase_mark(t, 3 * K + 1));
  MPT_RETURN_IF(mpt_stream_synchronize(t->stream, c->timeout_s * 1e3));
  if (t->grad_comm && mpt_comm_error(t->grad_comm) != MPT_OK)
    return MPT_FAIL(mpt_comm_error(t->grad_comm),
                    "the gradient all-reduce failed on rank %d (see the error above)", t->rank);
  const double o1 = mpt_time_ms();
  double opt = o1 - o0;
  MPT_RETURN_IF(phase_times(t, K, &fwd, &bwd, &opt));
  if (t->trace) mpt_trace_add(t->trace, "optimizer", 0, o0, o1 - o0, t->global_step);
  t->sum_forward += fwd;
  t->sum_backward += bwd;
  t->sum_optimizer += opt;
  t->sum_total += o1 - t0;
  t->timed_steps++;
  if (c->profile && t->global_step == t->loop_start_step) {
    mpt_tape_clear_op_times(t->tape); /* the first step (arena growth, page faults): not timed */
  } else if (c->profile) {
    int64_t calls1 = 0;
    double ms1 = 0, flop1 = 0;
    mpt_op_gemm_counted(&calls1, &ms1, &flop1);
    t->prof_ms += o1 - t0;
    t->prof_steps++;
    t->gemm_calls += calls1 - calls0;
    t->gemm_ms += ms1 - ms0;
    t->gemm_flop += flop1 - flop0;
  }
  t->global_step++;
  t->log_steps++;
  return MPT_OK;
}
