/* `mpitrain train`: the options become the loop's configuration (trainer.h), the model family
 * its data, model and task, and mpt_trainer_run does the rest, the same for every model:
 *   mlp, cnn    Fashion-MNIST (or synthetic images) through mpt_train_task_images;
 *   gpt*        a GPT-2 on llm.c token shards through mpt_train_task_tokens (--init-from reads
 *               an llm.c model file first, --save-model writes one at the end).
 * What is the program's, not the loop's: MPI start-up (with the --timeout watchdog), the
 * warnings for options that have no effect in this run, the checks that need the options
 * before a model exists (memory, --save-model's path), and the exit status.
 *
 * Failure: any error is printed with the rank and its detail; with more than one rank the job
 * is then aborted (MPI_Abort) so no rank waits for one that has stopped. */
#include "cli/train.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/checks.h"
#include "mpitrain.h"

/* What a run of one model family holds. */
typedef struct run {
  const mpt_cli_options *o;
  mpt_comm *comm;
  int rank, world;
  mpt_device device;
  mpt_model *model;
  mpt_dataset train, test;            /* mlp, cnn */
  int have_train, have_test;
  mpt_token_data *tokens, *val_tokens; /* gpt */
  mpt_gpt_config gpt;                  /* the GPT's sizes (--init-from: the file's padding) */
  mpt_train_task *task;
  char run_options[10240], inputs[8 * 4200];
} run;

static const char *or_null(const char *s) { return s[0] ? s : NULL; }

/* The loop's configuration from the options. */
static mpt_trainer_config config_of(const run *r) {
  const mpt_cli_options *o = r->o;
  mpt_trainer_config c = mpt_trainer_config_default();
  c.epochs = o->epochs;
  c.batch_size = o->batch_size;
  c.accumulate = o->accumulate;
  c.max_steps = o->max_steps;
  c.shuffle = o->shuffle;
  c.drop_last = o->drop_last;
  c.seed = o->seed;
  c.optim = o->optim;
  c.no_decay_bias_norm = o->no_decay_bias_norm;
  c.schedule = o->schedule;
  c.grad_clip = o->grad_clip;
  c.skip_nonfinite = o->skip_nonfinite;
  c.ddp = o->ddp;
  c.dp_devices = o->mode == MPT_MODE_DP ? o->devices : NULL;
  c.threads = o->threads;
  c.precision = o->precision;
  c.recompute = o->recompute;
  c.timeout_s = o->timeout_s;
  c.check_collectives = o->check_collectives;
  c.debug_dir = or_null(o->debug_dir);
  c.straggler_warn = o->straggler_warn;
  c.eval_every = o->val_every;
  c.eval_max_batches = o->val_steps;
  c.eval_at_start = mpt_cli_is_gpt(o);
  c.checkpoint_dir = or_null(o->checkpoint_dir);
  c.checkpoint_every = o->checkpoint_every;
  c.keep = o->keep;
  c.checkpoint_async = o->checkpoint_async;
  c.resume = or_null(o->resume);
  c.stop_at_step = o->stop_at_step;
  c.check_replicas = o->check_replicas;
  c.log_every = o->log_every;
  c.progress = o->progress;
  c.progress_interval_s = o->progress_interval_s;
  c.quiet = o->quiet;
  c.log_file = or_null(o->log_file);
  c.metrics_json = or_null(o->metrics_json);
  c.trace = or_null(o->trace);
  c.save_params = or_null(o->save_params);
  c.profile = o->profile;
  c.model_name = o->model;
  c.run_options = r->run_options;
  c.input_paths = r->inputs;
  c.argc = o->argc;
  c.argv = o->argv;
  return c;
}

