/* `mpitrain train --model gpt|gpt-mini|gpt2`: a GPT-2 language model trained on llm.c token
 * shards, in one process or with DDP under mpirun, written against the public API only.
 *
 * Each step every rank reads its own window of B T + 1 tokens (mpt_token_loader: windows
 * shuffled per epoch from (seed, epoch), DistributedSampler semantics) and runs the step of
 * examples/custom_model.c: zero_grad, reset, input, forward, loss, backward (DDP averages the
 * gradients through its hooks), then clipping by the global L2 norm of the averaged gradients
 * (the same norm on every rank) and AdamW with decay on the >= 2-D weights only, at the
 * warm-up + cosine learning rate. Validation runs over the first --val-steps windows of each
 * rank's share of the validation shards (in order, not shuffled), summed over the ranks: the
 * loss in nats per token.
 *
 * Devices (as the mlp/cnn trainer, src/cli/train.c): --device cuda, or by default when every
 * rank sees a GPU, puts each rank on the GPU of its local rank (mpt_comm_bind_device); the
 * model, its gradients and the AdamW state live there, every op runs on one compute stream,
 * the int32 tokens of each window are copied up into two buffers allocated once, the loss and
 * the clipping norm come back (each a synchronisation), and under DDP the gradients go through
 * NCCL (else MPI, staged in host memory). On the CPU everything runs on the calling thread.
 *
 * --accumulate K: an optimizer step takes K windows in a row (micro-batches); each loss is
 * scaled by 1/K, the backward of the first K-1 runs without DDP's all-reduce (no_sync), the
 * last one synchronises the accumulated gradients; clipping then sees the average over the
 * K B T tokens of every rank, as one step on a batch K times larger would. An epoch has
 * floor(windows per rank / K) steps (the windows left over are not trained on).
 *
 * Checkpoints (mpitrain/ckpt.h, as the mlp/cnn trainer): --checkpoint-dir with
 * --checkpoint-every N steps (or at the end of each epoch), --keep, --resume FILE|DIR|auto and
 * --stop-at-step. A checkpoint holds the parameters, the AdamW state and the position (epoch,
 * steps taken in it); a resumed run starts the same epoch's shuffle and skips the windows
 * already trained on, so with the same options and ranks it continues bit for bit. --save-model
 * / --init-from carry the parameters only, in llm.c's format.
 *
 * The end of a run reports the tokens/s, the per-step times, the fraction of the measured SGEMM
 * peak, DDP's all-reduce time and the share of it hidden behind backward, and every rank's peak
 * resident memory (bench/compare_gpt.sh reads these lines). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <limits.h>

#include "cli/train.h"
#include "cli/train_impl.h"
#include "cli/train_zero.h"
#include "mpitrain.h"

typedef struct gpt_trainer {
  const mpt_cli_options *o;
  mpt_cli_options resolved; /* the options with --resume auto resolved */
  mpt_comm *comm;
  mpt_comm *grad_comm; /* on a GPU with several ranks: the gradients' comm (NCCL, else MPI) */
  mpt_device device;   /* cpu:0, or this rank's GPU */
  mpt_stream *stream;  /* NULL on the CPU: the calling thread */
  int32_t *dev_tokens; /* on a GPU: [2, B, T] inputs then targets of the current window */
  int rank, world;
  mpt_gpt_config cfg;
  mpt_token_data *train_data, *val_data;
  mpt_token_loader *train_loader;
  mpt_model *model;
  mpt_ddp *ddp;
  mpt_tape *tape;
  mpt_optimizer *opt;
  mpt_lr_schedule sched;
  int64_t total_steps, per_epoch;
  int64_t k;                                 /* optimizer steps taken */
  int64_t start_epoch, start_step_in_epoch;  /* where a resumed run continues */
  int resumed_world;                         /* the ranks that wrote the checkpoint */
  double fwd_s, bwd_s, opt_s; /* summed over the steps (this rank) */
  double prof_s;              /* --profile: wall time of the profiled steps */
  int64_t prof_steps;         /* --profile: steps profiled (every step after the first) */
  int64_t gemm_calls;         /* --profile: mpt_op_gemm calls in the profiled steps, */
  double gemm_ms, gemm_flop;  /* their time and FLOPs (mpt_op_gemm_counted) */
} gpt_trainer;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Sums n floats over the ranks, in place. */
static mpt_status sum_ranks(gpt_trainer *g, float *v, int n) {
  if (g->world == 1) return MPT_OK;
  return mpt_comm_allreduce_sync(g->comm, v, v, n, MPT_F32, MPT_REDUCE_SUM);
}

/* A window's inputs and targets on the training device: the loader's host views on the CPU; on
 * a GPU copies on the compute stream into g->dev_tokens (enqueued after the work that read the
 * previous window; the host memory is staged before the copy returns). */
