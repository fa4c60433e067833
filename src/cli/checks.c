/* The checks of the program that come before a model is built, so they cannot be the loop's:
 * whether the model the options ask for fits in the host's memory (an mlp or cnn: its
 * parameters, gradients and optimizer state; a GPT or a Llama: a lower bound of what each
 * rank holds, activations included; `mpitrain generate`: what sampling holds), and
 * --save-model's path.
 * Sizes past the host otherwise end in the kernel's OOM killer (each allocation alone fits,
 * touching them all does not) rather than in an error. The GPT bound counts only what the
 * current GPT must hold, so it never refuses a run that fits: N parameters and N gradients
 * (fp32), AdamW's 2 N (SGD with momentum N) divided by the ranks (a sharded optimizer holds its
 * part), per token of the B T the 14 C values per layer the forward keeps (the LayerNorm
 * outputs, qkv, attention output, fc and GELU) and the Vp logits, what the attention layer keeps
 * and takes as it runs (mpt_nn_causal_attention_memory), and the samplers' 8 bytes per window
 * (a Llama: its 11 C + 2 KV hd + 3 F values per token and layer, the same otherwise);
 * the memory of the host is the smallest of the physical memory, a cgroup v2 limit and
 * RLIMIT_AS, shared by the ranks on it. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/checks.h"
#include "mpitrain.h"

/* MemAvailable of /proc/meminfo in bytes, or -1 when it cannot be read. */
static double mem_available_bytes(void);

/* The host's memory limit in bytes for this process (0 unknown): the smallest of the physical
 * memory, MemAvailable, a cgroup v2 limit and RLIMIT_AS; MPITRAIN_HOST_MEMORY (bytes, or with
 * a K, M or G suffix) replaces it (a run sized for another host, and the tests). */
static double host_memory_nbytes(void) {
  const char *env = getenv("MPITRAIN_HOST_MEMORY");
  if (env && *env) {
    char *end = NULL;
    double v = strtod(env, &end);
    if (end && (*end == 'K' || *end == 'k')) v *= 1024.0;
    else if (end && (*end == 'M' || *end == 'm')) v *= 1048576.0;
    else if (end && (*end == 'G' || *end == 'g')) v *= 1073741824.0;
    if (v > 0) return v;
  }
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  double limit = pages > 0 && page > 0 ? (double)pages * (double)page : 0;
  const double avail = mem_available_bytes();
  if (avail > 0 && (limit == 0 || avail < limit)) limit = avail;
  FILE *f = fopen("/sys/fs/cgroup/memory.max", "r"); /* "max" or a byte count */
  if (f) {
    double v;
    if (fscanf(f, "%lf", &v) == 1 && v > 0 && (limit == 0 || v < limit)) limit = v;
    fclose(f);
  }
  struct rlimit rl;
  if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
      (limit == 0 || (double)rl.rlim_cur < limit))
    limit = (double)rl.rlim_cur;
  return limit;
}

/* A language model of n parameters, L layers of C channels whose forward keeps `per_layer`
 * floats per token (the head's logits: Vp more), T positions, `heads` attention heads. */