/* The lines of run-options.txt that are the model's and the data's (the loop adds its own). */
static void describe_run(run *r) {
  const mpt_cli_options *o = r->o;
  char hidden[256] = "";
  size_t used = 0;
  for (int i = 0; i < o->mlp.num_hidden && used < sizeof hidden; i++)
    used += (size_t)snprintf(hidden + used, sizeof hidden - used, "%s%" PRId64, i ? "," : "",
                             (int64_t)o->mlp.hidden[i]);
  /* %g: the dropout as given on the command line (at most 6 digits read back the same) */
  int w = snprintf(r->run_options, sizeof r->run_options, "model %s\nhidden %s\nbatchnorm %d\n"
                   "dropout %g\ntrain-limit %" PRId64 "\nsynthetic %d\n", o->model,
                   strcmp(o->model, "mlp") == 0 ? hidden : "-",
                   strcmp(o->model, "cnn") == 0 ? o->cnn.batchnorm : 0,
                   mpt_cli_is_gpt(o) ? 0.0 : (double)o->mlp.dropout, o->train_limit,
                   o->synthetic);
  if (w > 0 && (size_t)w < sizeof r->run_options && mpt_cli_is_gpt(o))
    snprintf(r->run_options + w, sizeof r->run_options - (size_t)w,
             "n-layer/n-head/n-embd/seq-len/vocab-size %d/%d/%d/%d/%d\nshards %s\nval-shards "
             "%s\n", o->gpt.num_layers, o->gpt.num_heads, o->gpt.channels, o->gpt.max_seq_len,
             o->gpt.vocab_size, o->shards, o->val_shards[0] ? o->val_shards : "-");
}

/* A warning for each option given that has no effect in this run. */
static void warn(const run *r, const char *name, const char *why) {
  if (mpt_cli_given(r->o, name)) mpt_log(MPT_LOG_WARN, "--%s has no effect: %s", name, why);
}

static void warn_unused(const run *r) {
  const mpt_cli_options *o = r->o;
  if (r->rank != 0) return;
  const int cnn = strcmp(o->model, "cnn") == 0;
  if (o->mode != MPT_MODE_DP) warn(r, "devices", "it needs --mode dp");
  if (strcmp(o->model, "mlp") == 0) warn(r, "conv-algo", "the mlp has no convolutions");
  if (o->optim.kind == MPT_OPTIM_SGD) {
    warn(r, "adam-beta1", "it applies to --optimizer adamw only");
    warn(r, "adam-beta2", "it applies to --optimizer adamw only");
    warn(r, "adam-eps", "it applies to --optimizer adamw only");
  } else {
    warn(r, "momentum", "AdamW has no momentum option (its betas are --adam-beta1/2)");
    warn(r, "nesterov", "it applies to SGD only");
  }
  if (o->schedule.kind != MPT_LR_STEP) {
    warn(r, "step-size", "it applies to --schedule step only");
    warn(r, "gamma", "it applies to --schedule step only");
  }
  if (o->schedule.kind != MPT_LR_COSINE) warn(r, "min-lr", "it applies to --schedule cosine only");
  if (!o->checkpoint_dir[0]) {
    warn(r, "checkpoint-every", "no --checkpoint-dir");
    warn(r, "keep", "no --checkpoint-dir");
    warn(r, "checkpoint-async", "no --checkpoint-dir");
  }
  if (r->world == 1) {
    const char *why = "one rank: there is no DDP engine (run under mpirun -np N)";
    warn(r, "bucket-cap-mb", why);
    warn(r, "first-bucket-cap-mb", why);
    warn(r, "no-overlap", why);
    warn(r, "find-unused-parameters", why);
    warn(r, "buffers", why);
    warn(r, "grad-comm", why);
    warn(r, "allreduce-algo", why);
    warn(r, "zero", why);
    warn(r, "check-collectives", "one rank: no collective to compare");
  } else if (!cnn || !o->cnn.batchnorm) {
    warn(r, "buffers", "the model has no BatchNorm statistics");
  }
  if (o->progress == 1 || (o->progress == -1 && isatty(2)))
    warn(r, "progress-interval", "the progress bar is drawn instead");
  if (!mpt_cli_is_gpt(o) && !o->val_shards[0] && o->val_steps && o->test_limit)
    warn(r, "val-steps", "--test-limit already limits the test set");
}

