/* mpt_trainer_run (trainer.h): the set-up of a run (checks, threads, DDP or DataParallel, the
 * optimizer and its groups, samplers and loaders, the schedule, the trace, resume), the epochs,
 * and what the run leaves behind (reports, parameters, metrics, trace). The step is step.c,
 * evaluation eval.c, checkpoints ckpt.c, the ranks' checks checks.c, the output report.c.
 *
 * Failure: every error returns through here with the rank's detail in mpt_last_error(); the
 * caller decides whether to abort the job (a program: mpt_comm_abort, so that no rank waits
 * for one that stopped). Runs on the calling thread; collective over the comm. */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "train/train_impl.h"

mpt_trainer_config mpt_trainer_config_default(void) {
  mpt_trainer_config c;
  memset(&c, 0, sizeof c);
  c.epochs = 1;
  c.batch_size = 64;
  c.accumulate = 1;
  c.shuffle = 1;
  c.seed = 1;
  c.optim = mpt_optimizer_config_default();
  c.schedule = mpt_lr_schedule_default();
  c.schedule.step_size = 0;
  c.ddp = mpt_ddp_config_default();
  c.precision = MPT_PRECISION_FP32;
  c.timeout_s = 300;
  c.keep = 3;
  c.handle_signals = 1;
  c.progress = -1;
  c.progress_interval_s = 30;
  c.model_name = "model";
  c.straggler_warn = 1.2;
  return c;
}

static int empty(const char *s) { return !s || !s[0]; }

mpt_status mpt_trainer_device(mpt_comm *comm, const char *device, mpt_device *out) {
  if (!comm || !out) return MPT_FAIL(MPT_EINVAL, "mpt_trainer_device: NULL argument");
  *out = mpt_device_cpu();
  if (!empty(device) && strcmp(device, "cpu") != 0 && strcmp(device, "cuda") != 0)
    return MPT_FAIL(MPT_EINVAL, "device '%s': expected cpu or cuda", device);
  if (!empty(device) && strcmp(device, "cuda") == 0 && !mpt_device_available(MPT_DEVICE_CUDA))
    return MPT_FAIL(MPT_ENOTSUP, "--device cuda: no CUDA device is visible to this process (or "
                                 "the build has no CUDA backend: configure --with-cuda)");
  int32_t use_cuda = !empty(device) ? strcmp(device, "cuda") == 0
                                    : mpt_device_available(MPT_DEVICE_CUDA);
  /* collective: every rank takes the same branch (a GPU on some hosts only: the CPU) */
  if (empty(device) && mpt_comm_world_size(comm) > 1)
    MPT_RETURN_IF(mpt_comm_allreduce_sync(comm, &use_cuda, &use_cuda, 1, MPT_I32,
                                          MPT_REDUCE_MIN));
  if (!use_cuda) return MPT_OK;
  return mpt_comm_bind_device(comm, MPT_DEVICE_CUDA, -1, out);
}

/* The config as the loop uses it: NULL strings as "", defaults for what must be set. */
static mpt_status config_check(const mpt_trainer_config *in, const mpt_train_task *task,
                               mpt_trainer_config *c) {
  *c = *in;
  const char **s[] = {&c->dp_devices, &c->checkpoint_dir, &c->resume, &c->log_file,
                      &c->metrics_json, &c->trace, &c->save_params, &c->run_options,
                      &c->input_paths, &c->debug_dir, &c->gemm_cache};
  for (size_t i = 0; i < sizeof s / sizeof s[0]; i++)
    if (!*s[i]) *s[i] = "";
  if (empty(c->model_name)) c->model_name = "model";
  if (empty(c->debug_dir)) c->debug_dir = !empty(c->checkpoint_dir) ? c->checkpoint_dir
                                                                    : "mpitrain-debug";
  if (c->epochs < 1 || c->batch_size < 0 || c->accumulate < 0 || c->max_steps < 0 ||
      c->keep < 1 || !(c->timeout_s > 0) || c->eval_every < 0 || c->eval_max_batches < 0 ||
      c->checkpoint_every < 0 || c->stop_at_step < 0 || c->check_replicas < 0 ||
      c->log_every < 0 || c->threads < 0 || !(c->grad_clip >= 0) ||
      !(c->straggler_warn >= 1) || !isfinite(c->straggler_warn))
    return MPT_FAIL(MPT_EINVAL, "trainer config: a count or limit out of range (epochs %" PRId64
                    ", batch %" PRId64 ", accumulate %d, keep %d, timeout %g s, grad_clip %g)",
                    c->epochs, c->batch_size, c->accumulate, c->keep, c->timeout_s,
                    c->grad_clip);
  if (!task || !task->train || !task->loss)
    return MPT_FAIL(MPT_EINVAL, "trainer: the task needs training data and a loss");
  if (strcmp(c->resume, "auto") == 0 && empty(c->checkpoint_dir))
    return MPT_FAIL(MPT_EINVAL, "--resume auto needs --checkpoint-dir (the directory to resume "
                    "from)");
  if (!empty(c->dp_devices) && c->ddp.zero)
    return MPT_FAIL(MPT_EINVAL, "--zero %d does not work with DataParallel (--mode dp steps the "
                    "whole model in each rank): use --mode ddp", c->ddp.zero);
  c->ddp.timeout_ms = c->timeout_s * 1e3;
  return mpt_optimizer_config_validate(&c->optim);
}