static mpt_status stage_window(gpt_trainer *g, const mpt_token_batch *b, mpt_tensor *x,
                               mpt_tensor *y) {
  *x = b->inputs;
  *y = b->targets;
  if (!g->stream) return MPT_OK;
  const int64_t n = g->o->batch_size * g->cfg.max_seq_len;
  if (b->inputs.count != n || b->targets.count != n)
    return MPT_FAIL(MPT_ESHAPE, "window of %lld tokens, expected B T = %lld",
                    (long long)b->inputs.count, (long long)n);
  if (!g->dev_tokens)
    MPT_RETURN_IF(mpt_device_alloc(g->device, 2 * (size_t)n * sizeof(int32_t),
                                   (void **)&g->dev_tokens));
  MPT_RETURN_IF(mpt_op_memcpy(g->stream, g->device, g->dev_tokens, mpt_device_cpu(),
                              b->inputs.data, (size_t)n * sizeof(int32_t)));
  MPT_RETURN_IF(mpt_op_memcpy(g->stream, g->device, g->dev_tokens + n, mpt_device_cpu(),
                              b->targets.data, (size_t)n * sizeof(int32_t)));
  *x = mpt_tensor_view(g->dev_tokens, g->device, MPT_I32, b->inputs.ndim, b->inputs.shape);
  *y = mpt_tensor_view(g->dev_tokens + n, g->device, MPT_I32, b->targets.ndim,
                       b->targets.shape);
  return MPT_OK;
}

/* Mean validation loss (nats per token) over at most val_steps windows per rank, skipping the
 * sampler's padding; every rank runs the same number of forwards. */
static mpt_status validate(gpt_trainer *g, double *loss_out) {
  const mpt_cli_options *o = g->o;
  mpt_sampler_config sc = mpt_sampler_config_default();
  sc.num_replicas = g->world;
  sc.rank = g->rank;
  sc.shuffle = 0;
  mpt_loader_config lc = mpt_loader_config_default();
  lc.prefetch = 0;
  lc.timeout_ms = o->timeout_s * 1e3;
  mpt_token_loader *loader = NULL;
  mpt_status st = mpt_token_loader_init(&loader, g->val_data, &sc, &lc);
  double acc[2] = {0, 0}; /* sum of window losses, windows: in double (a float sum of 400000
                           * equal losses of 5.5452 came to a mean of 5.5239) */
  mpt_tape_set_grad_enabled(g->tape, 0);
  for (int64_t i = 0; st == MPT_OK && i < o->val_steps; i++) {
    mpt_token_batch b;
    int more = mpt_token_loader_next(loader, &b);
    if (more == MPT_LOADER_END) break;
    if (more < 0) {
      st = (mpt_status)more;
      break;
    }
    if (b.is_padding) continue;
    mpt_var *x, *logits, *loss;
    mpt_tensor in, tgt;
    float l = 0;
    mpt_tape_reset(g->tape, 0);
    st = stage_window(g, &b, &in, &tgt);
    if (st == MPT_OK) st = mpt_tape_input(g->tape, &in, &x);
    if (st == MPT_OK) st = mpt_model_forward(g->model, g->tape, x, &logits);
    if (st == MPT_OK)
      st = mpt_nn_cross_entropy_vocab(g->tape, logits, &tgt, g->cfg.vocab_size, &loss);
    if (st == MPT_OK) st = mpt_var_item(g->tape, loss, &l);
    acc[0] += l;
    acc[1] += 1;
  }
  mpt_tape_set_grad_enabled(g->tape, 1);
  mpt_token_loader_free(loader);
  MPT_RETURN_IF(st);
  float sums[2] = {(float)acc[0], (float)acc[1]}; /* each rank's, rounded once */
  MPT_RETURN_IF(sum_ranks(g, sums, 2));
  *loss_out = sums[1] > 0 ? (double)sums[0] / sums[1] : NAN;
  return MPT_OK;
}

static mpt_status report_val(gpt_trainer *g, int64_t step, double *loss) {
  if (!g->val_data) return MPT_OK;
  MPT_RETURN_IF(validate(g, loss));
  mpt_log(MPT_LOG_INFO, "step %6lld  val loss %.4f nats/token", (long long)step, *loss);
  return MPT_OK;
}

/* --resume auto: the latest checkpoint of --checkpoint-dir if it has one (rank 0 looks), else
 * a new run. */
static mpt_status resolve_resume_auto(gpt_trainer *g) {
  if (strcmp(g->o->resume, "auto") != 0) return MPT_OK;
  g->resolved = *g->o;
  int32_t found = 0;
  if (g->rank == 0) {
    char latest[PATH_MAX];
    mpt_status st = mpt_ckpt_find_latest(g->o->checkpoint_dir, latest, sizeof latest);
    if (st != MPT_OK && st != MPT_ENOENT) return st;
    found = st == MPT_OK;
  }
  if (g->world > 1)
    MPT_RETURN_IF(mpt_comm_allreduce_sync(g->comm, &found, &found, 1, MPT_I32, MPT_REDUCE_MAX));
  if (found)
    snprintf(g->resolved.resume, sizeof g->resolved.resume, "%s", g->o->checkpoint_dir);
  else
    g->resolved.resume[0] = '\0';
  mpt_log(MPT_LOG_INFO, "--resume auto: %s %s", found ? "resuming from" : "no checkpoint in",
          g->o->checkpoint_dir);
  g->o = &g->resolved;
  return MPT_OK;
}

/* A checkpoint of the position (epoch, steps taken in it) into --checkpoint-dir (rank 0
 * writes; every rank returns its status). */