/* The input files (outputs may not replace them), one per line. */
static void add_input(run *r, const char *path) {
  const size_t used = strlen(r->inputs);
  snprintf(r->inputs + used, sizeof r->inputs - used, "%s\n", path);
}

/* mlp, cnn: the images, the model and the classifier task. */
static mpt_status setup_images(run *r) {
  const mpt_cli_options *o = r->o;
  int ndev = 1;
  if (o->mode == MPT_MODE_DP) {
    mpt_device devs[MPT_DP_MAX_DEVICES];
    MPT_RETURN_IF(mpt_dp_parse_devices(o->devices, devs, MPT_DP_MAX_DEVICES, &ndev));
  }
  MPT_RETURN_IF(mpt_nn_set_conv_algo(o->conv_algo));
  if (r->device.type == MPT_DEVICE_CPU) MPT_RETURN_IF(mpt_cli_check_model_fits(o, r->comm, ndev));
  const char *dir = NULL;
  if (o->synthetic) {
    const int64_t ntrain = o->train_limit ? o->train_limit : 60000;
    const int64_t ntest = o->test_limit ? o->test_limit : 10000;
    MPT_RETURN_IF(mpt_dataset_init_synthetic(&r->train, ntrain, 1, 28, 28, 10, o->seed));
    r->have_train = 1;
    MPT_RETURN_IF(mpt_dataset_init_synthetic(&r->test, ntest, 1, 28, 28, 10, o->seed + 1));
    r->have_test = 1;
  } else {
    dir = o->data_dir[0] ? o->data_dir : mpt_data_default_dir();
    if (!dir)
      return MPT_FAIL(MPT_ENOENT, "Fashion-MNIST not found in /usr/share/datasets/fashion-mnist: "
                      "install Debian's dataset-fashion-mnist package (apt-get install "
                      "dataset-fashion-mnist) or pass --data DIR");
    static const char *const files[4] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                                          "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"};
    for (int i = 0; i < 4; i++) {
      char path[4200];
      snprintf(path, sizeof path, "%s/%s.gz", dir, files[i]);
      add_input(r, path);
      snprintf(path, sizeof path, "%s/%s", dir, files[i]);
      add_input(r, path);
    }
    mpt_dataset_config dc = mpt_dataset_config_default();
    dc.limit = o->train_limit;
    MPT_RETURN_IF(mpt_dataset_load_fashion_mnist(dir, "train", &dc, &r->train));
    r->have_train = 1;
    dc.limit = o->test_limit;
    MPT_RETURN_IF(mpt_dataset_load_fashion_mnist(dir, "test", &dc, &r->test));
    r->have_test = 1;
  }
  if (strcmp(o->model, "cnn") == 0) {
    MPT_RETURN_IF(mpt_model_init_cnn(&r->model, r->device, &o->cnn, o->seed));
    mpt_stream *s = NULL;
    MPT_RETURN_IF(mpt_stream_init(&s, r->device, MPT_STREAM_INLINE));
    const int library = mpt_op_conv2d_available(s);
    mpt_stream_free(s);
    if (o->conv_algo == MPT_CONV_ALGO_LIBRARY && !library)
      return MPT_FAIL(MPT_ENOTSUP, "--conv-algo onednn: this build has no oneDNN convolutions "
                      "for the %s device (configure --with-onednn; apt-get install libdnnl-dev)",
                      r->device.type == MPT_DEVICE_CPU ? "cpu" : "cuda");
    mpt_log(MPT_LOG_INFO, "convolutions: %s", o->conv_algo != MPT_CONV_ALGO_IM2COL && library
                                                  ? "oneDNN" : "im2col + GEMM");
  } else {
    MPT_RETURN_IF(mpt_model_init_mlp(&r->model, r->device, &o->mlp, o->seed));
  }
  return mpt_train_task_images(&r->task, &r->train, &r->test, dir);
}