/* Rank 0, before anything is written: the output files can be written and are none of the
 * inputs, the checkpoint folder belongs to this run, run-options.txt agrees with a resume. */
static mpt_status check_outputs(mpt__trainer *t) {
  const mpt_trainer_config *c = &t->c;
  const char *names[3] = {"--save-params", "--metrics-json", "--trace"};
  const char *paths[3] = {c->save_params, c->metrics_json, c->trace};
  for (int i = 0; i < 3; i++)
    if (paths[i][0]) MPT_RETURN_IF(mpt_trainer_check_output_path(names[i], paths[i]));
  MPT_RETURN_IF(mpt__train_check_outputs(t));
  if (c->checkpoint_dir[0]) MPT_RETURN_IF(mpt__train_check_checkpoint_dir(c));
  if (c->checkpoint_dir[0] || c->resume[0]) MPT_RETURN_IF(mpt__train_check_run_options(t));
  return MPT_OK;
}

/* The optimizer (through the DDP engine with several ranks: a shard with ZeRO-1), with weight
 * decay on the >= 2-D weights only when asked (llm.c, nanoGPT), and its line in the log. */
static mpt_status make_optimizer(mpt__trainer *t) {
  const mpt_trainer_config *c = &t->c;
  if (t->ddp)
    MPT_RETURN_IF(mpt_ddp_optimizer_init(t->ddp, &t->opt, &c->optim, t->device));
  else
    MPT_RETURN_IF(mpt_optimizer_init(&t->opt, &c->optim, t->device,
                                     mpt_model_param_count(t->model)));
  const int64_t count = mpt_model_param_count(t->model);
  int64_t decayed = c->optim.weight_decay > 0 ? count : 0;
  if (c->no_decay_bias_norm) {
    int n = 0;
    MPT_RETURN_IF(mpt_param_groups_split_decay(t->model, c->optim.weight_decay, NULL, 0, &n));
    mpt_param_group *groups = malloc(sizeof *groups * (size_t)(n ? n : 1));
    if (!groups) return MPT_FAIL(MPT_ENOMEM, "%d parameter groups", n);
    mpt_status st = mpt_param_groups_split_decay(t->model, c->optim.weight_decay, groups, n, &n);
    if (st == MPT_OK) st = mpt_optimizer_set_groups(t->opt, groups, n);
    free(groups);
    MPT_RETURN_IF(st);
    decayed = 0;
    for (int i = 0; i < mpt_optimizer_num_groups(t->opt); i++)
      if (mpt_optimizer_group(t->opt, i)->weight_decay > 0)
        decayed += mpt_optimizer_group(t->opt, i)->count;
  }
  const mpt_optimizer_config *oc = &c->optim;
  char detail[128], clip[48] = "off";
  if (c->grad_clip > 0) snprintf(clip, sizeof clip, "at norm %g", c->grad_clip);
  if (oc->kind == MPT_OPTIM_SGD)
    snprintf(detail, sizeof detail, "%smomentum %g", oc->nesterov ? "Nesterov " : "",
             (double)oc->momentum);
  else
    snprintf(detail, sizeof detail, "betas (%g, %g), eps %g", (double)oc->beta1,
             (double)oc->beta2, (double)oc->eps);
  mpt_log(MPT_LOG_INFO, "optimizer %s: lr %g, %s, weight decay %g on %" PRId64 " parameters%s, "
          "none on %" PRId64 "; gradient clipping %s", mpt_optimizer_kind_name(oc->kind),
          (double)oc->lr, detail, (double)oc->weight_decay, decayed,
          c->no_decay_bias_norm ? " (>= 2-D)" : "", count - decayed, clip);
  return MPT_OK;
}

