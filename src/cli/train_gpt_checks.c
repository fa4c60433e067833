/* Checks of the GPT trainer (src/cli/train_gpt.c) before it trains:
 * - the training and validation shards are different files (a glob of all the .bin files of
 *   tokenize's folder takes val_*.bin too, and the validation loss then measures memorised
 *   text); files are compared by device and inode, so other spellings of a path count;
 * - options given that have no effect in a GPT run (a --checkpoint-every without
 *   --checkpoint-dir, --momentum with AdamW, DDP options on one rank): a warning each, as the
 *   mlp/cnn trainer gives (train_auto.c);
 * - memory, before anything is allocated: a lower
 * bound of what each rank's model, gradients, optimizer state and forward activations take,
 * against the memory of the host (the smallest of the physical memory, a cgroup v2 limit and
 * RLIMIT_AS) shared by the ranks on it. Sizes past the host otherwise end in the kernel's OOM
 * killer (each allocation alone fits, touching them all does not) rather than in an error.
 * The bound counts only what the current GPT must hold, so it never refuses a run that fits:
 * N parameters and N gradients (fp32), AdamW's 2 N (SGD with momentum N) divided by the ranks
 * (a sharded optimizer holds its part), per token of the B T the 14 C values per layer the
 * forward keeps (the LayerNorm outputs, qkv, attention output, fc and GELU) and the Vp logits,
 * and what the attention layer keeps and takes as it runs (mpt_nn_causal_attention_memory: the
 * fused CPU attention's row statistics per layer and its backward's per-thread scratch; the
 * reference's attention matrix [B, H, T, T] per layer, for bf16 or MPT_ATTENTION=reference),
 * and the samplers' 8 bytes per window; the same for `mpitrain generate` (the parameters held
 * three times and the logits of the context);
 * - --save-model: an existing file there must be a model file, and the writer's temporary file
 *   can be created in its folder;
 * - no shard is taken twice by a glob (a link beside it). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/train_impl.h"
#include "mpitrain.h"

/* The host's memory limit in bytes for this process (0 unknown). */
static double host_memory_nbytes(void) {
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  double limit = pages > 0 && page > 0 ? (double)pages * (double)page : 0;
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

mpt_status trainer_gpt_check_memory(const mpt_cli_options *o, const mpt_gpt_config *cfg,
                                    int world, int local_ranks, int64_t windows) {
  mpt_gpt_layout lay;
  MPT_RETURN_IF(mpt_gpt_layout_compute(cfg, &lay));
  const double n = (double)lay.total, C = cfg->channels, L = cfg->num_layers;
  const double tokens = (double)o->batch_size * cfg->max_seq_len;
  const double Vp = cfg->padded_vocab_size ? cfg->padded_vocab_size
                                           : (double)mpt_gpt_padded_vocab(cfg->vocab_size);
  double state = o->optim.kind == MPT_OPTIM_ADAMW ? 2 * n : o->optim.momentum > 0 ? n : 0;
  double saved = 0, scratch = 0; /* bytes: one layer's, and the largest while it runs */
  mpt_nn_causal_attention_memory(NULL, o->precision, o->batch_size, cfg->max_seq_len,
                                 cfg->num_heads, mpt_cpu_threads(), &saved, &scratch);
  /* the samplers' order: 8 bytes per window, whole on every rank (mpt_sampler) */
  const double need = 4 * (2 * n + state / world + tokens * (14 * L * C + Vp)) + L * saved +
                      scratch + 8 * (double)windows;
  const double have = host_memory_nbytes();
  const double gib = 1024.0 * 1024.0 * 1024.0;
  if (have <= 0 || need * local_ranks <= have) return MPT_OK;
  return MPT_FAIL(MPT_ENOMEM, "--model %s (%.0f parameters, B %lld x T %d) needs at least %.1f "
                  "GiB per rank (parameters, gradients, optimizer state, the forward's "
                  "activations and 8 bytes for each of the shards' %lld windows); this host has "
                  "%.1f GiB for %d rank%s: give %s", o->model, n, (long long)o->batch_size,
                  cfg->max_seq_len, need / gib, (long long)windows, have / gib, local_ranks,
                  local_ranks == 1 ? "" : "s",
                  8 * (double)windows > need / 2
                      ? "fewer shards, or a larger --batch-size or --seq-len (fewer windows)"
                      : "a smaller --batch-size or model, or fewer ranks per host");
}

mpt_status trainer_gpt_check_disjoint(const mpt_token_data *train, const mpt_token_data *val) {
  const int n = mpt_token_data_num_shards(train), m = mpt_token_data_num_shards(val);
  struct stat *ids = malloc((size_t)n * sizeof *ids);
  if (!ids) return MPT_FAIL(MPT_ENOMEM, "out of host memory for %d shards", n);
  mpt_status st = MPT_OK;
  for (int i = 0; i < n; i++)
    if (stat(mpt_token_data_shard_path(train, i), &ids[i]) != 0) ids[i].st_ino = 0;
  for (int j = 0; j < m && st == MPT_OK; j++) {
    struct stat sb;
    if (stat(mpt_token_data_shard_path(val, j), &sb) != 0) continue;
    for (int i = 0; i < n; i++)
      if (ids[i].st_ino == sb.st_ino && ids[i].st_dev == sb.st_dev) {
        st = MPT_FAIL(MPT_EINVAL, "token shard '%s' is both a training shard (--shards) and a "
                      "validation shard (--val-shards, as '%s'): the validation loss would measure "
                      "text trained on; give --shards a glob without it (e.g. 'DIR/train_*.bin')",
                      mpt_token_data_shard_path(train, i), mpt_token_data_shard_path(val, j));
        break;
      }
  }
  free(ids);
  return st;
}

mpt_status trainer_gpt_check_token_ids(mpt_comm *comm, int rank, int world,
                                       const mpt_token_data *train, const mpt_token_data *val) {
  mpt_status st = mpt_token_data_check_ids(train, rank, world);
  if (st == MPT_OK && val) st = mpt_token_data_check_ids(val, rank, world);
  if (world == 1) return st;
  int32_t first_bad = st == MPT_OK ? world : rank; /* the lowest failing rank, or world */
  MPT_RETURN_IF(mpt_comm_allreduce_sync(comm, &first_bad, &first_bad, 1, MPT_I32,
                                        MPT_REDUCE_MIN));
  if (st != MPT_OK || first_bad == world) return st; /* a failing rank keeps its own error */
  return MPT_FAIL(MPT_EFORMAT, "rank %d found bad token data (its error names the shard and "
                  "the offset); every rank stops", (int)first_bad);
}

/* Whether the option `name` was given (also abbreviated, as getopt_long allows). */
static int given(const mpt_cli_options *o, const char *name) {
  for (int i = 1; i < o->argc; i++) {
    const char *opt;
    if (strcmp(o->argv[i], "--") == 0) break;
    if ((opt = mpt_cli_option_name(o->argv[i])) != NULL && strcmp(opt, name) == 0) return 1;
  }
  return 0;
}

static void warn_unused(const mpt_cli_options *o, const char *name, const char *why) {
  if (given(o, name)) mpt_log(MPT_LOG_WARN, "--%s has no effect: %s", name, why);
}

void trainer_gpt_warn_unused(const mpt_cli_options *o, int world) {
  if (!o->checkpoint_dir[0]) {
    warn_unused(o, "checkpoint-every", "no --checkpoint-dir");
    warn_unused(o, "keep", "no --checkpoint-dir");
  }
  if (o->optim.kind != MPT_OPTIM_SGD) {
    warn_unused(o, "momentum", "AdamW has no momentum option (its betas are 0.9, 0.95)");
    warn_unused(o, "nesterov", "it applies to SGD only");
  }
  if (o->schedule.kind != MPT_LR_STEP) {
    warn_unused(o, "step-size", "it applies to --schedule step only");
    warn_unused(o, "gamma", "it applies to --schedule step only");
  }
  if (o->schedule.kind != MPT_LR_COSINE)
    warn_unused(o, "min-lr", "it applies to --schedule cosine only");
  if (world == 1) {
    const char *why = "one rank: there is no DDP engine (run under mpirun -np N)";
    warn_unused(o, "bucket-cap-mb", why);
    warn_unused(o, "first-bucket-cap-mb", why);
    warn_unused(o, "no-overlap", why);
    warn_unused(o, "find-unused-parameters", why);
    warn_unused(o, "grad-comm", why);
    warn_unused(o, "zero", why);
    warn_unused(o, "check-collectives", "one rank: no collective to compare");
  }
}

mpt_status trainer_gpt_check_save_model(const char *path) {
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
  unsigned char head[8];
  const size_t got = fread(head, 1, sizeof head, f);
  fclose(f);
  if (got == 0) return MPT_OK; /* empty: nothing to lose */
  const uint32_t magic = got >= 4 ? (uint32_t)head[0] | (uint32_t)head[1] << 8 |
                                        (uint32_t)head[2] << 16 | (uint32_t)head[3] << 24
                                  : 0;
  if (got >= 4 && magic == MPT_GPT_FILE_MAGIC) return MPT_OK; /* a model file: replaced */
  const char *what = got >= 4 && magic == MPT_SHARD_MAGIC ? "it is a token shard"
                     : got == 8 && memcmp(head, "MPTCKPT", 8) == 0
                         ? "it is an mpitrain checkpoint"
                         : "it does not start with the magic 20240326";
  return MPT_FAIL(MPT_EINVAL, "--save-model '%s' exists and is not an llm.c model file (%s): "
                  "refusing to replace it; remove it or give another path", path, what);
}

mpt_status trainer_gpt_check_generate_memory(const char *path, const mpt_gpt_config *cfg,
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

typedef struct shard_id {
  dev_t dev;
  ino_t ino;
  int index;
} shard_id;

static int shard_id_cmp(const void *a, const void *b) {
  const shard_id *x = a, *y = b;
  if (x->dev != y->dev) return x->dev < y->dev ? -1 : 1;
  if (x->ino != y->ino) return x->ino < y->ino ? -1 : 1;
  return (x->index > y->index) - (x->index < y->index);
}

mpt_status trainer_gpt_check_distinct(const mpt_token_data *d, const char *option) {
  const int n = mpt_token_data_num_shards(d);
  shard_id *ids = malloc((size_t)n * sizeof *ids);
  if (!ids) return MPT_FAIL(MPT_ENOMEM, "out of host memory for %d shards", n);
  int m = 0;
  for (int i = 0; i < n; i++) {
    struct stat sb;
    if (stat(mpt_token_data_shard_path(d, i), &sb) != 0) continue;
    ids[m].dev = sb.st_dev;
    ids[m].ino = sb.st_ino;
    ids[m++].index = i;
  }
  qsort(ids, (size_t)m, sizeof *ids, shard_id_cmp);
  mpt_status st = MPT_OK;
  for (int k = 1; k < m; k++)
    if (ids[k].dev == ids[k - 1].dev && ids[k].ino == ids[k - 1].ino) {
      st = MPT_FAIL(MPT_EINVAL, "%s: '%s' and '%s' are the same file (a link): its windows would "
                    "count twice; give a glob that takes each shard once", option,
                    mpt_token_data_shard_path(d, ids[k - 1].index),
                    mpt_token_data_shard_path(d, ids[k].index));
      break;
    }
  free(ids);
  return st;
}
