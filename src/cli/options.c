/* Command-line parsing for `mpitrain train` with getopt_long, from one table (OPTIONS below):
 * a row per option gives its name, how its value is parsed and into which field, its range,
 * the model families that take it, its section and help text. From the table come getopt's
 * list, the usage text (and so the manual page) and the refusal, with the model's reason, of
 * an option the chosen model does not take. Pure: fills a struct or a one-line message; prints
 * nothing. Every numeric value is parsed completely (trailing junk, overflow, NaN and
 * infinities are errors) and range-checked here, so the trainer can trust it. */
#include "cli/options.h"

#include <errno.h>
#include <float.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "mpitrain/dp.h"
#include "mpitrain/llama.h"
#include "mpitrain/transformer.h"

#include "cli/option_table.h"

enum {
#define X(id, ...) OPT_##id,
  OPTIONS(X)
#undef X
      OPT_COUNT
};

typedef struct option_row {
  const char *name;
  parse_kind kind;
  struct {
    size_t offset, size;
  } at;
  double lo, hi;
  int families;
  const char *section, *arg, *help, *not_for;
} option_row;

static const option_row rows[OPT_COUNT] = {
#define X(id, name, kind, field, lo, hi, fam, sec, arg, help, why) \
  {name, kind, field, (double)(lo), (double)(hi), fam, sec, arg, help, why},
    OPTIONS(X)
#undef X
};

_Static_assert(OPT_COUNT <= MPT_CLI_MAX_OPTIONS, "mpt_cli_options.given is too small");

/* getopt_long's list: val is the row's index + 256 (above any short option). */
static struct option long_options[OPT_COUNT + 1];

static void make_long_options(void) {
  if (long_options[0].name) return;
  for (int i = 0; i < OPT_COUNT; i++) {
    const int has_arg = rows[i].kind != P_ON && rows[i].kind != P_OFF && rows[i].arg[0] != '\0';
    long_options[i] = (struct option){rows[i].name, has_arg ? required_argument : no_argument,
                                      NULL, 256 + i};
  }
}

/* The usage, from the table: a heading per section, then "  --name ARG" and the help text at
 * column 29 (on the next line when the option is longer). */
const char *mpt_cli_usage(void) {
  static char text[16384];
  if (text[0]) return text;
  size_t n = 0;
#define PUT(...) \
  n += (size_t)snprintf(text + n, n < sizeof text ? sizeof text - n : 0, __VA_ARGS__)
  PUT("usage: mpitrain train [options]      (run under mpirun -np N for DDP)\n"
      "       mpitrain tokenize --help, mpitrain generate --help,\n"
      "       mpitrain hang-report DIR [--json]   (why a job hung: docs/hangs.md)\n"
      "       mpitrain ckpt info FILE|DIR   (what a checkpoint holds: docs/checkpoints.md)\n"
      "Options marked [mlp cnn], [gpt] or [gpt llama] apply to those models only; every\n"
      "other option works with every model.\n");
  const char *section = "";
  for (int i = 0; i < OPT_COUNT; i++) {
    const option_row *r = &rows[i];
    if (!r->section[0]) continue;
    if (strcmp(r->section, section) != 0) {
      PUT("%s:\n", section = r->section);
      if (strncmp(section, "language models", 15) == 0) /* whose shape comes from where */
        PUT("  A GPT's shape: --n-layer, --n-head, --n-embd, --vocab-size (GPT only). A\n"
            "  Llama's is fixed: its preset's (llama-tiny, llama-mini) or --init-from's\n"
            "  config.json.\n");
    }
    char spec[96];
    snprintf(spec, sizeof spec, "--%s%s%s", r->name, r->arg[0] ? " " : "", r->arg);
    const char *fam = r->families == ALL ? "" : r->families == IMG ? " [mlp cnn]"
                      : r->families == MLP ? " [mlp]" : r->families == CNN ? " [cnn]"
                      : r->families == GPT ? " [gpt]" : r->families == LLAMA ? " [llama]"
                      : r->families == LM ? " [gpt llama]" : "";
    /* the model tag ends the entry's last line */
    const char *h = r->help;
    size_t len = strcspn(h, "\n");
    const char *tag = h[len] ? "" : fam;
    if (strlen(spec) <= 25)
      PUT("  %-26s %.*s%s\n", spec, (int)len, h, tag);
    else
      PUT("  %s   %.*s%s\n", spec, (int)len, h, tag);
    for (h += len; *h == '\n';) {
      h++;
      len = strcspn(h, "\n");
      PUT("%29s%.*s%s\n", "", (int)len, h, h[len] ? "" : fam);
      h += len;
    }
  }
  PUT("  --help, --version\n");
#undef PUT
  return text;
}

