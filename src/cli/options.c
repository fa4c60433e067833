/* Command-line parsing for `mpitrain train` with getopt_long. Pure: fills a struct or a
 * one-line message; prints nothing. Every numeric value is parsed completely (trailing junk,
 * overflow, NaN and infinities are errors) and range-checked here, so the trainer can trust it. */
#include "cli/options.h"

#include <errno.h>
#include <float.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "mpitrain/dp.h"
#include "mpitrain/transformer.h"

enum {
  OPT_MODEL = 256, OPT_EPOCHS, OPT_BATCH, OPT_LR, OPT_OPTIMIZER, OPT_MOMENTUM, OPT_WD,
  OPT_NESTEROV, OPT_SCHEDULE, OPT_WARMUP, OPT_STEP_SIZE, OPT_GAMMA, OPT_MIN_LR, OPT_SEED,
  OPT_DATA, OPT_SYNTHETIC, OPT_THREADS, OPT_METRICS, OPT_SAVE_PARAMS, OPT_TRACE, OPT_DEVICE,
  OPT_HIDDEN, OPT_BATCHNORM, OPT_DROPOUT, OPT_MAX_STEPS, OPT_TRAIN_LIMIT, OPT_TEST_LIMIT,
  OPT_NO_SHUFFLE, OPT_DROP_LAST, OPT_PROGRESS, OPT_NO_PROGRESS, OPT_BUCKET_CAP,
  OPT_FIRST_BUCKET_CAP, OPT_NO_OVERLAP, OPT_FIND_UNUSED, OPT_ACCUMULATE, OPT_BUFFERS,
  OPT_TIMEOUT, OPT_CHECK_COLL, OPT_MODE, OPT_DEVICES, OPT_CKPT_DIR, OPT_CKPT_EVERY, OPT_KEEP,
  OPT_RESUME, OPT_STOP_AT, OPT_SKIP_NONFINITE, OPT_CHECK_REPLICAS, OPT_CONV_ALGO, OPT_HELP,
  OPT_VERSION, OPT_NO_DECAY_BIAS_NORM, OPT_LOG_FILE, OPT_QUIET, OPT_PROGRESS_INTERVAL,
  OPT_GRAD_COMM, OPT_N_LAYER, OPT_N_HEAD, OPT_N_EMBD, OPT_SEQ_LEN, OPT_VOCAB_SIZE, OPT_SHARDS,
  OPT_VAL_SHARDS, OPT_INIT_FROM, OPT_SAVE_MODEL, OPT_GRAD_CLIP, OPT_VAL_EVERY, OPT_VAL_STEPS,
  OPT_LOG_EVERY, OPT_ZERO, OPT_PRECISION, OPT_PROFILE,
  OPT_ALLREDUCE_ALGO,
};

