/* `mpitrain train`: the options become the loop's configuration (trainer.h), the model family
 * its data, model and task, and mpt_trainer_run does the rest, the same for every model:
 *   mlp, cnn    Fashion-MNIST (or synthetic images) through mpt_train_task_images;
 *   gpt*        a GPT-2 on llm.c token shards through mpt_train_task_tokens (--init-from reads
 *               an llm.c model file first, --save-model writes one at the end);
 *   llama*      a Llama (llama.h) on the same token shards through the same task.
 * What is the program's, not the loop's: MPI start-up (with the --timeout watchdog), the
 * warnings for options that have no effect in this run, the checks that need the options
 * before a model exists (memory, --save-model's path), and the exit status.
 *
 * Failure: any error is printed with the rank and its detail; with more than one rank the job
 * is then aborted (MPI_Abort) so no rank waits for one that has stopped. */
#include "cli/train.h"

#include <errno.h>
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
  c.eval_at_start = mpt_cli_is_lm(o);
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
  c.gemm_cache = or_null(o->gemm_cache);
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
                   mpt_cli_is_lm(o) ? 0.0 : (double)o->mlp.dropout, o->train_limit,
                   o->synthetic);
  if (w > 0 && (size_t)w < sizeof r->run_options && mpt_cli_is_gpt(o))
    snprintf(r->run_options + w, sizeof r->run_options - (size_t)w,
             "n-layer/n-head/n-embd/seq-len/vocab-size %d/%d/%d/%d/%d\nshards %s\nval-shards "
             "%s\n", o->gpt.num_layers, o->gpt.num_heads, o->gpt.channels, o->gpt.max_seq_len,
             o->gpt.vocab_size, o->shards, o->val_shards[0] ? o->val_shards : "-");
  else if (w > 0 && (size_t)w < sizeof r->run_options && mpt_cli_is_llama(o))
    snprintf(r->run_options + w, sizeof r->run_options - (size_t)w,
             "dim/n-layers/n-heads/n-kv-heads/ffn-dim/seq-len/vocab-size %d/%d/%d/%d/%d/%d/%d\n"
             "rope-theta/norm-eps/tied %g/%g/%d\nshards %s\nval-shards %s\n", o->llama.dim,
             o->llama.n_layers, o->llama.n_heads, o->llama.n_kv_heads, o->llama.ffn_dim,
             o->llama.max_seq_len, o->llama.vocab_size, (double)o->llama.rope_theta,
             (double)o->llama.norm_eps, o->llama.tied_embeddings, o->shards,
             o->val_shards[0] ? o->val_shards : "-");
  /* RoPE's scaling: a resume with another one is refused as another run (checkpoints written
   * before this line existed lack it, and are not compared on it) */
  const mpt_rope_scaling *rs = &o->llama.rope_scaling;
  const size_t len = strlen(r->run_options);
  if (mpt_cli_is_llama(o) && len < sizeof r->run_options) {
    if (rs->type == MPT_ROPE_LLAMA3)
      snprintf(r->run_options + len, sizeof r->run_options - len,
               "rope-scaling llama3 factor/low/high/original-context %g/%g/%g/%d\n",
               (double)rs->factor, (double)rs->low_freq_factor, (double)rs->high_freq_factor,
               rs->original_max_position_embeddings);
    else
      snprintf(r->run_options + len, sizeof r->run_options - len, "rope-scaling none\n");
  }
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
  if (!mpt_cli_is_lm(o) && !o->val_shards[0] && o->val_steps && o->test_limit)
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

/* The token shards of a language model (the training shards and, when given, the validation
 * ones) with windows of B x seq_len tokens below vocab, listed as the run's inputs. */
static mpt_status open_tokens(run *r, int seq_len, int vocab) {
  const mpt_cli_options *o = r->o;
  mpt_token_data_config dc = mpt_token_data_config_default();
  dc.batch_size = o->batch_size;
  dc.seq_len = seq_len;
  dc.vocab_size = vocab;
  MPT_RETURN_IF(mpt_token_data_init(&r->tokens, o->shards, &dc));
  if (o->val_shards[0]) MPT_RETURN_IF(mpt_token_data_init(&r->val_tokens, o->val_shards, &dc));
  for (int k = 0; k < 2; k++) {
    const mpt_token_data *d = k ? r->val_tokens : r->tokens;
    for (int i = 0; d && i < mpt_token_data_num_shards(d); i++)
      add_input(r, mpt_token_data_shard_path(d, i));
  }
  return MPT_OK;
}