static mpt_status make_loaders(mpt__trainer *t) {
  const mpt_trainer_config *c = &t->c;
  const mpt_train_task *task = t->task;
  mpt_sampler_config sc = mpt_sampler_config_default();
  sc.num_replicas = t->world;
  sc.rank = t->rank;
  sc.shuffle = c->shuffle;
  sc.seed = c->seed;
  sc.drop_last = c->drop_last;
  mpt_loader_config lc = mpt_loader_config_default();
  lc.batch_size = t->samples_per_batch;
  lc.drop_last = c->drop_last;
  lc.timeout_ms = c->timeout_s * 1e3;
  const int64_t n = mpt_data_source_get_desc(task->train)->count;
  MPT_RETURN_IF(mpt_sampler_init(&t->train_sampler, n, &sc));
  MPT_RETURN_IF(mpt_loader_init_source(&t->train_loader, task->train, t->train_sampler, &lc));
  t->batches_per_epoch = mpt_loader_num_batches(t->train_loader);
  if (!task->eval) return MPT_OK;
  /* evaluation: every sample exactly once over the ranks, in order (padding rows skipped) */
  sc.shuffle = 0;
  sc.drop_last = 0;
  lc.batch_size = task->samples_per_batch > 0 ? task->samples_per_batch : MPT__TRAIN_EVAL_ROWS;
  lc.drop_last = 0;
  lc.prefetch = task->samples_per_batch > 0 ? 0 : 1; /* a few windows: no thread */
  MPT_RETURN_IF(mpt_sampler_init(&t->eval_sampler, mpt_data_source_get_desc(task->eval)->count,
                                 &sc));
  return mpt_loader_init_source(&t->eval_loader, task->eval, t->eval_sampler, &lc);
}

/* Steps per epoch (the last step takes the micro-batches left), the run's length and the
 * schedule's fields that depend on it. */
static mpt_status plan_steps(mpt__trainer *t) {
  const mpt_trainer_config *c = &t->c;
  const int64_t nb = t->batches_per_epoch;
  t->steps_per_epoch = (nb + c->accumulate - 1) / c->accumulate;
  if (t->steps_per_epoch < 1)
    return MPT_FAIL(MPT_EINVAL, "an epoch has no micro-batch of %" PRId64 " sample(s) on this "
                    "rank (%" PRId64 " sample(s) in the data, %d rank(s)%s): nothing to train; "
                    "give more data, a smaller batch, or fewer ranks", t->samples_per_batch,
                    mpt_data_source_get_desc(t->task->train)->count, t->world,
                    c->drop_last ? ", --drop-last" : "");
  if (c->max_steps > t->steps_per_epoch && t->rank == 0)
    mpt_log(MPT_LOG_WARN, "--max-steps %" PRId64 " is more than the %" PRId64 " steps of an "
            "epoch: each of the %" PRId64 " epoch(s) runs its %" PRId64 " steps", c->max_steps,
            t->steps_per_epoch, c->epochs, t->steps_per_epoch);
  if (c->max_steps > 0 && c->max_steps < t->steps_per_epoch) t->steps_per_epoch = c->max_steps;
  t->total_steps = t->steps_per_epoch * c->epochs;
  mpt_lr_schedule *s = &t->schedule;
  *s = c->schedule;
  if (s->step_size <= 0) s->step_size = t->steps_per_epoch;
  s->total_steps = t->total_steps;
  if (s->kind == MPT_LR_COSINE && s->total_steps <= s->warmup_steps) {
    if (t->rank == 0)
      mpt_log(MPT_LOG_WARN, "--warmup-steps %" PRId64 " is not below the run's %" PRId64
              " steps: the warm-up takes %" PRId64, s->warmup_steps, t->total_steps,
              t->total_steps - 1);
    s->warmup_steps = t->total_steps - 1;
  }
  if (t->c.profile && t->total_steps < 2 && t->rank == 0)
    mpt_log(MPT_LOG_WARN, "--profile times the steps after the first, and this run takes %"
            PRId64 ": give --max-steps 2 or more for a table", t->total_steps);
  return mpt_lr_schedule_validate(s);
}

static mpt_status make_trace(mpt__trainer *t) {
  const mpt_trainer_config *c = &t->c;
  const int ndev = t->dp ? mpt_dp_num_devices(t->dp) : 1;
  /* per step: forward, backward (per micro-batch), optimizer, buckets; DP: per micro-batch a
   * broadcast, and per device forward, backward, gather and reduce */
  int64_t cap = t->total_steps * (3 * c->accumulate + 2 +
                                  (t->ddp ? mpt_ddp_num_buckets(t->ddp) : 0) +
                                  (t->dp ? c->accumulate * (1 + 4 * ndev) : 0));
  if (cap > 2000000) cap = 2000000;
  MPT_RETURN_IF(mpt_trace_init(&t->trace, t->rank, cap < 16 ? 16 : cap));
  if (t->ddp) mpt_ddp_set_trace(t->ddp, t->trace);
  if (t->dp) mpt_dp_set_trace(t->dp, t->trace);
  return MPT_OK;
}