static const struct option long_options[] = {
    {"model", required_argument, NULL, OPT_MODEL},
    {"epochs", required_argument, NULL, OPT_EPOCHS},
    {"batch-size", required_argument, NULL, OPT_BATCH},
    {"lr", required_argument, NULL, OPT_LR},
    {"optimizer", required_argument, NULL, OPT_OPTIMIZER},
    {"momentum", required_argument, NULL, OPT_MOMENTUM},
    {"weight-decay", required_argument, NULL, OPT_WD},
    {"nesterov", no_argument, NULL, OPT_NESTEROV},
    {"no-decay-bias-norm", no_argument, NULL, OPT_NO_DECAY_BIAS_NORM},
    {"schedule", required_argument, NULL, OPT_SCHEDULE},
    {"warmup-steps", required_argument, NULL, OPT_WARMUP},
    {"step-size", required_argument, NULL, OPT_STEP_SIZE},
    {"gamma", required_argument, NULL, OPT_GAMMA},
    {"min-lr", required_argument, NULL, OPT_MIN_LR},
    {"seed", required_argument, NULL, OPT_SEED},
    {"data", required_argument, NULL, OPT_DATA},
    {"synthetic", no_argument, NULL, OPT_SYNTHETIC},
    {"threads", required_argument, NULL, OPT_THREADS},
    {"metrics-json", required_argument, NULL, OPT_METRICS},
    {"save-params", required_argument, NULL, OPT_SAVE_PARAMS},
    {"trace", required_argument, NULL, OPT_TRACE},
    {"device", required_argument, NULL, OPT_DEVICE},
    {"conv-algo", required_argument, NULL, OPT_CONV_ALGO},
    {"hidden", required_argument, NULL, OPT_HIDDEN},
    {"batchnorm", no_argument, NULL, OPT_BATCHNORM},
    {"dropout", required_argument, NULL, OPT_DROPOUT},
    {"max-steps", required_argument, NULL, OPT_MAX_STEPS},
    {"train-limit", required_argument, NULL, OPT_TRAIN_LIMIT},
    {"test-limit", required_argument, NULL, OPT_TEST_LIMIT},
    {"no-shuffle", no_argument, NULL, OPT_NO_SHUFFLE},
    {"drop-last", no_argument, NULL, OPT_DROP_LAST},
    {"progress", no_argument, NULL, OPT_PROGRESS},
    {"no-progress", no_argument, NULL, OPT_NO_PROGRESS},
    {"bucket-cap-mb", required_argument, NULL, OPT_BUCKET_CAP},
    {"first-bucket-cap-mb", required_argument, NULL, OPT_FIRST_BUCKET_CAP},
    {"no-overlap", no_argument, NULL, OPT_NO_OVERLAP},
    {"find-unused-parameters", no_argument, NULL, OPT_FIND_UNUSED},
    {"accumulate", required_argument, NULL, OPT_ACCUMULATE},
    {"buffers", required_argument, NULL, OPT_BUFFERS},
    {"grad-comm", required_argument, NULL, OPT_GRAD_COMM},
    {"zero", required_argument, NULL, OPT_ZERO},
    {"allreduce-algo", required_argument, NULL, OPT_ALLREDUCE_ALGO},
    {"precision", required_argument, NULL, OPT_PRECISION},
    {"timeout", required_argument, NULL, OPT_TIMEOUT},
    {"check-collectives", no_argument, NULL, OPT_CHECK_COLL},
    {"mode", required_argument, NULL, OPT_MODE},
    {"devices", required_argument, NULL, OPT_DEVICES},
    {"checkpoint-dir", required_argument, NULL, OPT_CKPT_DIR},
    {"checkpoint-every", required_argument, NULL, OPT_CKPT_EVERY},
    {"keep", required_argument, NULL, OPT_KEEP},
    {"resume", required_argument, NULL, OPT_RESUME},
    {"stop-at-step", required_argument, NULL, OPT_STOP_AT},
    {"skip-nonfinite", no_argument, NULL, OPT_SKIP_NONFINITE},
    {"check-replicas", required_argument, NULL, OPT_CHECK_REPLICAS},
    {"help", no_argument, NULL, OPT_HELP},
    {"version", no_argument, NULL, OPT_VERSION},
    {"log-file", required_argument, NULL, OPT_LOG_FILE},
    {"quiet", no_argument, NULL, OPT_QUIET},
    {"progress-interval", required_argument, NULL, OPT_PROGRESS_INTERVAL},
    {"n-layer", required_argument, NULL, OPT_N_LAYER},
    {"n-head", required_argument, NULL, OPT_N_HEAD},
    {"n-embd", required_argument, NULL, OPT_N_EMBD},
    {"seq-len", required_argument, NULL, OPT_SEQ_LEN},
    {"vocab-size", required_argument, NULL, OPT_VOCAB_SIZE},
    {"shards", required_argument, NULL, OPT_SHARDS},
    {"val-shards", required_argument, NULL, OPT_VAL_SHARDS},
    {"init-from", required_argument, NULL, OPT_INIT_FROM},
    {"save-model", required_argument, NULL, OPT_SAVE_MODEL},
    {"grad-clip", required_argument, NULL, OPT_GRAD_CLIP},
    {"profile", no_argument, NULL, OPT_PROFILE},
    {"val-every", required_argument, NULL, OPT_VAL_EVERY},
    {"val-steps", required_argument, NULL, OPT_VAL_STEPS},
    {"log-every", required_argument, NULL, OPT_LOG_EVERY},
    {NULL, 0, NULL, 0},
};