static mpt_status lm_check_memory(const mpt_cli_options *o, double n, double L, double C,
                                  double per_layer,
                                  int max_seq_len, int heads, double Vp, int world,
                                  int local_ranks, int64_t windows) {
  const double tokens = (double)o->batch_size * max_seq_len;
  /* model state per rank by ZeRO stage (at W > 1): 1 shards the optimizer state, 2 the
   * gradients too, 3 the parameters too */
  const int stage = world > 1 ? o->ddp.zero : 0;
  const double params = stage >= 3 ? n / world : n, grads = stage >= 2 ? n / world : n;
  double state = o->optim.kind == MPT_OPTIM_ADAMW ? 2 * n : o->optim.momentum > 0 ? n : 0;
  if (stage >= 1) state /= world;
  double saved = 0, scratch = 0; /* bytes: one layer's, and the largest while it runs */
  mpt_nn_causal_attention_memory(NULL, o->precision, o->batch_size, max_seq_len, heads,
                                 mpt_cpu_threads(), &saved, &scratch);
  /* activations: per_layer per token and layer, or with --recompute each block's input (C) and
   * one block's per_layer while it is recomputed */
  const double acts = o->recompute ? 4 * tokens * (L * C + per_layer + Vp) + saved
                                   : 4 * tokens * (per_layer * L + Vp) + L * saved;
  const double model_state = 4 * (params + grads + state);
  /* the samplers' order: 8 bytes per window, whole on every rank (mpt_sampler) */
  const double need = model_state + acts + scratch + 8 * (double)windows;
  const double have = host_memory_nbytes();
  const double gib = 1024.0 * 1024.0 * 1024.0;
  if (have <= 0 || need * local_ranks <= have) return MPT_OK;
  char stage_s[32] = "";
  if (stage) snprintf(stage_s, sizeof stage_s, " under ZeRO-%d", stage);
  return MPT_FAIL(MPT_ENOMEM, "--model %s (%.0f parameters, B %lld x T %d) needs at least %.1f "
                  "GiB per rank (model state %.2f GiB%s: parameters %.2f, gradients %.2f, "
                  "optimizer state %.2f; activations %.2f GiB%s; the attention's scratch and 8 "
                  "bytes for each of the shards' %lld windows); this host has %.1f GiB for %d "
                  "rank%s: give %s", o->model, n, (long long)o->batch_size, max_seq_len,
                  need / gib, model_state / gib, stage_s, 4 * params / gib, 4 * grads / gib,
                  4 * state / gib, acts / gib, o->recompute ? " with --recompute" : "",
                  (long long)windows, have / gib, local_ranks, local_ranks == 1 ? "" : "s",
                  8 * (double)windows > need / 2
                      ? "fewer shards, or a larger --batch-size or --seq-len (fewer windows)"
                  : model_state > acts && stage < 3 && world > 1
                      ? "a higher --zero stage (3 shards the parameters too), fewer ranks per "
                        "host, or a smaller model"
                  : !o->recompute
                      ? "--recompute, a smaller --batch-size or model, or fewer ranks per host"
                      : "a smaller --batch-size or model, or fewer ranks per host");
}

mpt_status mpt_cli_gpt_check_memory(const mpt_cli_options *o, const mpt_gpt_config *cfg,
                                    int world, int local_ranks, int64_t windows) {
  mpt_gpt_layout lay;
  MPT_RETURN_IF(mpt_gpt_layout_compute(cfg, &lay));
  const double Vp = cfg->padded_vocab_size ? cfg->padded_vocab_size
                                           : (double)mpt_gpt_padded_vocab(cfg->vocab_size);
  /* per token and layer: the LayerNorm outputs, qkv, attention output, fc and GELU: 14 C */
  return lm_check_memory(o, (double)lay.total, cfg->num_layers, cfg->channels,
                         14.0 * cfg->channels,
                         cfg->max_seq_len, cfg->num_heads, Vp, world, local_ranks, windows);
}

mpt_status mpt_cli_llama_check_memory(const mpt_cli_options *o, const mpt_llama_config *cfg,
                                      int world, int local_ranks, int64_t windows) {
  MPT_RETURN_IF(mpt_llama_config_check(cfg));
  const double C = cfg->dim, kv = (double)cfg->n_kv_heads * (cfg->dim / cfg->n_heads);
  /* per token and layer: the two norms' outputs, q, k, v, the packed [3C] attention input,
   * its output, o_proj's, the two residual sums, down_proj's (11 C), and gate, up and their
   * product (3 F) */
  return lm_check_memory(o, (double)mpt_llama_param_count(cfg), cfg->n_layers, C,
                         11 * C + 2 * kv + 3.0 * cfg->ffn_dim, cfg->max_seq_len, cfg->n_heads,
                         cfg->vocab_size, world, local_ranks, windows);
}

