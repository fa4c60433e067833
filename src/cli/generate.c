/* `mpitrain generate --model-file F [--prompt TEXT] [--tokens N] [--temperature X] [--top-k K]
 * [--seed S]`: samples a continuation from a GPT-2 model (an llm.c file or Hugging Face
 * safetensors) or a Llama (Hugging Face safetensors, config.json saying so), one process, CPU.
 *
 * The model's sizes come from the file's header. With a byte vocabulary (V = 256) the prompt is
 * text (each byte a token; default a newline) and the output is text; otherwise the prompt is a
 * list of token ids (default V - 1, GPT-2's end-of-text id 50256 for V = 50257) and the output
 * is token ids, one per line. Each new token: a forward over the last T tokens of the context
 * (no cache: O(N T) work per token, fine for the small models this is meant for), the logits
 * of the last position over the V real columns, divided by the temperature, kept to the top K,
 * softmax in double, and one draw from an mpt_rng seeded with --seed (the same seed, model and
 * prompt give the same text); temperature 0 is greedy (the arg max). */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/generate.h"
#include "cli/checks.h"
#include "mpitrain.h"

static const char *usage_text =
    "usage: mpitrain generate --model-file FILE [options]\n"
    "Samples a continuation from a GPT-2 or Llama model (e.g. from --save-model): an\n"
    "llm.c model file (GPT-2), or Hugging Face safetensors (a folder with config.json and\n"
    "model.safetensors or a sharded model.safetensors.index.json, or X.safetensors with\n"
    "config.json beside it; a Llama when config.json says model_type \"llama\").\n"
    "  --model-file FILE     the model (required)\n"
    "  --prompt TEXT         the start: text for a byte vocabulary (256; default a newline),\n"
    "                        else token ids separated by spaces (default the last id)\n"
    "  --tokens N            tokens to generate, 1 .. 1000000 (default 256)\n"
    "  --temperature X       logits are divided by X, in [0, 100]; 0 = greedy (default 1)\n"
    "  --top-k K             sample among the K likeliest tokens (default 0: all)\n"
    "  --seed N              seed of the sampling (default 1)\n"
    "  -h, --help            this text\n";

static int usage_error(const char *fmt, ...) MPT_PRINTF(1, 2);
static int usage_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "mpitrain generate: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n(mpitrain generate --help lists the options)\n");
  va_end(ap);
  return 2;
}

static int parse_num(const char *name, const char *s, double lo, double hi, double *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno == ERANGE && fabs(v) < 1) errno = 0; /* an underflow ('1e-310') is a small number */
  if (errno || end == s || *end || !isfinite(v) || v < lo || v > hi) return -1;
  (void)name;
  *out = v;
  return 0;
}

/* The prompt as tokens into toks[cap]; returns the count, or -1 (message printed). */
static int64_t prompt_tokens(const char *prompt, int vocab, int32_t *toks, int64_t cap) {
  int64_t n = 0;
  if (vocab == 256) {
    const char *p = prompt ? prompt : "\n";
    for (; *p && n < cap; p++) toks[n++] = (unsigned char)*p;
    return n;
  }
  if (!prompt) {
    toks[0] = vocab - 1;
    return 1;
  }
  const char *p = prompt;
  while (*p && n < cap) {
    char *end;
    errno = 0;
    long v = strtol(p, &end, 10);
    if (end == p || errno || v < 0 || v >= vocab) {
      fprintf(stderr, "mpitrain generate: --prompt: '%s' is not a list of token ids in [0, %d) "
              "(the model's vocabulary is not bytes)\n", prompt, vocab);
      return -1;
    }
    toks[n++] = (int32_t)v;
    p = end;
    while (*p == ' ' || *p == ',') p++;
  }
  return n;
}

static int descending(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x < y) - (x > y);
}