const char *mpt_cli_usage(void) {
  return "usage: mpitrain train [options]      (run under mpirun -np N for DDP)\n"
         "       mpitrain tokenize --help, mpitrain generate --help\n"
         "\n"
         "model and data:\n"
         "  --model mlp|cnn|gpt|gpt-mini|gpt2   model (default mlp: 784-512-512-10); gpt-mini\n"
         "                             (6 layers, 6 heads, 384, T 256, bytes) and gpt2 (124M)\n"
         "                             are GPT-2 presets, gpt is gpt-mini's sizes unless given\n"
         "  --hidden N[,N...]          mlp hidden sizes (default 512,512)\n"
         "  --batchnorm                cnn: BatchNorm2d after each convolution\n"
         "  --dropout P                dropout probability in [0, 1) (default 0)\n"
         "  --data DIR                 Fashion-MNIST IDX files (default: Debian's\n"
         "                             dataset-fashion-mnist folder)\n"
         "  --synthetic                random data of the same shape (benchmarks)\n"
         "  --train-limit N, --test-limit N   use the first N samples (0 = all)\n"
         "language models (--model gpt*; train on token shards, see `mpitrain tokenize`):\n"
         "  --n-layer L, --n-head H, --n-embd C, --seq-len T, --vocab-size V   sizes (--model\n"
         "                             gpt; the vocabulary is padded to a multiple of 128)\n"
         "  --shards GLOB              training token shards (llm.c format; required)\n"
         "  --val-shards GLOB          validation shards: loss in nats per token\n"
         "  --val-every N              validation every N steps (default 0: start and end)\n"
         "  --val-steps N              at most N validation windows per rank (default 20)\n"
         "  --log-every N              loss and tokens/s every N steps (default 10)\n"
         "  --profile                  at the end, each op's forward and backward time per\n"
         "                             step (rank 0, steps after the first; see README)\n"
         "  --init-from FILE           start from an llm.c model file of the same sizes\n"
         "  --save-model FILE          write the final model as an llm.c model file (rank 0)\n"
         "  --grad-clip F              clip the global gradient L2 norm to F (0 = off;\n"
         "                             default 1.0). GPT defaults: --optimizer adamw, betas\n"
         "                             (0.9, 0.95), --lr 1e-3 (gpt2: 6e-4), --weight-decay 0.1\n"
         "                             on >= 2-D weights only, --batch-size 8 sequences,\n"
         "                             --epochs 1\n"
         "training:\n"
         "  --epochs N                 epochs (default 10)\n"
         "  --batch-size N             samples per step PER RANK (default 64)\n"
         "  --max-steps N              stop each epoch after N steps (0 = whole epoch)\n"
         "  --optimizer sgd|adamw      (default sgd)\n"
         "  --lr F                     base learning rate (default 0.05)\n"
         "  --momentum F               SGD momentum (default 0.9)\n"
         "  --nesterov                 Nesterov momentum\n"
         "  --weight-decay F           L2 weight decay (default 0.0005)\n"
         "  --no-decay-bias-norm       no weight decay on biases and norm parameters (1-D)\n"
         "  --schedule constant|step|cosine   learning-rate schedule (default cosine)\n"
         "  --warmup-steps N           linear warm-up from lr / 3 to lr over N steps, as\n"
         "                             PyTorch's LinearLR (default 0)\n"
         "  --step-size N, --gamma F   step schedule (default 1 epoch, 0.1)\n"
         "  --min-lr F                 cosine final learning rate (default 0)\n"
         "  --seed N                   seed of initialisation, shuffling, dropout (default 1)\n"
         "  --no-shuffle, --drop-last  DistributedSampler options\n"
         "  --accumulate K             K micro-batches per optimizer step (no_sync on K-1)\n"
         "distributed:\n"
         "  --bucket-cap-mb F          gradient bucket size in MiB (default 25)\n"
         "  --first-bucket-cap-mb F    first bucket size in MiB (default 1)\n"
         "  --no-overlap               all-reduce after backward instead of during it\n"
         "  --find-unused-parameters   treat parameters the forward skipped as zero gradient\n"
         "  --buffers broadcast|average|none   BatchNorm statistics across ranks\n"
         "  --grad-comm fp32|bf16      gradients on the wire: bf16 rounds each bucket to\n"
         "                             bfloat16, sums in fp32 steps, half the bytes (default\n"
         "                             fp32; error bound in ddp.h; CPU models)\n"
         "  --zero 0|1                 ZeRO stage: 1 shards the optimizer state over the ranks\n"
         "                             (reduce-scatter + all-gather; default 0; CPU models)\n"
         "  --allreduce-algo native|rs-ag   plain DDP's all-reduce: rs-ag = ZeRO-1's\n"
         "                             reduce-scatter + all-gather, so --zero 0 and 1 train\n"
         "                             bit for bit alike (default native; CPU models)\n"
         "  --timeout SEC              deadline of every collective and of start-up, MPI\n"
         "                             initialisation included (at least 10 s) (default 300)\n"
         "  --check-collectives        compare (op, count, dtype) across ranks first\n"
         "  --mode ddp|dp, --devices cpu:K   DP inside each rank (K devices)\n"
         "checkpoints:\n"
         "  --checkpoint-dir DIR       write checkpoints here (rank 0; atomic rename)\n"
         "  --checkpoint-every N|epoch\n"
         "                             every N optimizer steps, or per epoch (default epoch)\n"
         "  --keep K                   keep the last K checkpoints (default 3)\n"
         "  --resume FILE|DIR|auto     continue from a checkpoint (DIR: its latest; auto: the\n"
         "                             latest of --checkpoint-dir if it has one, else start)\n"
         "  --stop-at-step N           stop after global step N (checkpointing if on)\n"
         "faults:\n"
         "  --skip-nonfinite           skip steps whose averaged gradients are NaN/Inf (every\n"
         "                             rank skips the same steps); default: stop at the first\n"
         "                             non-finite loss, naming the step and rank\n"
         "  --check-replicas N         every N steps compare a CRC-32 of the parameters across\n"
         "                             ranks and name the first rank whose replica diverged\n"
         "output:\n"
         "  --threads N                CPU threads per rank: BLAS, oneDNN and the other large\n"
         "                             ops (default: the host's cores / its ranks, e.g. 1 with\n"
         "                             2 ranks on 2 cores)\n"
         "  --metrics-json FILE        per-epoch metrics as JSON\n"
         "  --save-params FILE         final parameters as raw float32 (rank 0)\n"
         "  --trace FILE               Chrome trace of forward/backward/all-reduce/optimizer\n"
         "  --progress, --no-progress  progress bar (default: when stderr is a terminal)\n"
         "  --progress-interval SEC    stderr not a terminal: a progress line on rank 0 every\n"
         "                             SEC seconds (default 30; 0 = none)\n"
         "  --log-file FILE            each rank appends its output to FILE.RANK\n"
         "  --quiet                    warnings and errors only\n"
         "  --device cpu|cuda          (default: cuda when every rank sees a GPU, else cpu)\n"
         "  --conv-algo auto|im2col|onednn   convolutions: oneDNN (when built with it) or\n"
         "                             im2col + GEMM (default auto: oneDNN when available)\n"
         "  --precision fp32|bf16      GEMMs and convolutions: bf16 inputs, fp32 accumulation\n"
         "                             (oneDNN on CPUs with AVX-512 BF16, cuBLAS on GPUs);\n"
         "                             weights, gradients, optimizer stay fp32 (default fp32)\n"
         "  --help, --version\n";
}

const char *mpt_cli_option_name(const char *arg) {
  if (strncmp(arg, "--", 2) != 0 || arg[2] == '\0') return NULL;
  const char *name = arg + 2;
  size_t n = strcspn(name, "=");
  const char *prefix_of = NULL;
  int prefixes = 0;
  for (const struct option *p = long_options; p->name; p++) {
    if (strncmp(p->name, name, n) != 0) continue;
    if (p->name[n] == '\0') return p->name; /* exact */
    prefix_of = p->name;
    prefixes++;
  }
  return prefixes == 1 ? prefix_of : NULL;
}