/* DataParallel's replicas train with the task's loss; its configuration from ours. */
static mpt_status make_dp(mpt__trainer *t) {
  mpt_device devices[MPT_DP_MAX_DEVICES];
  int ndev = 0;
  MPT_RETURN_IF(mpt_dp_parse_devices(t->c.dp_devices, devices, MPT_DP_MAX_DEVICES, &ndev));
  char a[32], b[32];
  if (devices[0].type != t->device.type || devices[0].index != t->device.index)
    return MPT_FAIL(MPT_EINVAL, "--devices %s: the first device must be the model's (%s), got %s",
                    t->c.dp_devices, mpt_device_str(t->device, a, sizeof a),
                    mpt_device_str(devices[0], b, sizeof b));
  mpt_dp_config pc = mpt_dp_config_default();
  pc.timeout_ms = t->c.timeout_s * 1e3;
  pc.precision = t->c.precision;
  pc.loss = t->task->loss;
  pc.loss_ctx = t->task->ctx;
  pc.gather_outputs = t->task->metric != NULL; /* the output only feeds the metric */
  return mpt_dp_init(&t->dp, t->model, devices, ndev, t->stream, &pc);
}

/* Every rank's set-up, in the order the checks cost: options, outputs, data, then memory. */
static mpt_status setup(mpt__trainer *t) {
  const mpt_trainer_config *c = &t->c;
  MPT_RETURN_IF(mpt_comm_set_debug_dir(t->comm, c->debug_dir));
  mpt__train_set_dump_comm(t->comm);
  mpt__train_catch_fatal();
  mpt_comm_set_step(t->comm, -1);
  MPT_RETURN_IF(mpt_comm_set_purpose(t->comm, "setup"));
  if (c->argc > 0) MPT_RETURN_IF(mpt__train_check_same_options(t->comm, c->argc, c->argv));
  /* which checkpoint, and the batch and accumulation that keep its global batch */
  MPT_RETURN_IF(mpt_trainer_plan_resume(t->comm, &t->c, t->task->samples_per_batch,
                                        mpt_trainer_config_default().batch_size,
                                        &t->resume_meta, &t->resuming));
  t->samples_per_batch = t->task->samples_per_batch > 0 ? t->task->samples_per_batch
                                                         : c->batch_size;
  t->global_batch = (int64_t)t->world * t->samples_per_batch * c->accumulate;
  MPT_RETURN_IF(mpt__train_check_resume_fit(t));
  if (t->rank == 0) MPT_RETURN_IF(check_outputs(t));
  t->threads = c->threads ? c->threads
                          : mpt_cpu_threads_per_rank(mpt_comm_local_size(t->comm),
                                                     empty(c->dp_devices) ? 1 : 2);
  if (!empty(c->dp_devices)) { /* the host's cores shared by every rank's devices */
    mpt_device devs[MPT_DP_MAX_DEVICES];
    int nd = 1;
    MPT_RETURN_IF(mpt_dp_parse_devices(c->dp_devices, devs, MPT_DP_MAX_DEVICES, &nd));
    if (!c->threads) t->threads = mpt_cpu_threads_per_rank(mpt_comm_local_size(t->comm), nd);
  }
  MPT_RETURN_IF(mpt_cpu_set_threads(t->threads));
  MPT_RETURN_IF(mpt__train_gemm_tune_begin(t)); /* --gemm tune: the cache, and recording */
  t->device = mpt_model_device(t->model);
  MPT_RETURN_IF(mpt_stream_init(&t->stream, t->device, MPT_STREAM_INLINE));
  if (t->device.type != MPT_DEVICE_CPU) MPT_RETURN_IF(mpt__train_phase_events_init(t));
  MPT_RETURN_IF(mpt_event_init(&t->stop_event, mpt_device_cpu()));
  if (t->task->check) MPT_RETURN_IF(t->task->check(t->task->ctx, t->comm, c, t->model));
  MPT_RETURN_IF(mpt_tape_init(&t->tape, t->model, t->stream));
  if (c->precision != MPT_PRECISION_FP32) {
    MPT_RETURN_IF(mpt_tape_set_precision(t->tape, c->precision));
    mpt_log(MPT_LOG_INFO, "precision %s: GEMMs and convolutions take bf16 inputs and accumulate "
            "in fp32; parameters, gradients and the optimizer stay fp32",
            mpt_precision_name(c->precision));
  }
  mpt_tape_set_recompute(t->tape, c->recompute);
  if (c->profile) {
    MPT_RETURN_IF(mpt_tape_set_profiling(t->tape, 1));
    mpt_op_gemm_counting(1);
  }
  if (t->world > 1) {
    mpt_comm *gc = t->comm;
    if (t->device.type != MPT_DEVICE_CPU) { /* gradients stay on the GPU: NCCL, else MPI */
      mpt_comm_config cc = mpt_comm_config_default();
      cc.backend = MPT_COMM_BACKEND_NCCL;
      cc.device = t->device;
      cc.timeout_ms = c->timeout_s * 1e3;
      cc.check_collectives = c->check_collectives;
      cc.configure_log = 0;
      mpt_status st = mpt_comm_init(&t->grad_comm, &cc);
      if (st == MPT_ENOTSUP) {
        mpt_log(MPT_LOG_WARN, "NCCL is not available (%s): gradients go through MPI, staged "
                "in host memory", mpt_last_error());
        cc.backend = MPT_COMM_BACKEND_MPI;
        st = mpt_comm_init(&t->grad_comm, &cc);
      }
      MPT_RETURN_IF(st);
      gc = t->grad_comm;
    }
    MPT_RETURN_IF(mpt_ddp_init(&t->ddp, t->model, gc, t->stream, &c->ddp));
  }
  if (!empty(c->dp_devices)) MPT_RETURN_IF(make_dp(t));
  MPT_RETURN_IF(make_optimizer(t));
  MPT_RETURN_IF(make_loaders(t));
  if (t->ddp) MPT_RETURN_IF(mpt_ddp_check_batches(t->ddp, t->batches_per_epoch));
  MPT_RETURN_IF(plan_steps(t));
  if (c->trace[0]) MPT_RETURN_IF(make_trace(t));
  mpt__train_log_start(t);
  MPT_RETURN_IF(mpt__train_memory_report(t, "at start", 0));
  t->epochs = calloc((size_t)c->epochs, sizeof *t->epochs);
  if (!t->epochs) return MPT_FAIL(MPT_ENOMEM, "cannot allocate the epochs' metrics");
  if (c->resume[0]) MPT_RETURN_IF(mpt__train_resume(t));
  return MPT_OK;
}

