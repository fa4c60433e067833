/* libFuzzer target: the command-line parser (mpt_cli_parse, src/cli/options.c).
 *
 * The input is split on NUL bytes into arguments: argv = {"mpitrain", piece 0, piece 1, ...}
 * (at most MAX_ARGS pieces; the command itself, "train", is one of the fuzzed pieces). Checked:
 * - no crash, hang or out-of-bounds access (the msg buffer is allocated to its exact size);
 * - the result is MPT_CLI_RUN, MPT_CLI_EXIT_OK or MPT_CLI_EXIT_USAGE, and the parse is repeatable:
 *   a second call on a fresh copy of argv (getopt permutes it) gives the same result and
 *   options, also with a tiny msg buffer (the message is then a truncated prefix);
 * - EXIT_OK and EXIT_USAGE come with a non-empty message; RUN with an empty one;
 * - on RUN every option is within the range the trainer relies on: epochs >= 1, batch and
 *   accumulate >= 0 (0 is auto, resolved on resume), finite learning rate and schedule
 *   parameters, the optimizer config passes
 *   mpt_optimizer_config_validate, the schedule (completed the way the trainer completes it)
 *   passes mpt_lr_schedule_validate and gives non-negative rates (finite, except a step
 *   schedule with gamma > 1, which may overflow to +inf after many steps, or to NaN = 0 * inf
 *   with --lr 0), MLP sizes in range,
 *   every string NUL-terminated inside its field, and the cross-option rules (nesterov needs
 *   momentum, dp mode needs devices). */
#include <math.h>

#include "cli/options.h"
#include "fuzz_common.h"

#define MAX_ARGS 64

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_str(const char *field, size_t cap, const char *what, int may_be_empty) {
  if (!memchr(field, '\0', cap)) fuzz_fail("%s is not NUL-terminated", what);
  if (!may_be_empty && field[0] == '\0') fuzz_fail("%s is empty", what);
}

static void check_finite(double v, double lo, double hi, const char *what) {
  if (!isfinite(v) || v < lo || v > hi) fuzz_fail("%s = %g outside [%g, %g]", what, v, lo, hi);
}