int mpt_cli_is_gpt(const mpt_cli_options *o) { return strncmp(o->model, "gpt", 3) == 0; }

void mpt_cli_options_default(mpt_cli_options *o) {
  memset(o, 0, sizeof *o);
  snprintf(o->command, sizeof o->command, "train");
  snprintf(o->model, sizeof o->model, "mlp");
  o->mlp = mpt_mlp_config_default();
  o->cnn = mpt_cnn_config_default();
  o->epochs = 10;
  o->batch_size = 64;
  o->optim = mpt_optimizer_config_default();
  o->optim.kind = MPT_OPTIM_SGD;
  o->optim.lr = 0.05f;
  o->optim.momentum = 0.9f;
  o->optim.weight_decay = 5e-4f;
  o->schedule = mpt_lr_schedule_default();
  o->schedule.kind = MPT_LR_COSINE;
  o->schedule.step_size = 0; /* 0: one epoch, filled in by the trainer */
  o->seed = 1;
  o->shuffle = 1;
  o->progress = -1;
  o->ddp = mpt_ddp_config_default();
  o->accumulate = 1;
  o->timeout_s = 300;
  o->mode = MPT_MODE_SINGLE_OR_DDP;
  o->keep = 3;
  o->progress_interval_s = 30;
  mpt_gpt_config_preset("gpt-mini", &o->gpt);
  o->grad_clip = 1.0;
  o->val_steps = 20;
  o->log_every = 10;
}

/* ---- value parsers: 0 ok, -1 error (message written) ---- */

static int fail(char *msg, size_t n, const char *fmt, ...) MPT_PRINTF(3, 4);
static int fail(char *msg, size_t n, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, n, fmt, ap);
  va_end(ap);
  return -1;
}

static int parse_i64(const char *name, const char *s, int64_t lo, int64_t hi, int64_t *out,
                     char *msg, size_t n) {
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (end == s || *end != '\0' || errno == ERANGE)
    return fail(msg, n, "--%s: '%s' is not an integer", name, s);
  if (v < lo || v > hi)
    return fail(msg, n, "--%s: %lld is outside [%lld, %lld]", name, v, (long long)lo,
                (long long)hi);
  *out = v;
  return 0;
}

static int parse_f64(const char *name, const char *s, double lo, double hi, double *out,
                     char *msg, size_t n) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (end == s || *end != '\0' || (errno == ERANGE && fabs(v) >= 1) || !isfinite(v))
    return fail(msg, n, "--%s: '%s' is not a finite number", name, s);
  if (v < lo || v > hi) return fail(msg, n, "--%s: %g is outside [%g, %g]", name, v, lo, hi);
  *out = v == 0 ? 0 : v; /* -0 (an underflow of '-1e-400') as 0 */
  return 0;
}

/* A value the trainers keep in float (learning rates, momentum, weight decay, dropout,
 * --grad-clip...): parse_f64's checks, then a non-zero value below float's smallest normal is
 * refused, as it would become 0 (--lr 1e-50 trained with lr 0, --grad-clip 1e-310 failed at
 * step 1, --momentum 1e-50 ran plain SGD: faults.md F45) or a subnormal (slow, few digits);
 * so is one below a double's ('1e-400', which strtod rounds to 0). */
static int parse_f32(const char *name, const char *s, double lo, double hi, double *out,
                     char *msg, size_t n) {
  double v;
  if (parse_f64(name, s, lo, hi, &v, msg, n) != 0) return -1;
  errno = 0;
  double raw = strtod(s, NULL);
  if ((v != 0 && fabs(v) < FLT_MIN) || (raw == 0 && errno == ERANGE)) /* or under a double's */
    return fail(msg, n, "--%s: %s is below the smallest normal float, %g (the value is used in "
                "single precision): give 0 or a value of at least 1.2e-38", name, s,
                (double)FLT_MIN);
  if (fabs(v) > FLT_MAX)
    return fail(msg, n, "--%s: %g is beyond the largest float, %g (the value is used in single "
                "precision)", name, v, (double)FLT_MAX);
  *out = v;
  return 0;
}

static int copy_str(const char *name, const char *s, char *dst, size_t cap, char *msg,
                    size_t n) {
  if (strlen(s) >= cap) return fail(msg, n, "--%s: value longer than %zu bytes", name, cap - 1);
  if (s[0] == '\0') return fail(msg, n, "--%s: empty value", name);
  memcpy(dst, s, strlen(s) + 1);
  return 0;
}

static int parse_hidden(const char *s, mpt_mlp_config *mlp, char *msg, size_t n) {
  int count = 0;
  const char *p = s;
  while (*p) {
    char *end;
    errno = 0;
    long long v = strtoll(p, &end, 10);
    if (end == p || errno == ERANGE || v < 1 || v > 1 << 20)
      return fail(msg, n, "--hidden: '%s' is not a list of sizes in [1, 1048576]", s);
    if (count == MPT_MLP_MAX_HIDDEN)
      return fail(msg, n, "--hidden: at most %d layers", MPT_MLP_MAX_HIDDEN);
    mlp->hidden[count++] = v;
    if (*end == ',' && end[1] != '\0')
      p = end + 1;
    else if (*end == '\0')
      p = end;
    else
      return fail(msg, n, "--hidden: '%s' is not a list of sizes in [1, 1048576]", s);
  }
  if (count == 0) return fail(msg, n, "--hidden: empty list");
  mlp->num_hidden = count;
  return 0;
}