mpt_status mpt_cli_gpt_check_save_model(const char *path) {
  /* The file is written as PATH.tmp.PID then renamed (core/atomic_file.c): create and remove
   * that file now, so that a folder that refuses it although access(2) allowed it (procfs,
   * NFS with root squashed) fails here rather than after the whole run. */
  char probe[4200];
  snprintf(probe, sizeof probe, "%s.tmp.%ld", path, (long)getpid());
  int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0)
    return MPT_FAIL(MPT_EINVAL, "--save-model '%s': cannot create '%s' (%s): the model could "
                    "not be written at the end of the run", path, probe, strerror(errno));
  close(fd);
  unlink(probe);
  FILE *f = fopen(path, "rb");
  if (!f) return MPT_OK; /* a new file (or one trainer_check_output_path judged) */
  unsigned char head[9];
  const size_t got = fread(head, 1, sizeof head, f);
  fclose(f);
  if (got == 0) return MPT_OK; /* empty: nothing to lose */
  const uint32_t magic = got >= 4 ? (uint32_t)head[0] | (uint32_t)head[1] << 8 |
                                        (uint32_t)head[2] << 16 | (uint32_t)head[3] << 24
                                  : 0;
  if (got >= 4 && magic == MPT_GPT_FILE_MAGIC) return MPT_OK; /* a model file: replaced */
  if (got == 9 && head[8] == '{' && mpt_gpt_st_is_path(path))
    return MPT_OK; /* a safetensors file (a JSON header after its length): replaced */
  const char *what = got >= 4 && magic == MPT_SHARD_MAGIC ? "it is a token shard"
                     : got >= 8 && memcmp(head, "MPTCKPT", 8) == 0
                         ? "it is an mpitrain checkpoint"
                         : "it does not start with the magic 20240326";
  return MPT_FAIL(MPT_EINVAL, "--save-model '%s' exists and is not an llm.c model file (%s): "
                  "refusing to replace it; remove it or give another path", path, what);
}

mpt_status mpt_cli_gpt_check_generate_memory(const char *path, const mpt_gpt_config *cfg,
                                             int64_t context) {
  mpt_gpt_layout lay;
  MPT_RETURN_IF(mpt_gpt_layout_compute(cfg, &lay));
  const double Vp = cfg->padded_vocab_size ? cfg->padded_vocab_size
                                           : (double)mpt_gpt_padded_vocab(cfg->vocab_size);
  /* the parameters, their gradients (the model holds both), the file's staging copy, and the
   * logits [context, Vp] of the last forward */
  const double need = 4 * (3 * (double)lay.total + (double)context * Vp);
  const double have = host_memory_nbytes();
  const double gib = 1024.0 * 1024.0 * 1024.0;
  if (have <= 0 || need <= have) return MPT_OK;
  return MPT_FAIL(MPT_ENOMEM, "model file '%s' (%lld parameters, a context of %lld tokens) "
                  "needs at least %.1f GiB to sample from (parameters, gradients, the file's "
                  "copy and the logits); this host has %.1f GiB%s", path, (long long)lay.total,
                  (long long)context, need / gib, have / gib,
                  (double)context * Vp > 3 * (double)lay.total
                      ? ": give fewer --tokens or a shorter --prompt" : "");
}

mpt_status mpt_cli_llama_check_generate_memory(const char *path, const mpt_llama_config *cfg,
                                               int64_t context) {
  MPT_RETURN_IF(mpt_llama_config_check(cfg));
  const double n = (double)mpt_llama_param_count(cfg), V = cfg->vocab_size;
  /* the parameters and their gradients (the model holds both), the largest tensor's staging
   * copy (the embedding, V C), and the logits [context, V] of the last forward */
  const double need = 4 * (2 * n + V * cfg->dim + (double)context * V);
  const double have = host_memory_nbytes();
  const double gib = 1024.0 * 1024.0 * 1024.0;
  if (have <= 0 || need <= have) return MPT_OK;
  return MPT_FAIL(MPT_ENOMEM, "model '%s' (%.0f parameters, a context of %lld tokens) needs at "
                  "least %.1f GiB to sample from (parameters, gradients, staging and the "
                  "logits); this host has %.1f GiB", path, n, (long long)context, need / gib,
                  have / gib);
}