/* An evaluation, and its line: "step N  test loss L  acc A" (a language model: "val loss L
 * nats/token"), at the start, every eval_every steps and at each epoch's end. */
static mpt_status eval_line(mpt__trainer *t) {
  if (!t->task->eval) return MPT_OK;
  mpt_comm_set_purpose(t->comm, "eval");
  if (t->ddp) MPT_RETURN_IF(mpt_ddp_gather_params(t->ddp)); /* ZeRO-3: whole before evaluating */
  MPT_RETURN_IF(mpt__train_evaluate(t));
  char metric[48] = "";
  if (t->task->metric)
    snprintf(metric, sizeof metric, "  %s %.4f", t->task->metric_name ? t->task->metric_name
                                                                       : "metric",
             t->eval_metric);
  mpt_log(MPT_LOG_INFO, "step %6" PRId64 "  %s loss %.4f%s%s%s", t->global_step,
          t->task->eval_name ? t->task->eval_name : "eval", t->eval_loss,
          t->task->loss_unit ? " " : "", t->task->loss_unit ? t->task->loss_unit : "", metric);
  return MPT_OK;
}

/* The end of an epoch's steps: the epoch's figures over all ranks, evaluation (not after an
 * interruption: the time may be short), the epoch line, the health checks, a checkpoint. */