/* Options of the mlp/cnn trainer that the GPT trainer does not implement: given with --model
 * gpt* they are a usage error rather than silently ignored (a --metrics-json, --trace or
 * --log-file that never appears, a --hidden that changes nothing). */
static int mlp_cnn_only(int c) {
  switch (c) {
    case OPT_DATA: case OPT_SYNTHETIC: case OPT_METRICS: case OPT_SAVE_PARAMS: case OPT_TRACE:
    case OPT_CONV_ALGO: case OPT_HIDDEN: case OPT_BATCHNORM: case OPT_DROPOUT:
    case OPT_TRAIN_LIMIT: case OPT_TEST_LIMIT: case OPT_DEVICES: case OPT_BUFFERS:
    case OPT_SKIP_NONFINITE: case OPT_CHECK_REPLICAS: case OPT_LOG_FILE: case OPT_PROGRESS:
      return 1;
    default:
      return 0;
  }
}

/* The GPT sizes: the preset of --model, then the sizes given (gpt2 and gpt-mini are fixed
 * presets: sizes there are a usage error), then checks that the model can be built. */
static int finish_gpt(mpt_cli_options *o, const int64_t size[5], char *msg, size_t n) {
  int any = 0;
  for (int k = 0; k < 5; k++) any |= size[k] != 0;
  if (strcmp(o->model, "gpt") != 0 && any)
    return fail(msg, n, "--model %s is a preset: --n-layer, --n-head, --n-embd, --seq-len and "
                "--vocab-size need --model gpt", o->model);
  if (mpt_gpt_config_preset(strcmp(o->model, "gpt2") == 0 ? "gpt2" : "gpt-mini", &o->gpt) !=
      MPT_OK)
    return fail(msg, n, "--model %s: no preset", o->model);
  if (size[0]) o->gpt.num_layers = (int)size[0];
  if (size[1]) o->gpt.num_heads = (int)size[1];
  if (size[2]) o->gpt.channels = (int)size[2];
  if (size[3]) o->gpt.max_seq_len = (int)size[3];
  if (size[4]) o->gpt.vocab_size = (int)size[4];
  if (o->gpt.channels % o->gpt.num_heads != 0)
    return fail(msg, n, "--n-embd %d is not a multiple of --n-head %d", o->gpt.channels,
                o->gpt.num_heads);
  o->gpt.padded_vocab_size = (int)mpt_gpt_padded_vocab(o->gpt.vocab_size);
  if (o->shards[0] == '\0')
    return fail(msg, n, "--model %s needs --shards GLOB (token shards: `mpitrain tokenize`)",
                o->model);
  return 0;
}