/* The parameter count the options ask for, computed in double (a --hidden list can exceed
 * int64 products only in theory, but the estimate must not wrap). */
static double model_params_estimate(const mpt_cli_options *o) {
  if (strcmp(o->model, "cnn") == 0) {
    const mpt_cnn_config *c = &o->cnn;
    const double k2 = (double)c->kernel * (double)c->kernel;
    const double flat = (double)c->conv2_channels * (double)(c->height / 4) * (double)(c->width / 4);
    return (double)c->in_channels * c->conv1_channels * k2 + c->conv1_channels +
           (double)c->conv1_channels * c->conv2_channels * k2 + c->conv2_channels +
           flat * c->hidden + c->hidden + (double)c->hidden * c->num_classes + c->num_classes;
  }
  const mpt_mlp_config *m = &o->mlp;
  double total = 0, in = (double)m->input_size;
  for (int i = 0; i < m->num_hidden; i++) {
    total += in * (double)m->hidden[i] + (double)m->hidden[i];
    in = (double)m->hidden[i];
  }
  return total + in * (double)m->num_classes + (double)m->num_classes;
}

/* MemAvailable of /proc/meminfo in bytes, or -1 when it cannot be read. */
static double mem_available_bytes(void) {
  FILE *f = fopen("/proc/meminfo", "r");
  if (!f) return -1;
  char line[256];
  double kib = -1;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "MemAvailable: %lf kB", &kib) == 1) break;
  fclose(f);
  return kib < 0 ? -1 : kib * 1024.0;
}

/* Before allocating an mlp or cnn on the CPU: parameters, gradients and optimizer state (1
 * buffer for SGD momentum, 2 for AdamW), per DP replica (ndev), must fit in this host's available
 * memory shared by its ranks; otherwise the kernel's OOM killer ends the job with no message
 * (seen with --hidden 100000,100000). A rough lower bound: activations and the data come on top.
 * Errors: MPT_ENOMEM naming both sizes. */
mpt_status mpt_cli_check_model_fits(const mpt_cli_options *o, mpt_comm *comm, int ndev) {
  const double params = model_params_estimate(o);
  /* Optimizer state: AdamW 2 floats per parameter, SGD 1; ZeRO-1 keeps 1/W of it per rank,
   * ZeRO-2 of the gradients too, ZeRO-3 of the parameters too. */
  const int world = mpt_comm_world_size(comm), z = world > 1 ? o->ddp.zero : 0;
  const double states = (o->optim.kind == MPT_OPTIM_ADAMW ? 2.0 : 1.0) / (z ? world : 1);
  const double grads = z >= 2 ? 1.0 / world : 1.0, weights = z >= 3 ? 1.0 / world : 1.0;
  const double need = params * sizeof(float) * (weights + grads + states) * (ndev > 0 ? ndev : 1);
  const double avail = host_memory_nbytes();
  const int local = mpt_comm_local_size(comm) > 0 ? mpt_comm_local_size(comm) : 1;
  if (avail > 0 && need > avail / local)
    return MPT_FAIL(MPT_ENOMEM, "model %s: %.3g parameters need at least %.1f GiB per rank "
                    "(parameters, gradients and optimizer state%s), but this host has %.1f GiB "
                    "available for %d rank(s): use a smaller model (--hidden)",
                    o->model, params, need / 1073741824.0,
                    ndev > 1 ? ", per DP replica" : "", avail / 1073741824.0, local);
  return MPT_OK;
}