static mpt_status end_epoch(mpt__trainer *t, int64_t epoch, int64_t step, double *sums,
                            double e0_ms, double train_ms) {
  const mpt_trainer_config *c = &t->c;
  mpt__epoch_metrics *m = &t->epochs[t->nepochs++];
  mpt_comm_set_purpose(t->comm, "epoch end");
  float f[3] = {(float)sums[0], (float)sums[1], (float)sums[2]};
  MPT_RETURN_IF(mpt__train_sum(t, f, 3));
  m->epoch = epoch + 1;
  m->steps = step;
  m->lr_first = mpt_lr_at(&t->schedule, c->optim.lr, epoch * t->steps_per_epoch);
  m->lr_last = mpt_lr_at(&t->schedule, c->optim.lr, t->global_step > 0 ? t->global_step - 1 : 0);
  m->train_loss = f[2] > 0 ? f[0] / f[2] : NAN;
  m->train_metric = f[2] > 0 && t->task->metric ? f[1] / f[2] : NAN;
  m->units_per_s = train_ms > 0 ? f[2] * (double)t->task->units_per_row / (train_ms / 1e3) : 0;
  m->eval_loss = m->eval_metric = NAN;
  const char *mname = t->task->metric_name ? t->task->metric_name : "";
  char tm[48] = "";
  if (t->task->metric) snprintf(tm, sizeof tm, "  %s %.4f", mname, m->train_metric);
  const char *unit = t->task->unit ? t->task->unit : "samples";
  if (t->preempted || t->stopped) {
    m->seconds = (mpt_time_ms() - e0_ms) / 1e3;
    mpt_log(MPT_LOG_INFO, "epoch %3" PRId64 "/%" PRId64 "  interrupted after step %" PRId64
            "  train loss %.4f%s  %8.0f %s/s", m->epoch, c->epochs, step, m->train_loss, tm,
            m->units_per_s, unit);
    return MPT_OK;
  }
  char ev[96] = "";
  if (t->task->eval) {
    MPT_RETURN_IF(eval_line(t));
    m->eval_loss = t->eval_loss;
    m->eval_metric = t->eval_metric;
    int used = snprintf(ev, sizeof ev, "  %s loss %.4f", t->task->eval_name ? t->task->eval_name
                                                                             : "eval",
                        m->eval_loss);
    if (t->task->metric && used > 0)
      snprintf(ev + used, sizeof ev - (size_t)used, "  %s %.4f", mname, m->eval_metric);
  }
  m->seconds = (mpt_time_ms() - e0_ms) / 1e3;
  mpt_log(MPT_LOG_INFO, "epoch %3" PRId64 "/%" PRId64 "  train loss %.4f%s%s  %8.0f %s/s  %6.1f s",
          m->epoch, c->epochs, m->train_loss, tm, ev, m->units_per_s, unit, m->seconds);
  MPT_RETURN_IF(mpt__train_check_model_healthy(t, "at the end of the epoch", t->global_step));
  if (t->task->eval && !isfinite(m->eval_loss))
    return MPT_FAIL(MPT_ENONFINITE, "the %s loss is %g at the end of epoch %" PRId64 " (global "
                    "step %" PRId64 ", %" PRId64 " step(s) skipped for non-finite gradients): the "
                    "model no longer computes finite outputs; the learning rate %g is probably "
                    "too high", t->task->eval_name ? t->task->eval_name : "evaluation",
                    m->eval_loss, m->epoch, t->global_step, t->skipped_nonfinite,
                    (double)c->optim.lr);
  if (c->checkpoint_dir[0] && c->checkpoint_every == 0) {
    double k0 = mpt_time_ms();
    MPT_RETURN_IF(mpt__train_save_checkpoint(t, epoch + 1, 0));
    t->train_ms -= mpt_time_ms() - k0;
  }
  return MPT_OK;
}