int mpt_cli_parse(int argc, char **argv, mpt_cli_options *o, char *msg, size_t n) {
  mpt_cli_options_default(o);
  msg[0] = '\0';
  o->argc = argc;
  o->argv = argv;
  if (argc < 2) { /* a bare `mpitrain` prints the usage rather than start a 10-epoch run */
    fail(msg, n, "no command given (expected: train, tokenize or generate)");
    return MPT_CLI_EXIT_USAGE;
  }
  int first = 1;
  if (argv[1][0] != '-') {
    if (strcmp(argv[1], "train") != 0) {
      fail(msg, n, "unknown command '%s' (expected: train, tokenize or generate)", argv[1]);
      return MPT_CLI_EXIT_USAGE;
    }
    first = 2;
  }
  /* getopt_long over argv[first-1..] so that argv[first] is the first option. */
  int sub_argc = argc - first + 1;
  char **sub_argv = argv + first - 1;
  optind = 0; /* glibc: full re-initialisation, so the parser can run more than once */
  opterr = 0;
  int64_t i64;
  double f64;
  int r = 0;
  /* GPT: the sizes given (0 = the preset's) and which generic options were given, so that the
   * GPT defaults apply only where the user said nothing */
  int64_t gpt_size[5] = {0, 0, 0, 0, 0}; /* layers, heads, channels, seq len, vocab */
  int given_opt = 0, given_lr = 0, given_wd = 0, given_batch = 0, given_epochs = 0;
  const char *given_gpt_only = NULL; /* the first GPT-only option given */
  const char *given_not_gpt = NULL; /* the first mlp/cnn-only option given */
  for (;;) {
    int longindex = -1;
    int c = getopt_long(sub_argc, sub_argv, ":", long_options, &longindex);
    if (c == -1) break;
    const char *name = longindex >= 0 ? long_options[longindex].name : "?";
    if (!given_not_gpt && mlp_cnn_only(c)) given_not_gpt = name;
    const char *a = optarg;
    switch (c) {
      case OPT_MODEL:
        if (strcmp(a, "mlp") != 0 && strcmp(a, "cnn") != 0 && strcmp(a, "gpt") != 0 &&
            strcmp(a, "gpt-mini") != 0 && strcmp(a, "gpt2") != 0)
          r = fail(msg, n, "--model: unknown model '%s' (expected mlp, cnn, gpt, gpt-mini or "
                   "gpt2)", a);
        else
          snprintf(o->model, sizeof o->model, "%s", a);
        break;
      case OPT_EPOCHS:
        given_epochs = 1;
        if (!(r = parse_i64(name, a, 1, 100000, &i64, msg, n))) o->epochs = i64;
        break;
      case OPT_BATCH:
        given_batch = 1;
        if (!(r = parse_i64(name, a, 1, 1 << 20, &i64, msg, n))) o->batch_size = i64;
        break;
      case OPT_LR:
        given_lr = 1;
        if (!(r = parse_f32(name, a, 0, 1e3, &f64, msg, n))) o->optim.lr = (float)f64;
        break;
      case OPT_OPTIMIZER:
        given_opt = 1;
        if (mpt_optimizer_kind_parse(a, &o->optim.kind) != MPT_OK)
          r = fail(msg, n, "--optimizer: unknown optimizer '%s' (expected sgd or adamw)", a);
        break;
      case OPT_MOMENTUM:
        if (!(r = parse_f32(name, a, 0, 1, &f64, msg, n))) o->optim.momentum = (float)f64;
        break;
      case OPT_WD:
        given_wd = 1;
        if (!(r = parse_f32(name, a, 0, 1e3, &f64, msg, n))) o->optim.weight_decay = (float)f64;
        break;
      case OPT_NESTEROV:
        o->optim.nesterov = 1;
        break;
      case OPT_NO_DECAY_BIAS_NORM:
        o->no_decay_bias_norm = 1;
        break;
      case OPT_SCHEDULE:
        if (mpt_lr_kind_parse(a, &o->schedule.kind) != MPT_OK)
          r = fail(msg, n, "--schedule: unknown schedule '%s' (constant, step or cosine)", a);
        break;
      case OPT_WARMUP:
        if (!(r = parse_i64(name, a, 0, INT64_C(1) << 40, &i64, msg, n)))
          o->schedule.warmup_steps = i64;
        break;
      case OPT_STEP_SIZE:
        if (!(r = parse_i64(name, a, 1, INT64_C(1) << 40, &i64, msg, n)))
          o->schedule.step_size = i64;
        break;
      case OPT_GAMMA:
        if (!(r = parse_f32(name, a, 1e-9, 1e3, &f64, msg, n))) o->schedule.gamma = (float)f64;
        break;
      case OPT_MIN_LR:
        if (!(r = parse_f32(name, a, 0, 1e3, &f64, msg, n))) o->schedule.min_lr = (float)f64;
        break;
      case OPT_SEED:
        if (!(r = parse_i64(name, a, 0, INT64_MAX, &i64, msg, n))) o->seed = (uint64_t)i64;
        break;
      case OPT_DATA:
        r = copy_str(name, a, o->data_dir, sizeof o->data_dir, msg, n);
        break;
      case OPT_SYNTHETIC:
        o->synthetic = 1;
        break;
      case OPT_THREADS:
        if (!(r = parse_i64(name, a, 1, 1024, &i64, msg, n))) o->threads = (int)i64;
        break;
      case OPT_METRICS:
        r = copy_str(name, a, o->metrics_json, sizeof o->metrics_json, msg, n);
        break;
      case OPT_SAVE_PARAMS:
        r = copy_str(name, a, o->save_params, sizeof o->save_params, msg, n);
        break;
      case OPT_TRACE:
        r = copy_str(name, a, o->trace, sizeof o->trace, msg, n);
        break;
      case OPT_DEVICE:
        if (strcmp(a, "cpu") != 0 && strcmp(a, "cuda") != 0)
          r = fail(msg, n, "--device: unknown device '%s' (expected cpu or cuda)", a);
        else
          snprintf(o->device, sizeof o->device, "%s", a);
        break;
      case OPT_CONV_ALGO:
        if (strcmp(a, "auto") == 0) o->conv_algo = MPT_CONV_ALGO_AUTO;
        else if (strcmp(a, "im2col") == 0) o->conv_algo = MPT_CONV_ALGO_IM2COL;
        else if (strcmp(a, "onednn") == 0) o->conv_algo = MPT_CONV_ALGO_LIBRARY;
        else r = fail(msg, n, "--conv-algo: unknown algorithm '%s' (auto, im2col or onednn)", a);
        break;
      case OPT_HIDDEN:
        r = parse_hidden(a, &o->mlp, msg, n);
        break;
      case OPT_BATCHNORM:
        o->cnn.batchnorm = 1;
        break;
      case OPT_DROPOUT:
        if (!(r = parse_f32(name, a, 0, 0.99, &f64, msg, n)))
          o->mlp.dropout = o->cnn.dropout = (float)f64;
        break;
      case OPT_MAX_STEPS:
        if (!(r = parse_i64(name, a, 0, INT64_C(1) << 40, &i64, msg, n))) o->max_steps = i64;
        break;
      case OPT_TRAIN_LIMIT:
        if (!(r = parse_i64(name, a, 0, INT64_C(1) << 40, &i64, msg, n))) o->train_limit = i64;
        break;
      case OPT_TEST_LIMIT:
        if (!(r = parse_i64(name, a, 0, INT64_C(1) << 40, &i64, msg, n))) o->test_limit = i64;
        break;
      case OPT_NO_SHUFFLE:
        o->shuffle = 0;
        break;
      case OPT_DROP_LAST:
        o->drop_last = 1;
        break;
      case OPT_PROGRESS:
        o->progress = 1;
        break;
      case OPT_NO_PROGRESS:
        o->progress = 0;
        break;
      case OPT_BUCKET_CAP:
        if (!(r = parse_f64(name, a, 1e-6, 1e6, &f64, msg, n))) o->ddp.bucket_cap_mb = f64;
        break;
      case OPT_FIRST_BUCKET_CAP:
        if (!(r = parse_f64(name, a, 1e-6, 1e6, &f64, msg, n))) o->ddp.first_bucket_cap_mb = f64;
        break;
      case OPT_NO_OVERLAP:
        o->ddp.overlap = 0;
        break;
      case OPT_FIND_UNUSED:
        o->ddp.find_unused_parameters = 1;
        break;
      case OPT_ACCUMULATE:
        if (!(r = parse_i64(name, a, 1, 1 << 20, &i64, msg, n))) o->accumulate = (int)i64;
        break;
      case OPT_BUFFERS:
        if (mpt_ddp_buffer_mode_parse(a, &o->ddp.buffers) != MPT_OK)
          r = fail(msg, n, "--buffers: '%s' is not broadcast, average or none", a);
        break;
      case OPT_GRAD_COMM:
        if (mpt_ddp_grad_comm_parse(a, &o->ddp.grad_comm) != MPT_OK)
          r = fail(msg, n, "--grad-comm: '%s' is not fp32 or bf16", a);
        break;
      case OPT_ZERO:
        if (strcmp(a, "0") == 0 || strcmp(a, "1") == 0)
          o->ddp.zero = a[0] - '0';
        else
          r = fail(msg, n, "--zero: '%s' is not a supported ZeRO stage (0: off, 1: sharded "
                   "optimizer state; stages 2 and 3 are not implemented)", a);
        break;
      case OPT_ALLREDUCE_ALGO:
        if (mpt_ddp_allreduce_algo_parse(a, &o->ddp.allreduce) != MPT_OK)
          r = fail(msg, n, "--allreduce-algo: '%s' is not native or rs-ag", a);
        break;
      case OPT_PRECISION:
        if (mpt_precision_parse(a, &o->precision) != MPT_OK)
          r = fail(msg, n, "--precision: '%s' is not fp32 or bf16", a);
        break;
      case OPT_TIMEOUT:
        if (!(r = parse_f64(name, a, 0.001, 1e6, &f64, msg, n))) o->timeout_s = f64;
        break;
      case OPT_CHECK_COLL:
        o->check_collectives = 1;
        break;
      case OPT_MODE:
        if (strcmp(a, "ddp") == 0 || strcmp(a, "single") == 0)
          o->mode = MPT_MODE_SINGLE_OR_DDP;
        else if (strcmp(a, "dp") == 0)
          o->mode = MPT_MODE_DP;
        else
          r = fail(msg, n, "--mode: '%s' is not single, ddp or dp", a);
        break;
      case OPT_DEVICES:
        r = copy_str(name, a, o->devices, sizeof o->devices, msg, n);
        /* A CPU list is checked here (a usage error, status 2); one naming CUDA devices needs
         * the devices present, so the trainer checks it at start. */
        if (!r && !strstr(a, "cuda")) {
          mpt_device devs[MPT_DP_MAX_DEVICES];
          int nd = 0;
          if (mpt_dp_parse_devices(a, devs, MPT_DP_MAX_DEVICES, &nd) != MPT_OK)
            r = fail(msg, n, "--devices: %s", mpt_last_error());
        }
        break;
      case OPT_CKPT_DIR:
        r = copy_str(name, a, o->checkpoint_dir, sizeof o->checkpoint_dir, msg, n);
        break;
      case OPT_CKPT_EVERY:
        if (strcmp(a, "epoch") == 0)
          o->checkpoint_every = 0;
        else if (!(r = parse_i64(name, a, 1, INT64_C(1) << 40, &i64, msg, n)))
          o->checkpoint_every = i64;
        break;
      case OPT_KEEP:
        if (!(r = parse_i64(name, a, 1, 1000000, &i64, msg, n))) o->keep = (int)i64;
        break;
      case OPT_RESUME:
        r = copy_str(name, a, o->resume, sizeof o->resume, msg, n);
        break;
      case OPT_SKIP_NONFINITE:
        o->skip_nonfinite = 1;
        break;
      case OPT_CHECK_REPLICAS:
        if (!(r = parse_i64(name, a, 1, INT64_C(1) << 40, &i64, msg, n))) o->check_replicas = i64;
        break;
      case OPT_STOP_AT:
        if (!(r = parse_i64(name, a, 1, INT64_C(1) << 40, &i64, msg, n))) o->stop_at_step = i64;
        break;
      case OPT_LOG_FILE:
        r = copy_str(name, a, o->log_file, sizeof o->log_file, msg, n);
        break;
      case OPT_QUIET:
        o->quiet = 1;
        break;
      case OPT_PROGRESS_INTERVAL:
        if (!(r = parse_f64(name, a, 0, 1e6, &f64, msg, n))) o->progress_interval_s = f64;
        break;
      case OPT_N_LAYER:
      case OPT_N_HEAD:
      case OPT_N_EMBD:
      case OPT_SEQ_LEN:
      case OPT_VOCAB_SIZE: {
        static const int64_t hi[5] = {1024, 1024, 1 << 16, 1 << 20, 65536};
        int k = c - OPT_N_LAYER;
        if (!given_gpt_only) given_gpt_only = name;
        if (!(r = parse_i64(name, a, 1, hi[k], &i64, msg, n))) gpt_size[k] = i64;
        break;
      }
      case OPT_SHARDS:
        if (!given_gpt_only) given_gpt_only = name;
        r = copy_str(name, a, o->shards, sizeof o->shards, msg, n);
        break;
      case OPT_VAL_SHARDS:
        if (!given_gpt_only) given_gpt_only = name;
        r = copy_str(name, a, o->val_shards, sizeof o->val_shards, msg, n);
        break;
      case OPT_INIT_FROM:
        if (!given_gpt_only) given_gpt_only = name;
        r = copy_str(name, a, o->init_from, sizeof o->init_from, msg, n);
        break;
      case OPT_SAVE_MODEL:
        if (!given_gpt_only) given_gpt_only = name;
        r = copy_str(name, a, o->save_model, sizeof o->save_model, msg, n);
        break;
      case OPT_GRAD_CLIP:
        if (!given_gpt_only) given_gpt_only = name;
        if (!(r = parse_f32(name, a, 0, 1e9, &f64, msg, n))) o->grad_clip = f64;
        break;
      case OPT_VAL_EVERY:
        if (!given_gpt_only) given_gpt_only = name;
        if (!(r = parse_i64(name, a, 0, INT64_C(1) << 40, &i64, msg, n))) o->val_every = i64;
        break;
      case OPT_VAL_STEPS:
        if (!given_gpt_only) given_gpt_only = name;
        if (!(r = parse_i64(name, a, 1, INT64_C(1) << 40, &i64, msg, n))) o->val_steps = i64;
        break;
      case OPT_PROFILE:
        if (!given_gpt_only) given_gpt_only = name;
        o->profile = 1;
        break;
      case OPT_LOG_EVERY:
        if (!given_gpt_only) given_gpt_only = name;
        if (!(r = parse_i64(name, a, 1, INT64_C(1) << 40, &i64, msg, n))) o->log_every = i64;
        break;
      case OPT_HELP:
        snprintf(msg, n, "%s", mpt_cli_usage());
        return MPT_CLI_EXIT_OK;
      case OPT_VERSION:
        snprintf(msg, n, "mpitrain %s", PACKAGE_VERSION);
        snprintf(o->command, sizeof o->command, "version"); /* main.c adds the build's features */
        return MPT_CLI_EXIT_OK;
      case ':':
        r = fail(msg, n, "option '%s' needs a value", sub_argv[optind - 1]);
        break;
      default:
        if (optopt > 0 && optopt < 256)
          r = fail(msg, n, "unknown option '-%c'", optopt);
        else
          r = fail(msg, n, "unknown option '%s'", sub_argv[optind - 1]);
        break;
    }
    if (r) return MPT_CLI_EXIT_USAGE;
  }
  if (optind < sub_argc) {
    const char *extra = sub_argv[optind];
    const size_t len = strlen(extra);
    if (len > 4 && strcmp(extra + len - 4, ".bin") == 0) /* the shell expanded a shard glob */
      fail(msg, n, "unexpected argument '%s': an unquoted --shards or --val-shards glob that the "
           "shell expanded? Quote it, as in --shards 'DIR/train_*.bin'", extra);
    else
      fail(msg, n, "unexpected argument '%s'", extra);
    return MPT_CLI_EXIT_USAGE;
  }
  if (o->optim.nesterov && (o->optim.momentum <= 0 || o->optim.dampening != 0)) {
    fail(msg, n, "--nesterov needs --momentum > 0");
    return MPT_CLI_EXIT_USAGE;
  }
  if (o->mode == MPT_MODE_DP && o->ddp.zero) {
    fail(msg, n, "--zero 1 does not work with --mode dp (DataParallel steps the whole model in "
         "each rank): use --mode ddp");
    return MPT_CLI_EXIT_USAGE;
  }
  if (o->mode == MPT_MODE_DP && o->devices[0] == '\0') {
    fail(msg, n, "--mode dp needs --devices (e.g. cpu:2)");
    return MPT_CLI_EXIT_USAGE;
  }
  if (strcmp(o->resume, "auto") == 0 && o->checkpoint_dir[0] == '\0') {
    fail(msg, n, "--resume auto needs --checkpoint-dir (the directory to resume from)");
    return MPT_CLI_EXIT_USAGE;
  }
  if (mpt_cli_is_gpt(o)) {
    if (finish_gpt(o, gpt_size, msg, n) != 0) return MPT_CLI_EXIT_USAGE;
    if (o->mode == MPT_MODE_DP) {
      fail(msg, n, "--model %s: --mode dp is not wired into the GPT trainer (use DDP: one rank "
           "per device, under mpirun)", o->model);
      return MPT_CLI_EXIT_USAGE;
    }
    if (given_not_gpt) {
      fail(msg, n, "--%s does not apply to --model %s (an option of the mlp and cnn trainer)",
           given_not_gpt, o->model);
      return MPT_CLI_EXIT_USAGE;
    }
    if (o->val_every > 0 && o->val_shards[0] == '\0') {
      fail(msg, n, "--val-every needs --val-shards GLOB (the validation token shards)");
      return MPT_CLI_EXIT_USAGE;
    }
    if (!given_opt) o->optim.kind = MPT_OPTIM_ADAMW;
    if (!given_lr) o->optim.lr = strcmp(o->model, "gpt2") == 0 ? 6e-4f : 1e-3f;
    if (!given_wd) o->optim.weight_decay = 0.1f;
    if (!given_batch) o->batch_size = 8;
    if (!given_epochs) o->epochs = 1;
    o->optim.beta1 = 0.9f;
    o->optim.beta2 = 0.95f;
    o->no_decay_bias_norm = 1;
  } else if (given_gpt_only) {
    fail(msg, n, "--%s needs --model gpt, gpt-mini or gpt2: it applies to language models only, "
         "not to --model %s", given_gpt_only, o->model);
    return MPT_CLI_EXIT_USAGE;
  }
  o->ddp.timeout_ms = o->timeout_s * 1e3;
  o->argc = argc;
  o->argv = argv;
  return MPT_CLI_RUN;
}