static void check_run(const mpt_cli_options *o) {
  check_str(o->command, sizeof o->command, "command", 0);
  if (strcmp(o->command, "train") != 0) fuzz_fail("command '%s'", o->command);
  if (strcmp(o->model, "mlp") != 0 && strcmp(o->model, "cnn") != 0 && !mpt_cli_is_gpt(o))
    fuzz_fail("model '%.16s'", o->model);
  if (mpt_cli_is_gpt(o)) { /* a GPT's sizes, as the parser promises to check them */
    const mpt_gpt_config *g = &o->gpt;
    if (g->num_layers < 1 || g->num_heads < 1 || g->channels < 1 ||
        g->channels % g->num_heads != 0 || g->max_seq_len < 1 || g->vocab_size < 1 ||
        g->padded_vocab_size < g->vocab_size || o->shards[0] == '\0')
      fuzz_fail("gpt config out of range: L %d H %d C %d T %d V %d Vp %d shards '%.32s'",
                g->num_layers, g->num_heads, g->channels, g->max_seq_len, g->vocab_size,
                g->padded_vocab_size, o->shards);
    check_finite(o->grad_clip, 0, 1e30, "grad clip");
  }
  if (o->epochs < 1 || o->batch_size < 0 || o->accumulate < 0 || o->max_steps < 0 ||
      o->train_limit < 0 || o->test_limit < 0 || o->checkpoint_every < 0 || o->keep < 1 ||
      o->stop_at_step < 0 || o->threads < 0)
    fuzz_fail("integer option out of range: epochs %lld batch %lld accumulate %d max-steps %lld "
              "limits %lld/%lld checkpoint-every %lld keep %d stop-at %lld threads %d",
              (long long)o->epochs, (long long)o->batch_size, o->accumulate,
              (long long)o->max_steps, (long long)o->train_limit, (long long)o->test_limit,
              (long long)o->checkpoint_every, o->keep, (long long)o->stop_at_step, o->threads);
  check_finite(o->optim.lr, 0, 1e3, "lr");
  check_finite(o->optim.momentum, 0, 1, "momentum");
  check_finite(o->optim.weight_decay, 0, 1e3, "weight decay");
  /* float fields: the parser checks the double, the float may round just past the bound */
  check_finite(o->mlp.dropout, 0, (float)0.99, "mlp dropout");
  check_finite(o->cnn.dropout, 0, (float)0.99, "cnn dropout");
  check_finite(o->timeout_s, 1e-3, 1e6, "timeout");
  check_finite(o->ddp.timeout_ms, 1, 1e9, "ddp timeout_ms");
  check_finite(o->ddp.bucket_cap_mb, 1e-6, 1e6, "bucket cap");
  check_finite(o->ddp.first_bucket_cap_mb, 1e-6, 1e6, "first bucket cap");
  if (mpt_optimizer_config_validate(&o->optim) != MPT_OK)
    fuzz_fail("optimizer config rejected: %s", mpt_last_error());
  if (o->mlp.num_hidden < 1 || o->mlp.num_hidden > MPT_MLP_MAX_HIDDEN)
    fuzz_fail("num_hidden %d", o->mlp.num_hidden);
  for (int i = 0; i < o->mlp.num_hidden; i++)
    if (o->mlp.hidden[i] < 1 || o->mlp.hidden[i] > (1 << 20))
      fuzz_fail("hidden[%d] = %lld", i, (long long)o->mlp.hidden[i]);
  if (o->optim.nesterov && !(o->optim.momentum > 0)) fuzz_fail("nesterov without momentum");
  if (o->precision != MPT_PRECISION_FP32 && o->precision != MPT_PRECISION_BF16)
    fuzz_fail("precision %d", (int)o->precision);
  if (o->mode != MPT_MODE_SINGLE_OR_DDP && o->mode != MPT_MODE_DP) fuzz_fail("mode %d", o->mode);
  if (o->ddp.zero < 0 || o->ddp.zero > 3 || (o->ddp.zero && o->mode == MPT_MODE_DP))
    fuzz_fail("zero stage %d with mode %d", o->ddp.zero, o->mode);
  check_str(o->devices, sizeof o->devices, "devices", o->mode != MPT_MODE_DP);
  check_str(o->data_dir, sizeof o->data_dir, "data", 1);
  check_str(o->metrics_json, sizeof o->metrics_json, "metrics-json", 1);
  check_str(o->save_params, sizeof o->save_params, "save-params", 1);
  check_str(o->trace, sizeof o->trace, "trace", 1);
  check_str(o->checkpoint_dir, sizeof o->checkpoint_dir, "checkpoint-dir", 1);
  check_str(o->resume, sizeof o->resume, "resume", 1);
  check_str(o->device, sizeof o->device, "device", 1);
  if (o->device[0] && strcmp(o->device, "cpu") != 0 && strcmp(o->device, "cuda") != 0)
    fuzz_fail("device '%s'", o->device);
  if (o->progress < -1 || o->progress > 1) fuzz_fail("progress %d", o->progress);

  /* The schedule, completed as src/cli/train.c does (here with 7 steps per epoch). */
  mpt_lr_schedule s = o->schedule;
  const int64_t steps_per_epoch = 7;
  if (s.step_size <= 0) s.step_size = steps_per_epoch;
  if (s.kind == MPT_LR_COSINE) s.total_steps = steps_per_epoch * o->epochs;
  if (s.total_steps <= s.warmup_steps) s.total_steps = s.warmup_steps + 1;
  if (mpt_lr_schedule_validate(&s) != MPT_OK)
    fuzz_fail("schedule rejected: %s", mpt_last_error());
  const int64_t steps[5] = {0, 1, s.warmup_steps, s.total_steps, INT64_C(1) << 41};
  for (int i = 0; i < 5; i++) {
    float lr = mpt_lr_at(&s, o->optim.lr, steps[i]);
    /* A step schedule with gamma > 1 grows without bound (as torch's StepLR does): there, and
     * only there, +inf is allowed, and NaN (0 * inf) with a base lr of 0 (the optimizer then
     * refuses the step with MPT_EINVAL: reported, not a crash). */
    int may_grow = s.kind == MPT_LR_STEP && s.gamma > 1;
    if ((isnan(lr) && !(may_grow && o->optim.lr == 0)) || lr < 0 || (isinf(lr) && !may_grow))
      fuzz_fail("lr at step %lld is %g", (long long)steps[i], (double)lr);
  }
}