/* gpt*: the token shards, the model (from --init-from when given) and the language-model task.
 * FLOPs per token as llm.c counts them: 6 N + 6 L C T (attention). */
static mpt_status setup_gpt(run *r) {
  const mpt_cli_options *o = r->o;
  mpt_gpt_config gpt = o->gpt;
  const mpt_gpt_config *cfg = &gpt;
  if (o->init_from[0]) { /* llm.c reads any padded vocabulary of at least V: so do we */
    mpt_gpt_config file;
    MPT_RETURN_IF(mpt_gpt_file_read_header(o->init_from, &file));
    if (file.vocab_size == gpt.vocab_size && file.padded_vocab_size >= gpt.vocab_size)
      gpt.padded_vocab_size = file.padded_vocab_size;
  }
  if (o->init_from[0] && o->resume[0] && strcmp(o->resume, "auto") != 0)
    return MPT_FAIL(MPT_EINVAL, "--init-from and --resume: give one (a checkpoint already "
                    "holds the parameters)");
  if (r->rank == 0 && o->save_model[0]) {
    /* a folder takes a Hugging Face model: the file checked is its model.safetensors */
    char in_dir[4200];
    const char *out = o->save_model;
    struct stat sb;
    if (stat(out, &sb) == 0 && S_ISDIR(sb.st_mode)) {
      snprintf(in_dir, sizeof in_dir, "%s/model.safetensors", out);
      out = in_dir;
    }
    MPT_RETURN_IF(mpt_trainer_check_output_path("--save-model", out));
    MPT_RETURN_IF(mpt_cli_gpt_check_save_model(out));
    add_input(r, o->save_model); /* neither --save-params nor --metrics-json may be it */
  }
  mpt_token_data_config dc = mpt_token_data_config_default();
  dc.batch_size = o->batch_size;
  dc.seq_len = cfg->max_seq_len;
  dc.vocab_size = cfg->vocab_size;
  MPT_RETURN_IF(mpt_token_data_init(&r->tokens, o->shards, &dc));
  if (o->val_shards[0]) MPT_RETURN_IF(mpt_token_data_init(&r->val_tokens, o->val_shards, &dc));
  for (int k = 0; k < 2; k++) {
    const mpt_token_data *d = k ? r->val_tokens : r->tokens;
    for (int i = 0; d && i < mpt_token_data_num_shards(d); i++)
      add_input(r, mpt_token_data_shard_path(d, i));
  }
  if (o->init_from[0]) add_input(r, o->init_from);
  if (r->device.type == MPT_DEVICE_CPU) /* refused rather than killed for memory */
    MPT_RETURN_IF(mpt_cli_gpt_check_memory(
        o, cfg, r->world, mpt_comm_local_size(r->comm),
        mpt_token_data_num_windows(r->tokens) +
            (r->val_tokens ? mpt_token_data_num_windows(r->val_tokens) : 0)));
  /* --zero 3 over ranks: the parameters are initialised unit by unit by mpt_ddp_init, each
   * rank keeping its shard, so no rank ever holds the whole model (nn.h) */
  if (o->ddp.zero == 3 && r->world > 1 && r->device.type == MPT_DEVICE_CPU && !o->init_from[0]) {
    MPT_RETURN_IF(mpt_model_init_gpt_deferred(&r->model, r->device, cfg, o->seed));
    mpt_log(MPT_LOG_INFO, "ZeRO-3: the parameters are initialised unit by unit as the model is "
            "wrapped, each rank keeping its shard");
  } else
    MPT_RETURN_IF(mpt_model_init_gpt(&r->model, r->device, cfg, o->seed));
  /* --resume auto: a new run starts from --init-from, a resubmitted one from its checkpoint
   * (the model file is then not read: it may be gone, or be the run's own --save-model) */
  int32_t resuming = 0;
  if (o->init_from[0] && strcmp(o->resume, "auto") == 0) {
    char latest[4200];
    if (r->rank == 0)
      resuming = mpt_ckpt_find_latest(o->checkpoint_dir, latest, sizeof latest) == MPT_OK;
    if (r->world > 1)
      MPT_RETURN_IF(mpt_comm_allreduce_sync(r->comm, &resuming, &resuming, 1, MPT_I32,
                                            MPT_REDUCE_MAX));
  }
  if (o->init_from[0] && !resuming) {
    MPT_RETURN_IF(mpt_gpt_load(r->model, cfg, o->init_from));
    mpt_log(MPT_LOG_INFO, "--init-from: the parameters were read from %s", o->init_from);
  } else if (o->init_from[0]) {
    mpt_log(MPT_LOG_INFO, "--resume auto found a checkpoint: --init-from %s is not read (it "
            "starts a new run only)", o->init_from);
  }
  const double flops = 6 * (double)mpt_model_param_count(r->model) +
                       6.0 * cfg->num_layers * cfg->channels * cfg->max_seq_len;
  mpt_log(MPT_LOG_INFO, "model %s: %d layers, %d heads, %d channels, T %d, vocabulary %d "
          "(padded %d); %lld training windows of B %lld x T %d", o->model, cfg->num_layers,
          cfg->num_heads, cfg->channels, cfg->max_seq_len, cfg->vocab_size,
          cfg->padded_vocab_size, (long long)mpt_token_data_num_windows(r->tokens),
          (long long)o->batch_size, cfg->max_seq_len);
  r->gpt = gpt;
  return mpt_train_task_tokens(&r->task, r->tokens, r->val_tokens, cfg->vocab_size, flops);
}