static mpt_status save_checkpoint(gpt_trainer *g, int64_t epoch, int64_t step_in_epoch) {
  mpt_ckpt_meta meta = mpt_ckpt_meta_default();
  meta.epoch = epoch;
  meta.global_step = g->k;
  meta.step_in_epoch = step_in_epoch;
  meta.sampler_epoch = epoch;
  meta.seed = g->o->seed;
  meta.world_size = g->world;
  char path[PATH_MAX];
  mpt_optimizer *whole; /* ZeRO-1: the state gathered from every rank (one file) */
  MPT_RETURN_IF(trainer_opt_whole(g->ddp, g->model, g->opt, 1, g->rank == 0, &whole));
  mpt_status st = mpt_ckpt_save_collective(g->comm, g->o->checkpoint_dir, g->o->keep, g->model,
                                           whole, &meta, path, sizeof path);
  trainer_opt_whole_done(g->ddp, g->opt, whole, 0);
  MPT_RETURN_IF(st);
  mpt_log(MPT_LOG_INFO, "checkpoint %s", path);
  return MPT_OK;
}

/* The device of this rank (train.c's rule): --device cuda, or by default when every rank sees
 * a GPU, the GPU of its local rank, with a compute stream; else the CPU (no stream). With
 * several ranks on GPUs the gradients get their own comm: NCCL, else MPI staged on the host. */
static mpt_status setup_device(gpt_trainer *g) {
  const mpt_cli_options *o = g->o;
  g->device = mpt_device_cpu();
  if (strcmp(o->device, "cuda") == 0 && !mpt_device_available(MPT_DEVICE_CUDA))
    return MPT_FAIL(MPT_ENOTSUP, "--device cuda: no CUDA device is visible to this process (or "
                                 "the build has no CUDA backend: configure --with-cuda)");
  int32_t use_cuda = strcmp(o->device, "cuda") == 0 ||
                     (o->device[0] == '\0' && mpt_device_available(MPT_DEVICE_CUDA));
  if (o->device[0] == '\0' && g->world > 1) /* collective: every rank takes the same branch */
    MPT_RETURN_IF(mpt_comm_allreduce_sync(g->comm, &use_cuda, &use_cuda, 1, MPT_I32,
                                          MPT_REDUCE_MIN));
  if (!use_cuda) return MPT_OK;
  MPT_RETURN_IF(mpt_comm_bind_device(g->comm, MPT_DEVICE_CUDA, -1, &g->device));
  MPT_RETURN_IF(mpt_stream_init(&g->stream, g->device, MPT_STREAM_INLINE));
  if (g->world == 1) return MPT_OK;
  return trainer_grad_comm_init(o, g->device, &g->grad_comm);
}