/* The next token from logits[V] (all finite). */
static int32_t sample(const float *logits, int vocab, double temperature, int top_k,
                      mpt_rng *rng, double *probs) {
  int best = 0;
  for (int j = 1; j < vocab; j++)
    if (logits[j] > logits[best]) best = j;
  if (temperature == 0) return best;
  /* the k-th largest logit is the threshold (ties at it are kept); a sort, O(V log V) whatever
   * k (a selection of k passes took V k steps: seconds per token for k near 50257) */
  double threshold = -INFINITY;
  if (top_k > 0 && top_k < vocab) {
    for (int j = 0; j < vocab; j++) probs[j] = logits[j];
    qsort(probs, (size_t)vocab, sizeof *probs, descending);
    threshold = probs[top_k - 1];
  }
  double sum = 0;
  for (int j = 0; j < vocab; j++) {
    probs[j] = logits[j] >= threshold ? exp(((double)logits[j] - logits[best]) / temperature)
                                      : 0.0;
    sum += probs[j];
  }
  double u = (double)mpt_rng_uniform(rng) * sum, acc = 0;
  for (int j = 0; j < vocab; j++) {
    acc += probs[j];
    if (u < acc) return j;
  }
  return best;
}

int mpt_cli_generate(int argc, char **argv) {
  static const struct option opts[] = {
      {"model-file", required_argument, NULL, 'm'}, {"prompt", required_argument, NULL, 'p'},
      {"tokens", required_argument, NULL, 'n'},     {"temperature", required_argument, NULL, 't'},
      {"top-k", required_argument, NULL, 'k'},      {"seed", required_argument, NULL, 's'},
      {"help", no_argument, NULL, 'h'},             {NULL, 0, NULL, 0},
  };
  const char *path = NULL, *prompt = NULL;
  double ntok = 256, temperature = 1, top_k = 0, seed = 1;
  optind = 0;
  opterr = 0;
  int c;
  while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
    switch (c) {
      case 'm': path = optarg; break;
      case 'p': prompt = optarg; break;
      case 'n':
        if (parse_num("tokens", optarg, 1, 1e6, &ntok) || ntok != floor(ntok))
          return usage_error("--tokens '%s' must be an integer in [1, 1000000]", optarg);
        break;
      case 't':
        if (parse_num("temperature", optarg, 0, 100, &temperature))
          return usage_error("--temperature '%s' must be a number in [0, 100]", optarg);
        break;
      case 'k':
        if (parse_num("top-k", optarg, 0, 1 << 20, &top_k) || top_k != floor(top_k))
          return usage_error("--top-k '%s' must be an integer in [0, 1048576]", optarg);
        break;
      case 's':
        if (parse_num("seed", optarg, 0, 9007199254740992.0, &seed) || seed != floor(seed))
          return usage_error("--seed '%s' must be an integer in [0, 9007199254740992]", optarg);
        break;
      case 'h': printf("%s", usage_text); return 0;
      case ':': return usage_error("option '%s' needs a value", argv[optind - 1]);
      default: return usage_error("unknown option '%s'", argv[optind - 1]);
    }
  }
  if (optind < argc) return usage_error("unexpected argument '%s'", argv[optind]);
  if (!path) return usage_error("give the model with --model-file FILE");

  int rc = 1;
  mpt_model *model = NULL;
  mpt_tape *tape = NULL;
  int32_t *ctx = NULL;
  double *probs = NULL;
  mpt_gpt_config cfg;
  mpt_llama_config lcfg;
  const int llama = mpt_llama_st_is_model(path);
  mpt_status st = llama ? mpt_llama_st_read_header(path, &lcfg)
                        : mpt_gpt_file_read_header(path, &cfg);
  if (st != MPT_OK) {
    fprintf(stderr, "mpitrain generate: %s: %s\n", mpt_status_message(st), mpt_last_error());
    goto out;
  }
  /* the logits' rows are Vp wide (the GPT's padded vocabulary), a Llama's V */
  const int64_t T = llama ? lcfg.max_seq_len : cfg.max_seq_len;
  const int64_t V = llama ? lcfg.vocab_size : cfg.vocab_size;
  const int64_t Vp = llama ? V : cfg.padded_vocab_size;
  const int64_t plen = prompt ? (int64_t)strlen(prompt) + 1 : 1;
  const int64_t cap = plen + (int64_t)ntok;
  ctx = malloc((size_t)cap * sizeof *ctx);
  probs = malloc((size_t)V * sizeof *probs);
  if (!ctx || !probs) {
    fprintf(stderr, "mpitrain generate: out of memory\n");
    goto out;
  }
  int64_t n = prompt_tokens(prompt, (int)V, ctx, cap);
  if (n < 0) {
    rc = 2;
    goto out;
  }
  if (n == 0) {
    rc = usage_error("--prompt is empty");
    goto out;
  }
  /* before the model's allocations: refused rather than killed for memory */
  const int64_t context = n + (int64_t)ntok < T ? n + (int64_t)ntok : T;
  if (llama) {
    st = mpt_cli_llama_check_generate_memory(path, &lcfg, context);
    if (st == MPT_OK) st = mpt_model_init_llama(&model, mpt_device_cpu(), &lcfg, 0);
    if (st == MPT_OK) st = mpt_llama_load(model, &lcfg, path);
  } else {
    st = mpt_cli_gpt_check_generate_memory(path, &cfg, context);
    if (st == MPT_OK) st = mpt_model_init_gpt(&model, mpt_device_cpu(), &cfg, 0);
    if (st == MPT_OK) st = mpt_gpt_load(model, &cfg, path);
  }
  if (st == MPT_OK) st = mpt_tape_init(&tape, model, NULL);
  if (st != MPT_OK) {
    fprintf(stderr, "mpitrain generate: %s: %s\n", mpt_status_message(st), mpt_last_error());
    goto out;
  }
  mpt_tape_set_grad_enabled(tape, 0);
  const int bytes = V == 256;
  for (int64_t i = 0; i < n && bytes; i++) putchar(ctx[i]);
  mpt_rng rng;
  mpt_rng_seed(&rng, (uint64_t)seed);
  for (int64_t i = 0; i < (int64_t)ntok; i++) {
    const int64_t len = n < T ? n : T;
    const int64_t shape[2] = {1, len};
    mpt_tensor toks = mpt_tensor_view(ctx + n - len, mpt_device_cpu(), MPT_I32, 2, shape);
    mpt_var *x, *logits;
    mpt_tape_reset(tape, 0);
    st = mpt_tape_input(tape, &toks, &x);
    if (st == MPT_OK) st = mpt_model_forward(model, tape, x, &logits);
    if (st != MPT_OK) {
      fprintf(stderr, "mpitrain generate: %s: %s\n", mpt_status_message(st), mpt_last_error());
      goto out;
    }
    const float *last = (const float *)mpt_var_value(logits)->data + (len - 1) * Vp;
    for (int64_t j = 0; j < V; j++) /* else every draw silently falls back to token 0 */
      if (!isfinite(last[j])) {
        fprintf(stderr, "\nmpitrain generate: the logit of token %lld is %g after %lld generated "
                "token(s): the model's arithmetic overflows float32 (weights too large?)\n",
                (long long)j, (double)last[j], (long long)i);
        goto out;
      }
    int32_t next = sample(last, (int)V, temperature, (int)top_k, &rng, probs);
    ctx[n++] = next;
    if (bytes)
      putchar(next);
    else
      printf("%d\n", next);
    if (ferror(stdout)) break; /* reported below */
  }
  if (bytes) putchar('\n');
  if (fflush(stdout) != 0 || ferror(stdout)) { /* a full disk, a closed pipe: not a success */
    fprintf(stderr, "mpitrain generate: cannot write the output: %s\n", strerror(errno));
    goto out;
  }
  rc = 0;
out:
  free(probs);
  free(ctx);
  mpt_tape_free(tape);
  mpt_model_free(model);
  return rc;
}