static mpt_status run_epoch(mpt__trainer *t, int64_t epoch) {
  const mpt_trainer_config *c = &t->c;
  const double e0 = mpt_time_ms();
  double train_ms = 0;
  MPT_RETURN_IF(mpt__train_check_epoch(t, epoch));
  MPT_RETURN_IF(mpt_loader_start_epoch(t->train_loader, epoch));
  /* loss x rows, metric, rows: in double (in float, 100000 steps of batch 1 that each have the
   * loss 3.1510 averaged 3.1536: faults.md F44), rounded to float once for the all-reduce */
  double sums[3] = {0, 0, 0};
  int64_t step = 0;
  if (t->skip_steps > 0) { /* resume mid-epoch: skip the micro-batches an unbroken run used */
    mpt_batch b;
    for (int64_t i = 0; i < t->skip_steps * c->accumulate; i++) {
      int r = mpt_loader_next(t->train_loader, &b);
      if (r < 0) return (mpt_status)r;
    }
    step = t->skip_steps;
    t->skip_steps = 0;
  }
  for (; step < t->steps_per_epoch; step++) {
    int ran_out = 0;
    const double s0 = mpt_time_ms();
    mpt__train_maybe_kill_self(t);
    mpt__train_maybe_stop_self(t);
    if (mpt__train_maybe_skip_step(t)) continue; /* fault injection: this rank skips a step */
    mpt_comm_set_step(t->comm, t->global_step);
    mpt_comm_set_purpose(t->comm, "stop vote");
    MPT_RETURN_IF(mpt__train_stop_vote_start(t));
    mpt_comm_set_purpose(t->comm, "step");
    MPT_RETURN_IF(mpt__train_step(t, step, sums, &ran_out));
    MPT_RETURN_IF(mpt__train_stop_vote_finish(t));
    train_ms += mpt_time_ms() - s0;
    if (ran_out) break;
    /* --gemm tune: the first step's shapes timed (outside the training time) */
    if (t->gemm_tune_pending) MPT_RETURN_IF(mpt__train_gemm_tune_end(t));
    mpt__train_maybe_perturb(t);
    mpt_comm_set_purpose(t->comm, "after step");
    if (c->check_replicas > 0 && t->global_step % c->check_replicas == 0)
      MPT_RETURN_IF(mpt__train_check_replicas(t));
    if (t->stop_global) {
      t->preempted = 1;
      mpt_log(MPT_LOG_WARN, "%s received: stopping after step %" PRId64 " (epoch %" PRId64 ")",
              mpt_trainer_signal_name(mpt__train_signal()), t->global_step, epoch + 1);
    } else if (c->stop_at_step > 0 && t->global_step >= c->stop_at_step) {
      t->stopped = 1;
      mpt_log(MPT_LOG_INFO, "stopping after global step %" PRId64 " (--stop-at-step)",
              t->global_step);
    }
    const int interrupted = t->preempted || t->stopped;
    const double a0 = mpt_time_ms();
    if (c->log_every > 0 && (t->global_step % c->log_every == 0 ||
                             t->global_step == t->total_steps || interrupted)) {
      mpt_comm_set_purpose(t->comm, "step line");
      MPT_RETURN_IF(mpt__train_step_line(t, sums[0], sums[2]));
      mpt_comm_set_purpose(t->comm, "stragglers");
      MPT_RETURN_IF(mpt__train_stragglers(t));
    }
    if (c->eval_every > 0 && t->global_step % c->eval_every == 0 && !interrupted &&
        step + 1 < t->steps_per_epoch)
      MPT_RETURN_IF(eval_line(t));
    const int every = c->checkpoint_dir[0] && c->checkpoint_every > 0 &&
                      t->global_step % c->checkpoint_every == 0;
    mpt_comm_set_purpose(t->comm, "checkpoint");
    if (c->checkpoint_dir[0] && (every || interrupted))
      MPT_RETURN_IF(mpt__train_save_checkpoint(t, epoch, step + 1));
    t->train_ms -= mpt_time_ms() - a0; /* evaluation and checkpoints are not training time */
    if (interrupted) {
      step++;
      break;
    }
    mpt__train_progress(t, epoch, step + 1, sums);
  }
  if (t->progress_bar) fputs("\r\033[K", stderr);
  t->train_ms += train_ms;
  return end_epoch(t, epoch, step, sums, e0, train_ms);
}

static mpt_status run(mpt__trainer *t, mpt_train_result *res) {
  MPT_RETURN_IF(setup(t));
  const mpt_trainer_config *c = &t->c;
  if (t->start_epoch >= c->epochs) /* --resume auto of a finished run: nothing to redo */
    mpt_log(MPT_LOG_INFO, "the checkpoint ends the run (%" PRId64 " epoch(s) done): nothing left "
            "to train", c->epochs);
  else if (c->eval_at_start)
    MPT_RETURN_IF(eval_line(t));
  t->loop_start_ms = t->log_start_ms = t->strag_start_ms = mpt_time_ms();
  t->loop_start_step = t->global_step;
  for (int64_t e = t->start_epoch; e < c->epochs; e++) {
    MPT_RETURN_IF(run_epoch(t, e));
    if (t->preempted || t->stopped) break;
  }
  /* The last background checkpoint is on disk before the run reports its end (or exit 75). */
  MPT_RETURN_IF(mpt__train_ckpt_drain(t));
  if (c->skip_nonfinite)
    mpt_log(MPT_LOG_INFO, "%" PRId64 " optimizer step(s) skipped for non-finite gradients",
            t->skipped_nonfinite);
  mpt_comm_set_step(t->comm, t->global_step);
  mpt_comm_set_purpose(t->comm, "end of run");
  MPT_RETURN_IF(mpt__train_memory_report(t, "at the end", t->global_step - t->loop_start_step));
  if (t->ddp && t->rank == 0 && mpt_ddp_param_gathers(t->ddp) > 0) {
    const int64_t steps = t->global_step - t->loop_start_step;
    mpt_log(MPT_LOG_INFO, "ZeRO-3: %" PRId64 " all-gathers of a unit's parameters in %" PRId64
            " step(s) (%.1f per step; %d units, one bucket each; evaluations and replica checks "
            "included)", mpt_ddp_param_gathers(t->ddp), steps,
            steps > 0 ? (double)mpt_ddp_param_gathers(t->ddp) / (double)steps : 0.0,
            mpt_ddp_num_buckets(t->ddp));
  }
  if (t->ddp) MPT_RETURN_IF(mpt_ddp_gather_params(t->ddp)); /* ZeRO-3: whole for the outputs */
  mpt__breakdown bd;
  memset(&bd, 0, sizeof bd);
  MPT_RETURN_IF(mpt__train_report_end(t, &bd));
  if (c->save_params[0] && t->rank == 0)
    MPT_RETURN_IF(mpt_trainer_save_params(t->model, t->stream, c->save_params));
  if (t->trace) MPT_RETURN_IF(mpt__train_write_trace(t));
  if (c->metrics_json[0] && t->rank == 0) MPT_RETURN_IF(mpt__train_write_metrics(t, &bd));
  if (res) {
    const mpt__epoch_metrics *last = t->nepochs ? &t->epochs[t->nepochs - 1] : NULL;
    res->preempted = t->preempted;
    res->stop_signal = mpt__train_signal();
    res->stopped = t->stopped;
    res->global_step = t->global_step;
    res->steps_run = t->global_step - t->loop_start_step;
    res->epochs_done = last ? (t->preempted || t->stopped ? last->epoch - 1 : last->epoch)
                            : t->start_epoch;
    res->train_loss = last ? last->train_loss : NAN;
    res->eval_loss = t->eval_loss;
    res->eval_metric = t->eval_metric;
    res->units_per_s = last ? last->units_per_s : 0;
  }
  return mpt__train_log_check(t);
}