const char *mpt_cli_option_name(const char *arg) {
  if (strncmp(arg, "--", 2) != 0 || arg[2] == '\0') return NULL;
  const char *name = arg + 2;
  const size_t n = strcspn(name, "=");
  const char *prefix_of = NULL;
  int prefixes = 0;
  for (int i = 0; i < OPT_COUNT; i++) {
    if (strncmp(rows[i].name, name, n) != 0) continue;
    if (rows[i].name[n] == '\0') return rows[i].name; /* exact */
    prefix_of = rows[i].name;
    prefixes++;
  }
  return prefixes == 1 ? prefix_of : NULL;
}

int mpt_cli_given(const mpt_cli_options *o, const char *name) {
  for (int i = 0; i < OPT_COUNT; i++)
    if (strcmp(rows[i].name, name) == 0) return o->given[i];
  return 0;
}

int mpt_cli_is_gpt(const mpt_cli_options *o) { return strncmp(o->model, "gpt", 3) == 0; }
int mpt_cli_is_llama(const mpt_cli_options *o) { return strncmp(o->model, "llama", 5) == 0; }
int mpt_cli_is_lm(const mpt_cli_options *o) { return mpt_cli_is_gpt(o) || mpt_cli_is_llama(o); }

static int family_of(const char *model) {
  return strncmp(model, "gpt", 3) == 0     ? GPT
         : strncmp(model, "llama", 5) == 0 ? LLAMA
         : strcmp(model, "cnn") == 0       ? CNN
                                           : MLP;
}