static mpt_status train(run *r, mpt_train_result *res) {
  const mpt_cli_options *o = r->o;
  MPT_RETURN_IF(mpt_trainer_device(r->comm, o->device, &r->device));
  if (o->mode == MPT_MODE_DP && r->device.type != MPT_DEVICE_CPU)
    return MPT_FAIL(MPT_ENOTSUP, "--mode dp with --device cuda is not wired into the trainer "
                    "yet (use DDP: one rank per GPU)");
  describe_run(r);
  MPT_RETURN_IF(mpt_cpu_set_gemm(o->gemm));
  mpt_trainer_config c = config_of(r);
  MPT_RETURN_IF(mpt_trainer_log_open(r->comm, &c)); /* the lines below go where the run's go */
  warn_unused(r);
  if (o->batch_size == 0 || o->accumulate == 0) {
    /* auto: the batch and accumulation that keep the checkpoint's global batch, known before
     * the data is opened (a GPT's token windows are B x T) and the memory is checked */
    static mpt_cli_options resolved;
    const int gpt = mpt_cli_is_gpt(o);
    MPT_RETURN_IF(mpt_trainer_plan_resume(r->comm, &c, gpt ? 1 : 0,
                                          gpt ? MPT_CLI_DEFAULT_GPT_BATCH : MPT_CLI_DEFAULT_BATCH,
                                          NULL, NULL));
    resolved = *o;
    resolved.batch_size = c.batch_size;
    resolved.accumulate = c.accumulate;
    r->o = o = &resolved;
  }
  MPT_RETURN_IF(mpt_cli_is_gpt(o) ? setup_gpt(r) : setup_images(r));
  MPT_RETURN_IF(mpt_trainer_run(r->comm, r->model, r->task, &c, res));
  if (mpt_cli_is_gpt(o) && r->rank == 0 && o->save_model[0]) {
    MPT_RETURN_IF(mpt_gpt_save(r->model, &r->gpt, o->save_model));
    mpt_log(MPT_LOG_INFO, "model written to %s", o->save_model);
  }
  return MPT_OK;
}