static void trainer_free(mpt__trainer *t) {
  if (t->gemm_tune_pending) mpt_cpu_gemm_record(0); /* --gemm tune: no step ran */
  mpt_loader_free(t->train_loader);
  mpt_loader_free(t->eval_loader);
  mpt_sampler_free(t->train_sampler);
  mpt_sampler_free(t->eval_sampler);
  mpt_dp_free(t->dp);
  mpt_ddp_free(t->ddp);
  mpt_comm_free(t->grad_comm);
  mpt_device_free(t->device, t->dev_x);
  mpt_device_free(t->device, t->dev_y);
  free(t->host_params);
  mpt_optimizer_free(t->opt);
  mpt_tape_free(t->tape);
  mpt_trace_free(t->trace);
  mpt_event_free(t->stop_event);
  for (int i = 0; t->phase_ev && i < t->phase_nev; i++) mpt_event_free(t->phase_ev[i]);
  free(t->phase_ev);
  mpt_stream_free(t->stream);
  free(t->epochs);
  if (t->c.profile) mpt_op_gemm_counting(0);
}

mpt_status mpt_trainer_run(mpt_comm *comm, mpt_model *model, const mpt_train_task *task,
                           const mpt_trainer_config *cfg, mpt_train_result *result) {
  if (result) {
    memset(result, 0, sizeof *result);
    result->train_loss = result->eval_loss = result->eval_metric = NAN;
  }
  if (!comm || !model || !cfg) return MPT_FAIL(MPT_EINVAL, "mpt_trainer_run: NULL argument");
  mpt__trainer *t = calloc(1, sizeof *t);
  if (!t) return MPT_FAIL(MPT_ENOMEM, "cannot allocate the trainer");
  t->comm = comm;
  t->model = model;
  t->task = task;
  t->rank = mpt_comm_rank(comm);
  t->world = mpt_comm_world_size(comm);
  t->terminal_fd = -1;
  t->last_norm = NAN;
  t->eval_loss = t->eval_metric = NAN;
  mpt_status st = config_check(cfg, task, &t->c);
  if (st == MPT_OK && t->c.handle_signals) st = mpt_trainer_catch_signals();
  if (st == MPT_OK) st = mpt__train_log_setup(t);
  if (st == MPT_OK) st = run(t, result);
  if (t->ckpt_writer) {
    mpt__train_ckpt_abandon(t); /* an error left a write in flight: let it end, not cut it */
    if (st == MPT_OK) st = MPT_FAIL(MPT_ESTATE, "a background checkpoint was left unwaited");
  }
  mpt__train_set_dump_comm(NULL); /* SIGUSR2 after the run: nothing of it to dump */
  if (st != MPT_OK && t->c.log_file && t->c.log_file[0] && t->terminal_fd > 2) {
    char detail[1024];
    snprintf(detail, sizeof detail, "%s", mpt_last_error());
    dprintf(t->terminal_fd, "mpitrain [rank %d/%d] error: %s: %s (log: %s.%d)\n", t->rank,
            t->world, mpt_status_message(st), detail, t->c.log_file, t->rank);
  }
  trainer_free(t);
  free(t);
  return st;
}