static mpt_status setup(gpt_trainer *g) {
  const mpt_cli_options *o = g->o;
  if (o->mode == MPT_MODE_DP)
    return MPT_FAIL(MPT_ENOTSUP, "--model %s: --mode dp is not wired into the GPT trainer "
                    "(use DDP: one rank per device)", o->model);
  if (o->init_from[0] && o->resume[0] && strcmp(o->resume, "auto") != 0)
    return MPT_FAIL(MPT_EINVAL, "--init-from and --resume: give one (a checkpoint already "
                    "holds the parameters)");
  MPT_RETURN_IF(trainer_check_same_options_on(g->comm, o)); /* before any other collective */
  MPT_RETURN_IF(resolve_resume_auto(g));
  o = g->o;
  if (o->init_from[0] && o->resume[0]) /* --resume auto: a new run starts from --init-from */
    mpt_log(MPT_LOG_INFO, "--resume auto found a checkpoint: --init-from %s is not read (it "
            "starts a new run only)", o->init_from);
  if (g->rank == 0 && o->save_model[0]) {
    MPT_RETURN_IF(trainer_check_output_path("--save-model", o->save_model));
    MPT_RETURN_IF(trainer_gpt_check_save_model(o->save_model));
  }
  if (g->rank == 0 && o->checkpoint_dir[0]) MPT_RETURN_IF(trainer_check_checkpoint_dir(o));
  if (g->rank == 0 && (o->checkpoint_dir[0] || o->resume[0])) /* a resume with other options */
    MPT_RETURN_IF(trainer_check_run_options(o));
  if (g->rank == 0) trainer_gpt_warn_unused(o, g->world);
  int threads = o->threads;
  if (threads == 0) threads = mpt_cpu_threads_per_rank(mpt_comm_local_size(g->comm), 1);
  MPT_RETURN_IF(mpt_cpu_set_threads(threads));
  MPT_RETURN_IF(setup_device(g));
  g->cfg = o->gpt;
  mpt_token_data_config dc = mpt_token_data_config_default();
  dc.batch_size = o->batch_size;
  dc.seq_len = g->cfg.max_seq_len;
  dc.vocab_size = g->cfg.vocab_size;
  MPT_RETURN_IF(mpt_token_data_init(&g->train_data, o->shards, &dc));
  if (o->val_shards[0]) MPT_RETURN_IF(mpt_token_data_init(&g->val_data, o->val_shards, &dc));
  MPT_RETURN_IF(trainer_gpt_check_distinct(g->train_data, "--shards"));
  if (g->val_data) MPT_RETURN_IF(trainer_gpt_check_distinct(g->val_data, "--val-shards"));
  if (g->val_data) MPT_RETURN_IF(trainer_gpt_check_disjoint(g->train_data, g->val_data));
  MPT_RETURN_IF(trainer_gpt_check_same_data(g->comm, o, g->train_data, g->val_data));
  if (!g->stream) /* on the CPU: refused rather than killed for memory (before the sampler) */
    MPT_RETURN_IF(trainer_gpt_check_memory(
        o, &g->cfg, g->world, mpt_comm_local_size(g->comm),
        mpt_token_data_num_windows(g->train_data) +
            (g->val_data ? mpt_token_data_num_windows(g->val_data) : 0)));
  /* reads every token: after the checks that cost nothing */
  MPT_RETURN_IF(trainer_gpt_check_token_ids(g->comm, g->rank, g->world, g->train_data,
                                            g->val_data));
  mpt_sampler_config sc = mpt_sampler_config_default();
  sc.num_replicas = g->world;
  sc.rank = g->rank;
  sc.shuffle = o->shuffle;
  sc.seed = o->seed;
  sc.drop_last = o->drop_last;
  mpt_loader_config lc = mpt_loader_config_default();
  lc.timeout_ms = o->timeout_s * 1e3;
  MPT_RETURN_IF(mpt_token_loader_init(&g->train_loader, g->train_data, &sc, &lc));

  MPT_RETURN_IF(mpt_model_init_gpt(&g->model, g->device, &g->cfg, o->seed));
  if (o->init_from[0] && !o->resume[0])
    MPT_RETURN_IF(mpt_gpt_load(g->model, &g->cfg, o->init_from));

  const int64_t count = mpt_model_param_count(g->model);
  if (g->world > 1) /* first: with --zero 1 the optimizer holds this rank's shard */
    MPT_RETURN_IF(mpt_ddp_init(&g->ddp, g->model, g->grad_comm ? g->grad_comm : g->comm,
                               g->stream, &o->ddp));
  MPT_RETURN_IF(trainer_opt_init(g->ddp, g->model, &o->optim, g->device, &g->opt));
  int ngroups = 0; /* 8 per layer + 2: 98 for gpt2's 12 layers */
  MPT_RETURN_IF(mpt_param_groups_split_decay(g->model, o->optim.weight_decay, NULL, 0, &ngroups));
  mpt_param_group *groups = malloc(sizeof *groups * (size_t)(ngroups ? ngroups : 1));
  if (!groups) return MPT_FAIL(MPT_ENOMEM, "%d parameter groups", ngroups);
  mpt_status gst = mpt_param_groups_split_decay(g->model, o->optim.weight_decay, groups, ngroups,
                                                &ngroups);
  if (gst == MPT_OK) gst = mpt_optimizer_set_groups(g->opt, groups, ngroups);
  free(groups);
  MPT_RETURN_IF(gst);
  int64_t decayed = 0;
  for (int i = 0; i < mpt_optimizer_num_groups(g->opt); i++) {
    const mpt_param_group *pg = mpt_optimizer_group(g->opt, i);
    if (pg->weight_decay > 0) decayed += pg->count;
  }
  const mpt_optimizer_config *oc = mpt_optimizer_get_config(g->opt);
  mpt_log(MPT_LOG_INFO, "optimizer %s: lr %g, betas (%g, %g), weight decay %g on %lld parameters "
          "(>= 2-D), none on %lld; gradient clipping at norm %g%s",
          mpt_optimizer_kind_name(oc->kind), (double)oc->lr, (double)oc->beta1,
          (double)oc->beta2, (double)oc->weight_decay, (long long)decayed,
          (long long)(count - decayed), o->grad_clip, o->grad_clip > 0 ? "" : " (off)");
  if (o->resume[0]) { /* every rank reads the same file (ZeRO-1: keeps its shard of the state) */
    mpt_ckpt_meta meta;
    mpt_optimizer *whole;
    MPT_RETURN_IF(trainer_opt_whole(g->ddp, g->model, g->opt, 0, 1, &whole));
    mpt_status st = mpt_ckpt_load_collective(g->comm, o->resume, g->model, whole, &meta);
    mpt_status sst = trainer_opt_whole_done(g->ddp, g->opt, whole, st == MPT_OK);
    MPT_RETURN_IF(st);
    MPT_RETURN_IF(sst);
    if (meta.world_size != g->world && g->rank == 0)
      mpt_log(MPT_LOG_WARN, "--resume: the checkpoint was written by %d ranks, this run has %d: "
              "the windows of the rest of the epoch are dealt differently", meta.world_size,
              g->world);
    g->k = meta.global_step;
    g->start_epoch = meta.epoch;
    g->start_step_in_epoch = meta.step_in_epoch;
    g->resumed_world = meta.world_size;
    mpt_log(MPT_LOG_INFO, "resumed at step %lld (epoch %lld, %lld steps into it)",
            (long long)meta.global_step, (long long)meta.epoch, (long long)meta.step_in_epoch);
  }
  MPT_RETURN_IF(mpt_tape_init(&g->tape, g->model, g->stream));
  MPT_RETURN_IF(trainer_set_precision(g->tape, o->precision));
  if (o->profile) {
    MPT_RETURN_IF(mpt_tape_set_profiling(g->tape, 1));
    mpt_op_gemm_counting(1);
  }

  int64_t per_epoch = mpt_token_loader_num_steps(g->train_loader) / o->accumulate;
  if (per_epoch < 1)
    return MPT_FAIL(MPT_EINVAL, "an epoch has %lld window(s) of B T + 1 tokens per rank (%lld "
                    "in the shards, %d rank(s)%s), fewer than the %d a step takes (--accumulate): "
                    "give more text, a smaller --batch-size or --seq-len, or fewer ranks",
                    (long long)mpt_token_loader_num_steps(g->train_loader),
                    (long long)mpt_token_data_num_windows(g->train_data), g->world,
                    o->drop_last ? ", --drop-last" : "", o->accumulate);
  if (o->max_steps > per_epoch && g->rank == 0) /* the same on every rank: warned once */
    mpt_log(MPT_LOG_WARN, "--max-steps %lld is more than the %lld steps of an epoch (windows of "
            "B T + 1 tokens per rank): the run ends after %lld epoch(s) of %lld steps (--epochs)",
            (long long)o->max_steps, (long long)per_epoch, (long long)o->epochs,
            (long long)per_epoch);
  if (o->max_steps > 0 && o->max_steps < per_epoch) per_epoch = o->max_steps;
  g->per_epoch = per_epoch;
  if (g->start_step_in_epoch > per_epoch) /* the same on every rank */
    return MPT_FAIL(MPT_EINVAL, "--resume: the checkpoint is %lld steps into epoch %lld, but an "
                    "epoch here has %lld steps (%lld windows of B T + 1 tokens in the shards, %d "
                    "rank(s)): %s", (long long)g->start_step_in_epoch, (long long)g->start_epoch,
                    (long long)per_epoch, (long long)mpt_token_data_num_windows(g->train_data),
                    g->world, g->resumed_world != g->world
                                  ? "the checkpoint was written by another number of ranks; "
                                    "resume with those ranks until the epoch ends"
                                  : "other shards than the checkpointed run's?");
  g->total_steps = per_epoch * o->epochs;
  g->sched = o->schedule;
  g->sched.total_steps = g->total_steps;
  if (g->sched.kind == MPT_LR_STEP && g->sched.step_size == 0) g->sched.step_size = per_epoch;
  if (g->sched.kind == MPT_LR_COSINE && g->sched.total_steps <= g->sched.warmup_steps) {
    if (g->rank == 0)
      mpt_log(MPT_LOG_WARN, "--warmup-steps %lld is not below the run's %lld steps: the warm-up "
              "takes %lld", (long long)g->sched.warmup_steps, (long long)g->total_steps,
              (long long)(g->total_steps - 1));
    g->sched.warmup_steps = g->total_steps - 1;
  }
  if (o->profile && g->total_steps - g->k < 2 && g->rank == 0)
    mpt_log(MPT_LOG_WARN, "--profile times the steps after the first, and this run takes %lld: "
            "give --max-steps 2 or more for a table", (long long)(g->total_steps - g->k));
  MPT_RETURN_IF(mpt_lr_schedule_validate(&g->sched));
  char devname[32];
  trainer_log_rank_line(g->comm, g->device, o->quiet);
  mpt_log(MPT_LOG_INFO, "model %s: %d layers, %d heads, %d channels, T %d, vocabulary %d (padded "
          "%d): %lld parameters; %d rank%s on %s%s%s, B %lld per rank x %d micro-batch(es), %lld "
          "windows, %lld steps",
          o->model, g->cfg.num_layers, g->cfg.num_heads, g->cfg.channels, g->cfg.max_seq_len,
          g->cfg.vocab_size, g->cfg.padded_vocab_size, (long long)count, g->world,
          g->world > 1 ? "s" : "", mpt_device_str(g->device, devname, sizeof devname),
          g->grad_comm ? " with gradients over " : "",
          g->grad_comm ? mpt_comm_backend_name(mpt_comm_backend_kind(g->grad_comm)) : "",
          (long long)o->batch_size, o->accumulate,
          (long long)mpt_token_data_num_windows(g->train_data), (long long)g->total_steps);
  char sched[256];
  trainer_schedule_str(&g->sched, sched, sizeof sched);
  char warm[64] = "no warm-up";
  if (g->sched.warmup_steps > 0)
    snprintf(warm, sizeof warm, "warm-up %lld steps from %.4g x lr",
             (long long)g->sched.warmup_steps, (double)g->sched.warmup_start_factor);
  mpt_log(MPT_LOG_INFO, "configuration: schedule %s, %s; seed %llu; timeout %g s; checkpoints "
          "%s%s", sched, warm, (unsigned long long)o->seed, o->timeout_s,
          o->checkpoint_dir[0] ? o->checkpoint_dir : "off", o->profile ? "; --profile on" : "");
  return trainer_memory_report(g->comm, "at start", g->model, g->opt, g->ddp, 0);
}