void mpt_cli_options_default(mpt_cli_options *o) {
  memset(o, 0, sizeof *o);
  snprintf(o->command, sizeof o->command, "train");
  snprintf(o->model, sizeof o->model, "mlp");
  o->mlp = mpt_mlp_config_default();
  o->cnn = mpt_cnn_config_default();
  o->epochs = 10;
  o->batch_size = MPT_CLI_DEFAULT_BATCH;
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
  o->flight_recorder = 2000;
  o->straggler_warn = 1.2;
  mpt_gpt_config_preset("gpt-mini", &o->gpt);
  mpt_llama_config_preset("llama-tiny", &o->llama);
  o->save = mpt_st_save_options_default();
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

/* A value the trainer keeps in float (learning rates, momentum, weight decay, dropout,
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

/* The generic kinds: a value into its field, range-checked. */
static int parse_row(const option_row *r, const char *a, mpt_cli_options *o, char *msg,
                     size_t n) {
  char *field = (char *)o + r->at.offset;
  int64_t i64;
  double f64;
  switch (r->kind) {
    case P_I64:
      if (parse_i64(r->name, a, (int64_t)r->lo, (int64_t)r->hi, &i64, msg, n)) return -1;
      *(int64_t *)field = i64;
      return 0;
    case P_INT:
      if (parse_i64(r->name, a, (int64_t)r->lo, (int64_t)r->hi, &i64, msg, n)) return -1;
      *(int *)field = (int)i64;
      return 0;
    case P_F64:
      if (parse_f64(r->name, a, r->lo, r->hi, &f64, msg, n)) return -1;
      *(double *)field = f64;
      return 0;
    case P_F32:
      if (parse_f32(r->name, a, r->lo, r->hi, &f64, msg, n)) return -1;
      *(float *)field = (float)f64;
      return 0;
    case P_F32D:
      if (parse_f32(r->name, a, r->lo, r->hi, &f64, msg, n)) return -1;
      *(double *)field = f64;
      return 0;
    case P_STR:
      return copy_str(r->name, a, field, r->at.size, msg, n);
    case P_ON:
      *(int *)field = 1;
      return 0;
    case P_OFF:
      *(int *)field = 0;
      return 0;
    case P_FN:
      break;
  }
  return fail(msg, n, "--%s: no parser", r->name);
}

/* The options whose value is more than a number or a string. */
static int parse_special(int id, const char *a, mpt_cli_options *o, int64_t *gpt_size,
                         char *msg, size_t n) {
  const char *name = rows[id].name;
  int64_t i64;
  double f64;
  switch (id) {
    case OPT_MODEL:
      if (strcmp(a, "mlp") != 0 && strcmp(a, "cnn") != 0 && strcmp(a, "gpt") != 0 &&
          strcmp(a, "gpt-mini") != 0 && strcmp(a, "gpt2") != 0 &&
          strcmp(a, "gpt2-medium") != 0 && strcmp(a, "gpt2-large") != 0 &&
          strcmp(a, "llama-tiny") != 0 && strcmp(a, "llama-mini") != 0 && strcmp(a, "llama") != 0)
        return fail(msg, n, "--model: unknown model '%s' (expected mlp, cnn, gpt, gpt-mini, "
                    "gpt2, gpt2-medium, gpt2-large, llama-tiny, llama-mini or llama)", a);
      snprintf(o->model, sizeof o->model, "%s", a);
      return 0;
    case OPT_HIDDEN:
      return parse_hidden(a, &o->mlp, msg, n);
    case OPT_DROPOUT:
      if (parse_f32(name, a, 0, 0.99, &f64, msg, n)) return -1;
      o->mlp.dropout = o->cnn.dropout = (float)f64;
      return 0;
    case OPT_N_LAYER: case OPT_N_HEAD: case OPT_N_EMBD: case OPT_SEQ_LEN: case OPT_VOCAB_SIZE:
      if (parse_i64(name, a, (int64_t)rows[id].lo, (int64_t)rows[id].hi, &i64, msg, n))
        return -1;
      gpt_size[id - OPT_N_LAYER] = i64;
      return 0;
    case OPT_OPTIMIZER:
      if (mpt_optimizer_kind_parse(a, &o->optim.kind) != MPT_OK)
        return fail(msg, n, "--optimizer: unknown optimizer '%s' (expected sgd or adamw)", a);
      return 0;
    case OPT_SCHEDULE:
      if (mpt_lr_kind_parse(a, &o->schedule.kind) != MPT_OK)
        return fail(msg, n, "--schedule: unknown schedule '%s' (constant, step or cosine)", a);
      return 0;
    case OPT_BATCH: case OPT_ACCUMULATE: /* auto: 0, resolved by mpt_trainer_plan_resume */
      if (strcmp(a, "auto") == 0)
        i64 = 0;
      else if (parse_i64(name, a, (int64_t)rows[id].lo, (int64_t)rows[id].hi, &i64, msg, n))
        return -1;
      if (id == OPT_BATCH) o->batch_size = i64;
      else o->accumulate = (int)i64;
      return 0;
    case OPT_SEED:
      if (parse_i64(name, a, 0, INT64_MAX, &i64, msg, n)) return -1;
      o->seed = (uint64_t)i64;
      return 0;
    case OPT_BUFFERS:
      if (mpt_ddp_buffer_mode_parse(a, &o->ddp.buffers) != MPT_OK)
        return fail(msg, n, "--buffers: '%s' is not broadcast, average or none", a);
      return 0;
    case OPT_GRAD_COMM:
      if (mpt_ddp_grad_comm_parse(a, &o->ddp.grad_comm) != MPT_OK)
        return fail(msg, n, "--grad-comm: '%s' is not fp32 or bf16", a);
      return 0;
    case OPT_ZERO:
      if (strcmp(a, "0") != 0 && strcmp(a, "1") != 0 && strcmp(a, "2") != 0 &&
          strcmp(a, "3") != 0)
        return fail(msg, n, "--zero: '%s' is not a supported ZeRO stage (0: off, 1: sharded "
                    "optimizer state, 2: and sharded gradients, 3: and sharded parameters)", a);
      o->ddp.zero = a[0] - '0';
      return 0;
    case OPT_ALLREDUCE_ALGO:
      if (mpt_ddp_allreduce_algo_parse(a, &o->ddp.allreduce) != MPT_OK)
        return fail(msg, n, "--allreduce-algo: '%s' is not native or rs-ag", a);
      return 0;
    case OPT_MODE:
      if (strcmp(a, "ddp") == 0 || strcmp(a, "single") == 0)
        o->mode = MPT_MODE_SINGLE_OR_DDP;
      else if (strcmp(a, "dp") == 0)
        o->mode = MPT_MODE_DP;
      else
        return fail(msg, n, "--mode: '%s' is not single, ddp or dp", a);
      return 0;
    case OPT_DEVICES:
      if (copy_str(name, a, o->devices, sizeof o->devices, msg, n)) return -1;
      /* A CPU list is checked here (a usage error, status 2); one naming CUDA devices needs
       * the devices present, so the trainer checks it at start. */
      if (!strstr(a, "cuda")) {
        mpt_device devs[MPT_DP_MAX_DEVICES];
        int nd = 0;
        if (mpt_dp_parse_devices(a, devs, MPT_DP_MAX_DEVICES, &nd) != MPT_OK)
          return fail(msg, n, "--devices: %s", mpt_last_error());
      }
      return 0;
    case OPT_CKPT_EVERY:
      if (strcmp(a, "epoch") == 0) {
        o->checkpoint_every = 0;
        return 0;
      }
      if (parse_i64(name, a, 1, BIG, &i64, msg, n)) return -1;
      o->checkpoint_every = i64;
      return 0;
    case OPT_CKPT_ASYNC:
      if (strcmp(a, "on") == 0 || strcmp(a, "off") == 0) {
        o->checkpoint_async = strcmp(a, "on") == 0;
        return 0;
      }
      return fail(msg, n, "--checkpoint-async: '%s' is not on or off", a);
    case OPT_PROGRESS:
      o->progress = 1;
      return 0;
    case OPT_NO_PROGRESS:
      o->progress = 0;
      return 0;
    case OPT_DEVICE:
      if (strcmp(a, "cpu") != 0 && strcmp(a, "cuda") != 0)
        return fail(msg, n, "--device: unknown device '%s' (expected cpu or cuda)", a);
      snprintf(o->device, sizeof o->device, "%s", a);
      return 0;
    case OPT_CONV_ALGO:
      if (strcmp(a, "auto") == 0) o->conv_algo = MPT_CONV_ALGO_AUTO;
      else if (strcmp(a, "im2col") == 0) o->conv_algo = MPT_CONV_ALGO_IM2COL;
      else if (strcmp(a, "onednn") == 0) o->conv_algo = MPT_CONV_ALGO_LIBRARY;
      else return fail(msg, n, "--conv-algo: unknown algorithm '%s' (auto, im2col or onednn)", a);
      return 0;
    case OPT_GEMM:
      if (strcmp(a, "auto") == 0) o->gemm = MPT_CPU_GEMM_AUTO;
      else if (strcmp(a, "openblas") == 0) o->gemm = MPT_CPU_GEMM_OPENBLAS;
      else if (strcmp(a, "onednn") == 0) o->gemm = MPT_CPU_GEMM_ONEDNN;
      else if (strcmp(a, "tune") == 0) o->gemm = MPT_CPU_GEMM_TUNE;
      else return fail(msg, n, "--gemm: unknown library '%s' (auto, openblas, onednn or tune)", a);
      return 0;
    case OPT_PRECISION:
      if (mpt_precision_parse(a, &o->precision) != MPT_OK)
        return fail(msg, n, "--precision: '%s' is not fp32 or bf16", a);
      return 0;
    case OPT_SAVE_DTYPE:
      if (strcmp(a, "fp32") != 0 && strcmp(a, "bf16") != 0)
        return fail(msg, n, "--save-dtype: '%s' is not fp32 or bf16", a);
      o->save.dtype = strcmp(a, "bf16") == 0 ? MPT_ST_BF16 : MPT_ST_F32;
      snprintf(o->save_given, sizeof o->save_given, "%s", name);
      return 0;
    case OPT_SAVE_SHARD_SIZE:
      if (mpt_st_parse_size(a, &o->save.shard_nbytes) != MPT_OK)
        return fail(msg, n, "--save-shard-size: %s", mpt_last_error());
      snprintf(o->save_given, sizeof o->save_given, "%s", name);
      return 0;
    default:
      return fail(msg, n, "--%s: no parser", name);
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
  if (mpt_gpt_config_preset(strcmp(o->model, "gpt") == 0 ? "gpt-mini" : o->model, &o->gpt) !=
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
  return 0;
}

/* A Llama's sizes: its preset's, or (--model llama) those of --init-from's config.json, read
 * when the run starts; --seq-len, the training window. */
static int finish_llama(mpt_cli_options *o, const int64_t size[5], char *msg, size_t n) {
  o->llama_seq_len = (int)size[3];
  if (strcmp(o->model, "llama") == 0) {
    if (!o->init_from[0])
      return fail(msg, n, "--model llama takes its shape from a Hugging Face model's "
                  "config.json: give --init-from DIR|X.safetensors (or a preset: llama-tiny, "
                  "llama-mini)");
    return 0;
  }
  if (mpt_llama_config_preset(o->model, &o->llama) != MPT_OK)
    return fail(msg, n, "--model %s: no preset", o->model);
  if (o->llama_seq_len > o->llama.max_seq_len)
    return fail(msg, n, "--seq-len %d is longer than --model %s's T %d", o->llama_seq_len,
                o->model, o->llama.max_seq_len);
  return 0;
}

/* What the language models share: their data, and their defaults. */
static int finish_lm(mpt_cli_options *o, char *msg, size_t n) {
  if (o->shards[0] == '\0')
    return fail(msg, n, "--model %s needs --shards GLOB (token shards: `mpitrain tokenize`)",
                o->model);
  /* the GPT's defaults, where the user said nothing (llm.c's and nanoGPT's choices); the
   * Llama takes them too */
  if (!o->given[OPT_OPTIMIZER]) o->optim.kind = MPT_OPTIM_ADAMW;
  if (!o->given[OPT_LR]) /* GPT-3's table for these sizes (Brown et al., 2020) */
    o->optim.lr = strcmp(o->model, "gpt2") == 0          ? 6e-4f
                  : strcmp(o->model, "gpt2-medium") == 0 ? 3e-4f
                  : strcmp(o->model, "gpt2-large") == 0  ? 2.5e-4f
                                                         : 1e-3f;
  if (!o->given[OPT_WD]) o->optim.weight_decay = 0.1f;
  if (!o->given[OPT_BATCH]) o->batch_size = MPT_CLI_DEFAULT_GPT_BATCH;
  if (!o->given[OPT_EPOCHS]) o->epochs = 1;
  if (!o->given[OPT_ADAM_BETA2]) o->optim.beta2 = 0.95f;
  if (!o->given[OPT_GRAD_CLIP]) o->grad_clip = 1.0;
  if (!o->given[OPT_VAL_STEPS]) o->val_steps = 20;
  if (!o->given[OPT_LOG_EVERY]) o->log_every = 10;
  o->no_decay_bias_norm = 1;
  return 0;
}

/* Checks across options, once all are read. */
static int finish(mpt_cli_options *o, const int64_t *gpt_size, char *msg, size_t n) {
  const int family = family_of(o->model);
  for (int i = 0; i < OPT_COUNT; i++) /* the first option given that the model does not take */
    if (o->given[i] && !(rows[i].families & family))
      return fail(msg, n, "--%s does not apply to --model %s: %s", rows[i].name, o->model,
                  rows[i].not_for);
  if (o->optim.nesterov && (o->optim.momentum <= 0 || o->optim.dampening != 0))
    return fail(msg, n, "--nesterov needs --momentum > 0");
  if (o->mode == MPT_MODE_DP && o->ddp.zero)
    return fail(msg, n, "--zero %d does not work with --mode dp (DataParallel steps the whole "
                "model in each rank): use --mode ddp", o->ddp.zero);
  if (o->mode == MPT_MODE_DP && o->devices[0] == '\0')
    return fail(msg, n, "--mode dp needs --devices (e.g. cpu:2)");
  if (strcmp(o->resume, "auto") == 0 && o->checkpoint_dir[0] == '\0')
    return fail(msg, n, "--resume auto needs --checkpoint-dir (the directory to resume from)");
  if (o->save_given[0] && !o->save_model[0])
    return fail(msg, n, "--%s needs --save-model (a safetensors file or folder)",
                o->save_given);
  if (family & LM) {
    if (family == GPT ? finish_gpt(o, gpt_size, msg, n) != 0 : finish_llama(o, gpt_size, msg, n) != 0)
      return -1;
    if (finish_lm(o, msg, n) != 0) return -1;
    if (o->val_every > 0 && o->val_shards[0] == '\0')
      return fail(msg, n, "--val-every needs --val-shards GLOB (the validation token shards)");
  }
  o->ddp.timeout_ms = o->timeout_s * 1e3;
  return 0;
}

int mpt_cli_parse(int argc, char **argv, mpt_cli_options *o, char *msg, size_t n) {
  mpt_cli_options_default(o);
  make_long_options();
  msg[0] = '\0';
  o->argc = argc;
  o->argv = argv;
  if (argc < 2) { /* a bare `mpitrain` prints the usage rather than start a 10-epoch run */
    fail(msg, n, "no command given (expected: train, tokenize, generate, hang-report or "
         "ckpt)");
    return MPT_CLI_EXIT_USAGE;
  }
  int first = 1;
  if (argv[1][0] != '-') {
    if (strcmp(argv[1], "train") != 0) {
      fail(msg, n, "unknown command '%s' (expected: train, tokenize, generate, "
           "hang-report or ckpt)", argv[1]);
      return MPT_CLI_EXIT_USAGE;
    }
    first = 2;
  }
  /* getopt_long over argv[first-1..] so that argv[first] is the first option. */
  int sub_argc = argc - first + 1;
  char **sub_argv = argv + first - 1;
  optind = 0; /* glibc: full re-initialisation, so the parser can run more than once */
  opterr = 0;
  int64_t gpt_size[5] = {0, 0, 0, 0, 0}; /* layers, heads, channels, seq len, vocab */
  for (;;) {
    int longindex = -1;
    const int c = getopt_long(sub_argc, sub_argv, ":", long_options, &longindex);
    if (c == -1) break;
    if (c == ':') {
      fail(msg, n, "option '%s' needs a value", sub_argv[optind - 1]);
      return MPT_CLI_EXIT_USAGE;
    }
    if (c < 256 || c >= 256 + OPT_COUNT) {
      if (optopt > 0 && optopt < 256)
        fail(msg, n, "unknown option '-%c'", optopt);
      else
        fail(msg, n, "unknown option '%s'", sub_argv[optind - 1]);
      return MPT_CLI_EXIT_USAGE;
    }
    const int id = c - 256;
    o->given[id] = 1;
    if (id == OPT_HELP) {
      snprintf(msg, n, "%s", mpt_cli_usage());
      return MPT_CLI_EXIT_OK;
    }
    if (id == OPT_VERSION) {
      snprintf(msg, n, "mpitrain %s", PACKAGE_VERSION);
      snprintf(o->command, sizeof o->command, "version"); /* main.c adds the build's features */
      return MPT_CLI_EXIT_OK;
    }
    const int r = rows[id].kind == P_FN ? parse_special(id, optarg, o, gpt_size, msg, n)
                                        : parse_row(&rows[id], optarg, o, msg, n);
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
  if (finish(o, gpt_size, msg, n) != 0) return MPT_CLI_EXIT_USAGE;
  o->argc = argc;
  o->argv = argv;
  return MPT_CLI_RUN;
}