static int ends_with(const char *s, const char *suffix) {
  const size_t n = strlen(s), k = strlen(suffix);
  return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* 1 when --save-model PATH names a Hugging Face folder rather than one file: an existing
 * folder, a path ending in '/', and, when nothing of that name exists, a Llama's path not
 * ending in .safetensors, .safetensors.index.json or .bin (llm.c) and a GPT-2's path whose last
 * component has no extension (a GPT-2's X.bin or other X.EXT is an llm.c model file). */
static int save_model_is_folder(const char *path, int llama) {
  struct stat sb;
  if (stat(path, &sb) == 0) return S_ISDIR(sb.st_mode);
  if (ends_with(path, "/")) return 1;
  if (ends_with(path, ".safetensors") || ends_with(path, ".safetensors.index.json") ||
      ends_with(path, ".bin"))
    return 0;
  if (llama) return 1;
  const char *base = strrchr(path, '/');
  return strchr(base ? base + 1 : path, '.') == NULL;
}

/* mkdir -p: the --save-model folder and its missing parents. */
static mpt_status make_save_dirs(const char *dir) {
  char p[4200];
  if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p)
    return MPT_FAIL(MPT_EINVAL, "--save-model '%.100s...': path too long", dir);
  for (char *s = p + 1;; s++) {
    if (*s != '/' && *s != '\0') continue;
    const char c = *s;
    *s = '\0';
    if (mkdir(p, 0777) != 0 && errno != EEXIST)
      return MPT_FAIL(MPT_EIO, "--save-model '%s': cannot create the folder %s (%s)", dir, p,
                      strerror(errno));
    *s = c;
    if (c == '\0' || s[1] == '\0') break;
  }
  struct stat sb;
  if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
    return MPT_FAIL(MPT_EIO, "--save-model '%s' is not a folder", dir);
  return MPT_OK;
}

/* --init-from and --save-model of a language model (llama: a Llama, whose files are Hugging
 * Face safetensors only), checked before the run: --resume FILE excludes --init-from, and rank
 * 0 checks that the model can be written where asked. */
static mpt_status check_lm_files(run *r, int llama) {
  const mpt_cli_options *o = r->o;
  if (o->init_from[0] && o->resume[0] && strcmp(o->resume, "auto") != 0)
    return MPT_FAIL(MPT_EINVAL, "--init-from and --resume: give one (a checkpoint already "
                    "holds the parameters)");
  if (llama && o->init_from[0] && !mpt_st_is_model_path(o->init_from))
    return MPT_FAIL(MPT_EINVAL, "--init-from '%s': a Llama starts from Hugging Face safetensors "
                    "(a folder with config.json, or X.safetensors with config.json beside it); "
                    "llm.c model files hold GPT-2 models", o->init_from);
  if (r->rank == 0 && o->save_model[0]) {
    /* a folder takes a Hugging Face model, created when missing (as save_pretrained does):
     * the file checked is its model.safetensors */
    char in_dir[4200];
    const char *out = o->save_model;
    if (save_model_is_folder(out, llama)) {
      MPT_RETURN_IF(make_save_dirs(out));
      snprintf(in_dir, sizeof in_dir, "%s%smodel.safetensors", out,
               ends_with(out, "/") ? "" : "/");
      out = in_dir;
    }
    if (llama && out == o->save_model && !mpt_st_is_model_path(out))
      return MPT_FAIL(MPT_EINVAL, "--save-model '%s': a Llama is written as Hugging Face "
                      "safetensors: give X.safetensors or a folder (llm.c model files, X.bin, "
                      "hold GPT-2 models)", o->save_model);
    MPT_RETURN_IF(mpt_trainer_check_output_path("--save-model", out));
    MPT_RETURN_IF(mpt_cli_gpt_check_save_model(out));
    if (out == o->save_model && !mpt_gpt_st_is_path(out) && o->save_given[0])
      return MPT_FAIL(MPT_EINVAL, "--%s: --save-model '%s' is an llm.c model file (fp32, one "
                      "file); give X.safetensors or a folder for Hugging Face safetensors",
                      o->save_given, o->save_model);
    add_input(r, o->save_model); /* neither --save-params nor --metrics-json may be it */
  }
  return MPT_OK;
}

/* Reads --init-from into the model (gpt: a GPT of that config, else llama: a Llama), unless
 * --resume auto finds a checkpoint: a new run starts from --init-from, a resubmitted one from
 * its checkpoint (the model file is then not read: it may be gone, or be the run's own
 * --save-model). */
static mpt_status init_from(run *r, const mpt_gpt_config *gpt, const mpt_llama_config *llama) {
  const mpt_cli_options *o = r->o;
  if (!o->init_from[0]) return MPT_OK;
  int32_t resuming = 0;
  if (strcmp(o->resume, "auto") == 0) {
    char latest[4200];
    if (r->rank == 0)
      resuming = mpt_ckpt_find_latest(o->checkpoint_dir, latest, sizeof latest) == MPT_OK;
    if (r->world > 1)
      MPT_RETURN_IF(mpt_comm_allreduce_sync(r->comm, &resuming, &resuming, 1, MPT_I32,
                                            MPT_REDUCE_MAX));
  }
  if (resuming) {
    mpt_log(MPT_LOG_INFO, "--resume auto found a checkpoint: --init-from %s is not read (it "
            "starts a new run only)", o->init_from);
    return MPT_OK;
  }
  MPT_RETURN_IF(gpt ? mpt_gpt_load(r->model, gpt, o->init_from)
                    : mpt_llama_load(r->model, llama, o->init_from));
  mpt_log(MPT_LOG_INFO, "--init-from: the parameters were read from %s", o->init_from);
  return MPT_OK;
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
  MPT_RETURN_IF(check_lm_files(r, 0));
  MPT_RETURN_IF(open_tokens(r, cfg->max_seq_len, cfg->vocab_size));
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
  MPT_RETURN_IF(init_from(r, cfg, NULL));
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

/* llama*: the token shards, the model and the language-model task. FLOPs per token as for the
 * GPT: 6 N + 6 L C T (attention: the H query heads' scores and sums). */
static mpt_status setup_llama(run *r) {
  const mpt_cli_options *o = r->o;
  const mpt_llama_config *cfg = &o->llama;
  /* the training window: --seq-len, else the model's longest */
  const int T = o->llama_seq_len ? o->llama_seq_len : cfg->max_seq_len;
  if (T > cfg->max_seq_len)
    return MPT_FAIL(MPT_EINVAL, "--seq-len %d is longer than the model's T %d "
                    "(max_position_embeddings)", T, cfg->max_seq_len);
  MPT_RETURN_IF(check_lm_files(r, 1));
  /* llm.c's shards hold uint16 ids: a larger vocabulary (Llama 3's 128256) takes them all */
  MPT_RETURN_IF(open_tokens(r, T, cfg->vocab_size < 65536 ? cfg->vocab_size : 65536));
  if (o->init_from[0]) add_input(r, o->init_from);
  mpt_llama_config window = *cfg; /* the activations are those of T positions */
  window.max_seq_len = T;
  if (r->device.type == MPT_DEVICE_CPU) /* refused rather than killed for memory */
    MPT_RETURN_IF(mpt_cli_llama_check_memory(
        o, &window, r->world, mpt_comm_local_size(r->comm),
        mpt_token_data_num_windows(r->tokens) +
            (r->val_tokens ? mpt_token_data_num_windows(r->val_tokens) : 0)));
  MPT_RETURN_IF(mpt_model_init_llama(&r->model, r->device, cfg, o->seed));
  MPT_RETURN_IF(init_from(r, NULL, cfg));
  const double flops = 6 * (double)mpt_model_param_count(r->model) +
                       6.0 * cfg->n_layers * cfg->dim * T;
  const mpt_rope_scaling *rs = &cfg->rope_scaling;
  char scaled[160] = "";
  if (rs->type == MPT_ROPE_LLAMA3)
    snprintf(scaled, sizeof scaled, " (llama3 scaling: factor %g, low/high_freq_factor %g/%g, "
             "original context %d)", (double)rs->factor, (double)rs->low_freq_factor,
             (double)rs->high_freq_factor, rs->original_max_position_embeddings);
  mpt_log(MPT_LOG_INFO, "model %s: %d layers, %d heads (%d key/value), %d channels, MLP %d, "
          "T %d, vocabulary %d, RoPE theta %g%s, %s head; %lld training windows of B %lld x T "
          "%d", o->model, cfg->n_layers, cfg->n_heads, cfg->n_kv_heads, cfg->dim, cfg->ffn_dim,
          cfg->max_seq_len, cfg->vocab_size, (double)cfg->rope_theta, scaled,
          cfg->tied_embeddings ? "tied" : "untied",
          (long long)mpt_token_data_num_windows(r->tokens), (long long)o->batch_size, T);
  return mpt_train_task_tokens(&r->task, r->tokens, r->val_tokens, cfg->vocab_size, flops);
}

static mpt_status train(run *r, mpt_train_result *res) {
  const mpt_cli_options *o = r->o;
  MPT_RETURN_IF(mpt_trainer_device(r->comm, o->device, &r->device));
  if (o->mode == MPT_MODE_DP && r->device.type != MPT_DEVICE_CPU)
    return MPT_FAIL(MPT_ENOTSUP, "--mode dp with --device cuda is not wired into the trainer "
                    "yet (use DDP: one rank per GPU)");
  if (strcmp(o->model, "llama") == 0) { /* its shape: --init-from's config.json */
    static mpt_cli_options shaped;
    shaped = *o;
    MPT_RETURN_IF(mpt_llama_st_read_header(o->init_from, &shaped.llama));
    r->o = o = &shaped;
  }
  describe_run(r);
  MPT_RETURN_IF(mpt_cpu_set_gemm(o->gemm));
  mpt_trainer_config c = config_of(r);
  MPT_RETURN_IF(mpt_trainer_log_open(r->comm, &c)); /* the lines below go where the run's go */
  warn_unused(r);
  if (o->batch_size == 0 || o->accumulate == 0) {
    /* auto: the batch and accumulation that keep the checkpoint's global batch, known before
     * the data is opened (a GPT's token windows are B x T) and the memory is checked */
    static mpt_cli_options resolved;
    const int gpt = mpt_cli_is_lm(o);
    MPT_RETURN_IF(mpt_trainer_plan_resume(r->comm, &c, gpt ? 1 : 0,
                                          gpt ? MPT_CLI_DEFAULT_GPT_BATCH : MPT_CLI_DEFAULT_BATCH,
                                          NULL, NULL));
    resolved = *o;
    resolved.batch_size = c.batch_size;
    resolved.accumulate = c.accumulate;
    r->o = o = &resolved;
  }
  MPT_RETURN_IF(mpt_cli_is_gpt(o) ? setup_gpt(r) : mpt_cli_is_llama(o) ? setup_llama(r)
                                                                     : setup_images(r));
  MPT_RETURN_IF(mpt_trainer_run(r->comm, r->model, r->task, &c, res));
  if (mpt_cli_is_gpt(o) && r->rank == 0 && o->save_model[0]) {
    struct stat sb;
    const int st_model = mpt_gpt_st_is_path(o->save_model) ||
                         (stat(o->save_model, &sb) == 0 && S_ISDIR(sb.st_mode));
    MPT_RETURN_IF(mpt_gpt_save_safetensors(r->model, &r->gpt, o->save_model,
                                           st_model ? &o->save : NULL));
    mpt_log(MPT_LOG_INFO, "model written to %s", o->save_model);
  }
  if (mpt_cli_is_llama(o) && r->rank == 0 && o->save_model[0]) {
    MPT_RETURN_IF(mpt_llama_save(r->model, &o->llama, o->save_model, &o->save));
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