/* On a GPU, waits for the compute stream (so that the phases are timed where they ran) and
 * reports a failed gradient all-reduce; nothing to do on the CPU. */
static mpt_status sync_device(gpt_trainer *g) {
  if (!g->stream) return MPT_OK;
  MPT_RETURN_IF(mpt_stream_synchronize(g->stream, g->o->timeout_s * 1e3));
  if (g->grad_comm && mpt_comm_error(g->grad_comm) != MPT_OK)
    return MPT_FAIL(mpt_comm_error(g->grad_comm), "the gradient all-reduce failed on rank %d "
                    "(see the error above)", g->rank);
  return MPT_OK;
}

/* Optimizer step k over the next --accumulate windows of the loader (micro-batches: losses
 * scaled by 1/K, no_sync but for the last); *loss gets this rank's mean loss over them, *norm
 * the norm before clipping. *ended is set when the epoch had no window left for the step. */
static mpt_status step(gpt_trainer *g, int64_t k, float *loss, float *norm, int *ended) {
  const int K = g->o->accumulate;
  double t0 = now_s(), fwd = 0, bwd = 0;
  float sum = 0;
  *ended = 0;
  MPT_RETURN_IF(mpt_model_zero_grad(g->model, g->stream));
  for (int i = 0; i < K; i++) {
    mpt_token_batch b;
    int more = mpt_token_loader_next(g->train_loader, &b);
    if (more < 0) return (mpt_status)more;
    if (more == MPT_LOADER_END && i == 0) {
      *ended = 1;
      return MPT_OK;
    }
    if (more == MPT_LOADER_END)
      return MPT_FAIL(MPT_ESTATE, "step %lld: the epoch ran out of windows after %d of the "
                      "step's %d micro-batches on rank %d", (long long)k, i, K, g->rank);
    mpt_var *x, *logits, *l;
    mpt_tensor in, tgt;
    float li;
    double f0 = now_s();
    mpt_tape_reset(g->tape, (uint64_t)(k * K + i));
    MPT_RETURN_IF(stage_window(g, &b, &in, &tgt));
    MPT_RETURN_IF(mpt_tape_input(g->tape, &in, &x));
    MPT_RETURN_IF(mpt_model_forward(g->model, g->tape, x, &logits));
    MPT_RETURN_IF(mpt_nn_cross_entropy_vocab(g->tape, logits, &tgt, g->cfg.vocab_size, &l));
    MPT_RETURN_IF(mpt_var_item(g->tape, l, &li)); /* synchronises a GPU's stream */
    double f1 = now_s();
    if (g->ddp) mpt_ddp_set_sync(g->ddp, i == K - 1); /* no_sync but for the last */
    MPT_RETURN_IF(mpt_tape_backward(g->tape, l, 1.0f / (float)K));
    MPT_RETURN_IF(sync_device(g));
    fwd += f1 - f0;
    bwd += now_s() - f1;
    sum += li;
  }
  *loss = sum / (float)K;
  double t2 = now_s();
  *norm = NAN;
  if (g->o->grad_clip > 0)
    MPT_RETURN_IF(g->ddp ? mpt_ddp_clip_grad_norm(g->ddp, g->stream, (float)g->o->grad_clip, norm)
                         : mpt_clip_grad_norm(g->model, g->stream, (float)g->o->grad_clip, norm));
  if (!isfinite(*loss) || (g->o->grad_clip > 0 && !isfinite(*norm)))
    return MPT_FAIL(MPT_ENONFINITE, "step %lld: loss %g, gradient norm %g on rank %d",
                    (long long)k, *loss, *norm, g->rank);
  float lr = mpt_lr_at(&g->sched, g->o->optim.lr, k);
  MPT_RETURN_IF(g->ddp ? mpt_ddp_optimizer_step(g->ddp, g->opt, g->stream, lr)
                       : mpt_optimizer_step_model(g->opt, g->model, g->stream, lr));
  MPT_RETURN_IF(sync_device(g));
  double t3 = now_s();
  g->fwd_s += t2 - t0 - bwd; /* zero_grad and the loader count with the forward */
  g->bwd_s += bwd;
  g->opt_s += t3 - t2;
  return MPT_OK;
}