/* Field-by-field (the structs' padding bytes are not compared). */
static int options_equal(const mpt_cli_options *a, const mpt_cli_options *b) {
#define SAME(f) (a->f == b->f)
#define SAME_STR(f) (strcmp(a->f, b->f) == 0)
  int same = SAME_STR(command) && SAME_STR(model) && SAME(epochs) && SAME(batch_size) &&
             SAME(max_steps) && SAME(train_limit) && SAME(test_limit) && SAME(seed) &&
             SAME_STR(data_dir) && SAME(synthetic) && SAME(threads) && SAME_STR(metrics_json) &&
             SAME_STR(save_params) && SAME_STR(trace) && SAME_STR(device) && SAME(shuffle) &&
             SAME(drop_last) && SAME(progress) && SAME(accumulate) && SAME(timeout_s) &&
             SAME(check_collectives) && SAME(mode) && SAME_STR(devices) &&
             SAME_STR(checkpoint_dir) && SAME(checkpoint_every) && SAME(keep) &&
             SAME_STR(resume) && SAME(stop_at_step) && SAME(mlp.num_hidden) &&
             SAME(mlp.dropout) && SAME(cnn.dropout) && SAME(cnn.batchnorm) &&
             SAME(optim.kind) && SAME(optim.lr) && SAME(optim.momentum) &&
             SAME(optim.nesterov) && SAME(optim.weight_decay) && SAME(schedule.kind) &&
             SAME(schedule.step_size) && SAME(schedule.gamma) && SAME(schedule.min_lr) &&
             SAME(schedule.warmup_steps) && SAME(ddp.bucket_cap_mb) &&
             SAME(ddp.first_bucket_cap_mb) && SAME(ddp.overlap) &&
             SAME(ddp.find_unused_parameters) && SAME(ddp.buffers) && SAME(ddp.timeout_ms);
  for (int i = 0; same && i < a->mlp.num_hidden && i < MPT_MLP_MAX_HIDDEN; i++)
    same = SAME(mlp.hidden[i]);
#undef SAME
#undef SAME_STR
  return same;
}

/* Splits data into argv (into the caller's arrays) and returns argc. */
static int make_argv(const char *buf, size_t size, char **argv) {
  int argc = 0;
  argv[argc++] = (char *)"mpitrain";
  size_t start = 0;
  for (size_t i = 0; i <= size && argc <= MAX_ARGS; i++) {
    if (i == size || buf[i] == '\0') {
      if (i == size && i == start && size > 0) break; /* a trailing NUL ends the last piece */
      argv[argc++] = (char *)buf + start;
      start = i + 1;
    }
  }
  argv[argc] = NULL;
  return argc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > 1 << 16) return 0;
  /* Two copies: each parse may permute its argv (and keeps pointers into the strings). */
  char *buf1 = malloc(size + 1), *buf2 = malloc(size + 1);
  if (!buf1 || !buf2) fuzz_fail("out of memory");
  memcpy(buf1, data, size);
  memcpy(buf2, data, size);
  buf1[size] = buf2[size] = '\0';
  char *argv1[MAX_ARGS + 2], *argv2[MAX_ARGS + 2];
  int argc = make_argv(buf1, size, argv1);
  make_argv(buf2, size, argv2);

  static mpt_cli_options o1, o2;
  const size_t big = 8192;
  char *msg = malloc(big);
  if (!msg) fuzz_fail("out of memory");
  int r1 = mpt_cli_parse(argc, argv1, &o1, msg, big);
  if (r1 != MPT_CLI_RUN && r1 != MPT_CLI_EXIT_OK && r1 != MPT_CLI_EXIT_USAGE)
    fuzz_fail("mpt_cli_parse returned %d", r1);
  if (!memchr(msg, '\0', big)) fuzz_fail("message not NUL-terminated");
  if ((r1 == MPT_CLI_RUN) != (msg[0] == '\0'))
    fuzz_fail("result %d with message '%.200s'", r1, msg);
  if (r1 == MPT_CLI_RUN) check_run(&o1);

  /* Again, with a small exact-size message buffer (ASan catches a write past it). */
  size_t small = 1 + size % 40;
  char *msg2 = malloc(small);
  if (!msg2) fuzz_fail("out of memory");
  int r2 = mpt_cli_parse(argc, argv2, &o2, msg2, small);
  if (r2 != r1) fuzz_fail("second parse returned %d, first %d", r2, r1);
  if (!memchr(msg2, '\0', small) || strncmp(msg2, msg, small - 1) != 0)
    fuzz_fail("message with a %zu-byte buffer is not a prefix of the full one", small);
  if (r1 == MPT_CLI_RUN && !options_equal(&o1, &o2))
    fuzz_fail("second parse gave different options");
  free(msg2);
  free(msg);
  free(buf1);
  free(buf2);
  return 0;
}