static void run_free(run *r) {
  mpt_train_task_free(r->task);
  mpt_model_free(r->model);
  if (r->have_train) mpt_dataset_free(&r->train);
  if (r->have_test) mpt_dataset_free(&r->test);
  mpt_token_data_free(r->tokens);
  mpt_token_data_free(r->val_tokens);
}

/* Before the job is aborted: this rank's flight recorder, for `mpitrain hang-report` (a timeout
 * or any failure of a job of several ranks; the other ranks are killed by the abort). */
static void dump_on_error(const run *r, mpt_status st) {
  if (mpt_comm_flight_capacity(r->comm) == 0) return;
  char reason[160], path[4200];
  snprintf(reason, sizeof reason, "%s: %s", st == MPT_ETIMEOUT ? "collective timeout" : "error",
           mpt_status_message(st));
  if (mpt_comm_flight_dump(r->comm, reason) == MPT_OK &&
      mpt_comm_flight_path(r->comm, path, sizeof path) == MPT_OK)
    mpt_log(MPT_LOG_ERROR, "flight recorder written to %s (read the dumps of every rank with "
            "`mpitrain hang-report FOLDER`)", path);
}

int mpt_cli_train(const mpt_cli_options *o) {
  run r;
  memset(&r, 0, sizeof r);
  r.o = o;
  /* The preemption signals are caught from the start: one that arrives during start-up (a
   * loaded machine's MPI_Init can take seconds) stops the run after its first step, exit 75,
   * instead of killing the rank and, with it, the job. */
  mpt_status st = mpt_trainer_catch_signals();
  mpt_comm_config cc = mpt_comm_config_default();
  cc.timeout_ms = o->timeout_s * 1e3;
  cc.check_collectives = o->check_collectives;
  cc.log_level = o->quiet ? MPT_LOG_WARN : MPT_LOG_INFO;
  /* --timeout covers MPI_Init_thread too, with a floor: a short collective deadline must not
   * kill a healthy start-up (a singleton's MPI_Init alone takes about 0.5 s here) */
  cc.init_timeout_ms = (o->timeout_s > 10 ? o->timeout_s : 10) * 1e3;
  cc.flight_recorder = o->flight_recorder;
  if (st == MPT_OK) st = mpt_comm_init(&r.comm, &cc);
  /* the loop's rule (trainer.h debug_dir), here too: a failure before the loop is dumped */
  if (st == MPT_OK)
    st = mpt_comm_set_debug_dir(r.comm, o->debug_dir[0] ? o->debug_dir
                                        : o->checkpoint_dir[0] ? o->checkpoint_dir
                                                               : "mpitrain-debug");
  if (st != MPT_OK) {
    fprintf(stderr, "mpitrain: error: %s: %s\n", mpt_status_message(st), mpt_last_error());
    mpt_comm_abort(NULL, 1);
  }
  r.rank = mpt_comm_rank(r.comm);
  r.world = mpt_comm_world_size(r.comm);
  mpt_train_result res;
  memset(&res, 0, sizeof res);
  st = train(&r, &res);
  if (st != MPT_OK) {
    mpt_log(MPT_LOG_ERROR, "%s: %s", mpt_status_message(st), mpt_last_error());
    if (r.world > 1) {
      dump_on_error(&r, st);
      mpt_log(MPT_LOG_ERROR, "rank %d failed: aborting the job", r.rank);
      mpt_comm_abort(r.comm, 1);
    }
  }
  run_free(&r);
  mpt_comm_free(r.comm);
  mpt_comm_finalize();
  if (st != MPT_OK) return 1;
  if (res.preempted) {
    fprintf(stderr, "mpitrain: preempted (%s): exit status %d\n",
            mpt_trainer_signal_name(res.stop_signal), MPT_TRAIN_EXIT_PREEMPTED);
    return MPT_TRAIN_EXIT_PREEMPTED;
  }
  return 0;
}