/* The machine's SGEMM rate as these ranks see it: every rank at once (after a barrier) runs
 * N x N x N products on its device (N 512 on the CPU: mpt_op_gemm, i.e. the fp32 GEMM that
 * training uses, oneDNN's sgemm or OpenBLAS's, sharing the cores as training does; N 4096 on a
 * GPU: cuBLAS, FP32, each call synchronised) for about 0.4 s (at least PEAK_MIN_CALLS calls)
 * after one untimed call, timing each call. A rank's rate is that of its fastest quarter of
 * calls (the call time a quarter of them beat): on a shared machine a call that another process
 * preempted takes longer, and one such stretch in a single 0.25 s window made the peak read
 * 26 GFLOP/s where it is 150 and the model "reach 154 %" of it. The rates are summed over the
 * ranks (GFLOP/s). This is the peak the model's arithmetic rate is measured against. */
enum { PEAK_MIN_CALLS = 4, PEAK_MAX_CALLS = 1024 };

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static mpt_status measure_sgemm_peak(gpt_trainer *g, double *gflops) {
  const int64_t N = g->stream ? 4096 : 512, nn = N * N;
  mpt_stream *stream = g->stream, *own = NULL;
  float *buf = NULL;
  mpt_status st = mpt_device_alloc(g->device, 3 * (size_t)nn * sizeof(float), (void **)&buf);
  if (st == MPT_OK && !stream) {
    for (int64_t i = 0; i < 3 * nn; i++) buf[i] = (float)(i % 7) * 0.125f;
    st = mpt_stream_init(&own, mpt_device_cpu(), MPT_STREAM_INLINE);
    stream = own;
  } else if (st == MPT_OK) {
    st = mpt_op_fill(stream, buf, 3 * nn, 0.125f);
  }
  float sync = 0;
  if (st == MPT_OK) st = sum_ranks(g, &sync, 1); /* start together */
  double times[PEAK_MAX_CALLS];
  int calls = -1; /* the first call is not timed (cuBLAS's set-up) */
  const double t0 = now_s();
  double t = t0;
  while (st == MPT_OK && calls < PEAK_MAX_CALLS &&
         (calls < PEAK_MIN_CALLS || t - t0 < 0.4)) {
    st = mpt_op_gemm(stream, 0, 0, N, N, N, 1.0f, buf, N, buf + nn, N, 0.0f, buf + 2 * nn, N);
    if (st == MPT_OK) st = mpt_stream_synchronize(stream, g->o->timeout_s * 1e3);
    const double t1 = now_s();
    if (calls >= 0) times[calls] = t1 - t;
    calls++;
    t = t1;
  }
  float rate = 0;
  if (st == MPT_OK) {
    qsort(times, (size_t)calls, sizeof times[0], cmp_double);
    const double quarter = times[(calls - 1) / 4];
    rate = (float)(2.0 * (double)nn * (double)N / (quarter > 0 ? quarter : 1e-9) * 1e-9);
  }
  if (st == MPT_OK) st = sum_ranks(g, &rate, 1);
  mpt_stream_free(own);
  mpt_device_free(g->device, buf);
  *gflops = rate;
  return st;
}

/* The end-of-run DDP summary (rank 0's engine, mean over the run's synchronised steps): the
 * all-reduce time per step, the share of it that overlapped backward, and what the step still
 * waited for after backward. */
static void report_ddp(gpt_trainer *g) {
  if (!g->ddp) return;
  mpt_ddp_stats ds = mpt_ddp_get_stats(g->ddp);
  const double n = ds.steps > 0 ? (double)ds.steps : 1;
  mpt_log(MPT_LOG_INFO, "DDP (rank 0, mean over %lld steps): all-reduce %.1f ms per step in "
          "%d bucket(s), %.0f %% of it hidden behind backward; exposed (waited after "
          "backward) %.1f ms", (long long)ds.steps, ds.sum_allreduce_ms / n,
          mpt_ddp_num_buckets(g->ddp),
          ds.sum_allreduce_ms > 0 ? 100 * ds.sum_hidden_ms / ds.sum_allreduce_ms : 0.0,
          ds.sum_exposed_comm_ms / n);
}

static mpt_status run(gpt_trainer *g) {
  const mpt_cli_options *o = g->o;
  MPT_RETURN_IF(setup(g));
  o = g->o; /* --resume auto resolved */
  double val = NAN;
  MPT_RETURN_IF(report_val(g, g->k, &val));
  const int64_t tokens_per_step = o->batch_size * g->cfg.max_seq_len * g->world * o->accumulate;
  int64_t k = g->k, k0 = g->k, interval_steps = 0;
  int stop = 0;
  float sums[2] = {0, 0}; /* loss sum over this interval's steps, norm of the last */
  double loss_sum = 0;    /* the interval's, in double (as validate's) until the all-reduce */
  double t_start = now_s(), t_interval = t_start;
  for (int64_t epoch = g->start_epoch; epoch < o->epochs && !stop; epoch++) {
    MPT_RETURN_IF(mpt_token_loader_start_epoch(g->train_loader, epoch));
    int64_t i = 0;
    if (epoch == g->start_epoch && g->start_step_in_epoch > 0) { /* resumed: skip what was done */
      for (int64_t w = 0; w < g->start_step_in_epoch * o->accumulate; w++) {
        mpt_token_batch b;
        int more = mpt_token_loader_next(g->train_loader, &b);
        if (more < 0) return (mpt_status)more;
      }
      i = g->start_step_in_epoch;
    }
    for (; i < g->per_epoch && !stop; i++) {
      float loss = 0, norm = NAN;
      int ended = 0;
      const double t_step = now_s();
      int64_t calls0 = 0, calls1 = 0;
      double ms0 = 0, ms1 = 0, flop0 = 0, flop1 = 0;
      if (o->profile) mpt_op_gemm_counted(&calls0, &ms0, &flop0);
      MPT_RETURN_IF(step(g, k, &loss, &norm, &ended));
      if (ended) break;
      if (o->profile && k == k0) { /* the first step (arena growth, page faults) is not timed */
        mpt_tape_clear_op_times(g->tape);
      } else if (o->profile) {
        g->prof_s += now_s() - t_step;
        g->prof_steps++;
        mpt_op_gemm_counted(&calls1, &ms1, &flop1); /* this step's, validation's not */
        g->gemm_calls += calls1 - calls0;
        g->gemm_ms += ms1 - ms0;
        g->gemm_flop += flop1 - flop0;
      }
      g->k = ++k;
      interval_steps++;
      loss_sum += loss;
      sums[1] = norm;
      if (k % o->log_every == 0 || k == g->total_steps) {
        sums[0] = (float)loss_sum;
        MPT_RETURN_IF(sum_ranks(g, sums, 2));
        double now = now_s();
        mpt_log(MPT_LOG_INFO, "step %6lld/%lld  loss %.4f  norm %.3f  lr %.3e  %.0f tokens/s",
                (long long)k, (long long)g->total_steps,
                sums[0] / (double)(interval_steps * g->world), sums[1] / g->world,
                (double)mpt_lr_at(&g->sched, o->optim.lr, k - 1),
                (double)(interval_steps * tokens_per_step) / (now - t_interval));
        sums[0] = sums[1] = 0;
        loss_sum = 0;
        interval_steps = 0;
        t_interval = now_s();
      }
      if (o->val_every > 0 && k % o->val_every == 0 && k != g->total_steps) {
        double t0 = now_s();
        MPT_RETURN_IF(report_val(g, k, &val));
        double spent = now_s() - t0; /* validation is not training time */
        t_interval += spent;
        t_start += spent;
      }
      stop = o->stop_at_step > 0 && k >= o->stop_at_step;
      if (o->checkpoint_dir[0] && (stop || (o->checkpoint_every > 0 &&
                                            k % o->checkpoint_every == 0))) {
        double t0 = now_s();
        MPT_RETURN_IF(save_checkpoint(g, epoch, i + 1));
        t_start += now_s() - t0;
      }
    }
    if (o->checkpoint_dir[0] && o->checkpoint_every == 0 && !stop) /* per epoch */
      MPT_RETURN_IF(save_checkpoint(g, epoch + 1, 0));
  }
  if (stop) mpt_log(MPT_LOG_INFO, "--stop-at-step %lld: stopping", (long long)o->stop_at_step);
  double elapsed = now_s() - t_start;
  MPT_RETURN_IF(report_val(g, k, &val));
  k -= k0; /* the steps this run took */
  MPT_RETURN_IF(trainer_memory_report(g->comm, "at the end", g->model, g->opt, g->ddp, k));
  if (k > 0) {
    /* FLOPs per token as llm.c counts them: 6 N + 6 L C T (attention) */
    const double n = (double)mpt_model_param_count(g->model);
    const double flops = 6 * n + 6.0 * g->cfg.num_layers * g->cfg.channels * g->cfg.max_seq_len;
    mpt_log(MPT_LOG_INFO, "done: %lld steps, %.0f tokens/s overall (%.1f GFLOP/s of model "
            "arithmetic, all ranks); per step on rank 0: forward %.1f ms, backward (all-reduce "
            "included) %.1f ms, clip + optimizer %.1f ms", (long long)k,
            (double)(k * tokens_per_step) / elapsed,
            flops * (double)(k * tokens_per_step) / elapsed * 1e-9, 1e3 * g->fwd_s / (double)k,
            1e3 * g->bwd_s / (double)k, 1e3 * g->opt_s / (double)k);
    double peak = 0;
    MPT_RETURN_IF(measure_sgemm_peak(g, &peak));
    mpt_log(MPT_LOG_INFO, "SGEMM peak measured now on these ranks: %.1f GFLOP/s; the model's "
            "arithmetic reached %.1f %% of it", peak,
            100 * flops * (double)(k * tokens_per_step) / elapsed * 1e-9 / peak);
  }
  report_ddp(g);
  if (o->profile) {
    mpt_op_gemm_counting(0);
    trainer_report_op_times(g->tape, g->prof_steps, g->prof_s * 1e3, g->gemm_calls, g->gemm_ms,
                            g->gemm_flop);
  }
  if (g->rank == 0 && o->save_model[0]) {
    MPT_RETURN_IF(mpt_gpt_save(g->model, &g->cfg, o->save_model));
    mpt_log(MPT_LOG_INFO, "model written to %s", o->save_model);
  }
  return MPT_OK;
}

static void gpt_trainer_free(gpt_trainer *g) {
  mpt_optimizer_free(g->opt);
  mpt_tape_free(g->tape);
  mpt_ddp_free(g->ddp);
  mpt_comm_free(g->grad_comm);
  mpt_model_free(g->model);
  if (g->dev_tokens) mpt_device_free(g->device, g->dev_tokens);
  mpt_stream_free(g->stream);
  mpt_token_loader_free(g->train_loader);
  mpt_token_data_free(g->val_data);
  mpt_token_data_free(g->train_data);
}

int mpt_cli_train_gpt(const mpt_cli_options *o) {
  gpt_trainer g;
  memset(&g, 0, sizeof g);
  g.o = o;
  mpt_comm_config cc = mpt_comm_config_default();
  cc.timeout_ms = o->timeout_s * 1e3;
  cc.check_collectives = o->check_collectives;
  trainer_watchdog *wd = NULL; /* --timeout covers MPI initialisation too (as train.c) */
  mpt_status st = trainer_watchdog_start(o->timeout_s > 10 ? o->timeout_s : 10, &wd);
  if (st == MPT_OK) st = mpt_comm_init(&g.comm, &cc);
  trainer_watchdog_stop(wd);
  if (st != MPT_OK) {
    fprintf(stderr, "mpitrain: error: %s: %s\n", mpt_status_message(st), mpt_last_error());
    mpt_comm_abort(NULL, 1);
  }
  g.rank = mpt_comm_rank(g.comm);
  g.world = mpt_comm_world_size(g.comm);
  mpt_log_configure(g.rank, g.world, o->quiet ? MPT_LOG_WARN : MPT_LOG_INFO, 0);
  st = run(&g);
  if (st != MPT_OK) {
    mpt_log(MPT_LOG_ERROR, "%s: %s", mpt_status_message(st), mpt_last_error());
    if (g.world > 1) {
      mpt_log(MPT_LOG_ERROR, "rank %d failed: aborting the job", g.rank);
      mpt_comm_abort(g.comm, 1);
    }
  }
  gpt_trainer_free(&g);
  mpt_comm_free(g.comm);
  mpt_comm_finalize();
  return st == MPT_OK ? 0 : 1;
}
