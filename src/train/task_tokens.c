/* The built-in language-model task (trainer.h mpt_train_task_tokens): windows of B x T tokens
 * from llm.c token shards (mpitrain/data.h mpt_token_data; one data sample is one window of B
 * rows), the per-token cross-entropy over the vocabulary, and the checks before training:
 * - no shard is taken twice by a glob (a link beside it), and no validation shard is a training
 *   shard (a glob of all of tokenize's .bin files takes val_*.bin too, and the validation loss
 *   then measures memorised text); files are compared by device and inode;
 * - the ranks read the same shards: ranks started with the same glob from different working
 *   directories (or on hosts whose copies differ) hold different windows; with different window
 *   counts each rank's sampler deals a different epoch, the ranks run different numbers of steps
 *   and their collectives no longer pair up (one rank's all-reduce of 2 floats met another's
 *   gradient bucket: MPI_ERR_TRUNCATE, or a bus error in the shared-memory transport); with the
 *   same counts and other text they train silently on data that was not meant. Each rank
 *   fingerprints its shards (the number of shards, tokens and windows, and a CRC-32 over each
 *   shard's token count and a sample of its bytes: the whole shard up to SAMPLE_ALL_NBYTES, else
 *   SAMPLE_BLOCKS blocks spread evenly over it, the first and the last included: at most 1 MiB
 *   read per shard) and the ranks compare; a difference stops every rank, naming the rank, what
 *   differs and the first shard each read (shards that differ only between the sampled blocks
 *   are not caught);
 * - every token id the windows can read is below the vocabulary, before step 1 (each rank
 *   checks its share of the shards, then the ranks agree), not when its window comes up hours in.
 * Collective checks run on the training thread. */
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "mpitrain/transformer.h"
#include "train/train_impl.h"

typedef struct tokens_task {
  mpt_train_task task; /* first: the public part, then how to free it (mpt_train_task_free) */
  void (*destroy)(void *self);
  mpt_token_data *train, *val;
  mpt_data_source *train_source, *val_source;
  int vocab_size;
} tokens_task;

#define SAMPLE_ALL_NBYTES (1 << 20)
#define SAMPLE_BLOCKS 16
#define SAMPLE_BLOCK_NBYTES (64 * 1024)

enum { F_SHARDS, F_TOKENS_LO, F_TOKENS_HI, F_WINDOWS_LO, F_WINDOWS_HI, F_CRC, NFIELDS };
enum { PATH_BYTES = 512, HOST_BYTES = 64, RECORD_BYTES = 2 * PATH_BYTES + HOST_BYTES };

/* Folds `nbytes` bytes of `path` at `offset` into *crc; MPT_EIO naming the file. */
static mpt_status crc_range(int fd, const char *path, int64_t offset, int64_t nbytes,
                            unsigned char *buf, uLong *crc) {
  int64_t got = 0;
  while (got < nbytes) {
    ssize_t n = pread(fd, buf, (size_t)(nbytes - got), (off_t)(offset + got));
    if (n <= 0)
      return MPT_FAIL(MPT_EIO, "token shard '%s': cannot read %lld bytes at byte offset %lld "
                      "for the data check", path, (long long)(nbytes - got),
                      (long long)(offset + got));
    *crc = crc32(*crc, buf, (uInt)n);
    got += n;
  }
  return MPT_OK;
}

/* The fingerprint of `d` (NULL: all zero) into f[NFIELDS]. */
static mpt_status fingerprint(const mpt_token_data *d, int32_t *f) {
  memset(f, 0, sizeof(int32_t) * NFIELDS);
  if (!d) return MPT_OK;
  const int n = mpt_token_data_num_shards(d);
  const int64_t tokens = mpt_token_data_num_tokens(d), windows = mpt_token_data_num_windows(d);
  unsigned char *buf = malloc(SAMPLE_BLOCK_NBYTES);
  if (!buf) return MPT_FAIL(MPT_ENOMEM, "out of host memory for the data check");
  uLong crc = crc32(0L, Z_NULL, 0);
  mpt_status st = MPT_OK;
  for (int i = 0; i < n && st == MPT_OK; i++) {
    const char *path = mpt_token_data_shard_path(d, i);
    const int64_t count = mpt_token_data_shard_tokens(d, i);
    const int64_t nbytes = MPT_SHARD_HEADER_NBYTES + 2 * count;
    unsigned char c8[8];
    for (int k = 0; k < 8; k++) c8[k] = (unsigned char)((uint64_t)count >> (8 * k));
    crc = crc32(crc, c8, 8);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      st = MPT_FAIL(MPT_EIO, "token shard '%s': cannot open it again for the data check", path);
      break;
    }
    if (nbytes <= SAMPLE_ALL_NBYTES) {
      for (int64_t off = 0; off < nbytes && st == MPT_OK; off += SAMPLE_BLOCK_NBYTES)
        st = crc_range(fd, path, off, nbytes - off < SAMPLE_BLOCK_NBYTES ? nbytes - off
                                                                       : SAMPLE_BLOCK_NBYTES,
                       buf, &crc);
    } else {
      const int64_t last = nbytes - SAMPLE_BLOCK_NBYTES; /* the last block's offset */
      for (int b = 0; b < SAMPLE_BLOCKS && st == MPT_OK; b++)
        st = crc_range(fd, path, last * b / (SAMPLE_BLOCKS - 1), SAMPLE_BLOCK_NBYTES, buf, &crc);
    }
    close(fd);
  }
  free(buf);
  f[F_SHARDS] = n;
  f[F_TOKENS_LO] = (int32_t)(uint32_t)((uint64_t)tokens & 0xffffffffu);
  f[F_TOKENS_HI] = (int32_t)(uint32_t)((uint64_t)tokens >> 32);
  f[F_WINDOWS_LO] = (int32_t)(uint32_t)((uint64_t)windows & 0xffffffffu);
  f[F_WINDOWS_HI] = (int32_t)(uint32_t)((uint64_t)windows >> 32);
  f[F_CRC] = (int32_t)(uint32_t)crc;
  return st;
}

/* A field's value as the message gives it. */
static void field_text(const int32_t *f, int k, char *out, size_t n) {
  if (k == F_CRC) {
    snprintf(out, n, "CRC-32 %08" PRIx32, (uint32_t)f[F_CRC]);
  } else if (k == F_SHARDS) {
    snprintf(out, n, "%" PRId32, f[F_SHARDS]);
  } else {
    const int lo = k == F_TOKENS_LO || k == F_TOKENS_HI ? F_TOKENS_LO : F_WINDOWS_LO;
    snprintf(out, n, "%" PRIu64, (uint64_t)(uint32_t)f[lo] | (uint64_t)(uint32_t)f[lo + 1] << 32);
  }
}

/* "GLOB" (first shard's absolute path, or none) into out. */
static void describe(const mpt_token_data *d, const char *glob, char *out, size_t n) {
  char real[PATH_MAX];
  const char *first = d ? mpt_token_data_shard_path(d, 0) : NULL;
  if (!first) {
    snprintf(out, n, "no shards");
    return;
  }
  snprintf(out, n, "'%.200s' (first shard %.280s)", glob, realpath(first, real) ? real : first);
}

static mpt_status check_same_data(mpt_comm *comm, const mpt_token_data *train,
                                  const mpt_token_data *val) {
  const int world = mpt_comm_world_size(comm);
  if (world == 1) return MPT_OK;
  static const char *const what[NFIELDS] = {"the number of shards", "the number of tokens",
                                            "the number of tokens", "the number of windows",
                                            "the number of windows",
                                            "the tokens (a sample of each shard)"};
  const size_t W = (size_t)world;
  int32_t mine[2 * NFIELDS], *all = malloc(sizeof(int32_t) * 2 * NFIELDS * W);
  char *records = NULL;
  mpt_status st = MPT_OK;
  if (!all) return MPT_FAIL(MPT_ENOMEM, "cannot allocate the data check");
  /* A rank that cannot read its shards still joins the all-gather (with a fingerprint of -1s,
   * so that the others stop too) and then returns its own error. */
  mpt_status fst = fingerprint(train, mine);
  if (fst == MPT_OK) fst = fingerprint(val, mine + NFIELDS);
  if (fst != MPT_OK) memset(mine, 0xff, sizeof mine);
  MPT_CHECK(mpt_comm_allgather_sync(comm, mine, all, 2 * NFIELDS, MPT_I32), done);
  if (fst != MPT_OK) {
    st = fst;
    goto done;
  }
  int bad = -1, k = 0;
  for (size_t r = 1; r < W && bad < 0; r++)
    for (k = 0; k < 2 * NFIELDS; k++)
      if (all[2 * NFIELDS * r + (size_t)k] != all[k]) {
        bad = (int)r;
        break;
      }
  if (bad < 0) goto done;
  /* Collective: every rank found the same (bad, k). Each names what it read. */
  const int is_val = k >= NFIELDS;
  if (!(records = calloc(W + 1, RECORD_BYTES))) {
    st = MPT_FAIL(MPT_ENOMEM, "cannot allocate the data check");
    goto done;
  }
  char *my = records + RECORD_BYTES * W; /* value, description, host */
  field_text(mine + (is_val ? NFIELDS : 0), k % NFIELDS, my, PATH_BYTES);
  describe(is_val ? val : train, mpt_token_data_pattern(is_val ? val : train), my + PATH_BYTES,
           PATH_BYTES);
  snprintf(my + 2 * PATH_BYTES, HOST_BYTES, "%s", mpt_comm_hostname(comm));
  MPT_CHECK(mpt_comm_allgather_sync(comm, my, records, RECORD_BYTES, MPT_U8), done);
  const char *a = records, *b = records + RECORD_BYTES * (size_t)bad;
  st = MPT_FAIL(MPT_EMISMATCH,
                "ranks read different token shards (%s, %s): rank %d has %s from %s on %s, rank 0 "
                "has %s from %s on %s (every rank must read the same shards: a relative glob is "
                "expanded in each rank's working directory)",
                is_val ? "--val-shards" : "--shards", what[k % NFIELDS], bad, b, b + PATH_BYTES,
                b + 2 * PATH_BYTES, a, a + PATH_BYTES, a + 2 * PATH_BYTES);
done:
  free(all);
  free(records);
  return st;
}
static mpt_status check_disjoint(const mpt_token_data *train, const mpt_token_data *val) {
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

static mpt_status check_token_ids(mpt_comm *comm, const mpt_token_data *train,
                                  const mpt_token_data *val) {
  const int rank = mpt_comm_rank(comm), world = mpt_comm_world_size(comm);
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

static mpt_status check_distinct(const mpt_token_data *d, const char *option) {
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

static mpt_status tokens_check(void *ctx, mpt_comm *comm, const mpt_trainer_config *cfg,
                               mpt_model *model) {
  (void)cfg;
  (void)model;
  const tokens_task *k = ctx;
  MPT_RETURN_IF(check_distinct(k->train, "--shards"));
  if (k->val) MPT_RETURN_IF(check_distinct(k->val, "--val-shards"));
  if (k->val) MPT_RETURN_IF(check_disjoint(k->train, k->val));
  MPT_RETURN_IF(check_same_data(comm, k->train, k->val));
  return check_token_ids(comm, k->train, k->val); /* reads every token: after the cheap ones */
}

/* A window (one sample: inputs [1, B, T], targets [1, B T]) as B rows of T tokens. */
static mpt_status tokens_view(void *ctx, const mpt_batch *b, mpt_train_batch *out) {
  const tokens_task *k = ctx;
  const mpt_token_data_config dc = mpt_token_data_config_get(k->train);
  const int64_t rows = b->count * dc.batch_size, shape[2] = {rows, dc.seq_len};
  out->input = mpt_tensor_view(b->images.data, b->images.device, MPT_I32, 2, shape);
  out->target = mpt_tensor_view(b->labels.data, b->labels.device, MPT_I32, 2, shape);
  out->rows = rows;
  out->real_rows = b->num_real * dc.batch_size;
  return MPT_OK;
}

static mpt_status tokens_loss(void *ctx, mpt_tape *tape, mpt_var *output,
                              const mpt_tensor *target, mpt_var **loss) {
  const tokens_task *k = ctx;
  return mpt_nn_cross_entropy_vocab(tape, output, target, k->vocab_size, loss);
}

static void tokens_destroy(void *self) {
  tokens_task *k = self;
  mpt_data_source_free(k->train_source);
  mpt_data_source_free(k->val_source);
  free(k);
}

mpt_status mpt_train_task_tokens(mpt_train_task **out, mpt_token_data *train, mpt_token_data *val,
                                 int vocab_size, double flops_per_unit) {
  if (!out) return MPT_FAIL(MPT_EINVAL, "mpt_train_task_tokens: task is NULL");
  *out = NULL;
  if (!train) return MPT_FAIL(MPT_EINVAL, "mpt_train_task_tokens: no training data");
  if (vocab_size < 1)
    return MPT_FAIL(MPT_EINVAL, "mpt_train_task_tokens: vocabulary size %d", vocab_size);
  tokens_task *k = calloc(1, sizeof *k);
  if (!k) return MPT_FAIL(MPT_ENOMEM, "cannot allocate the task");
  k->train = train;
  k->val = val;
  k->vocab_size = vocab_size;
  k->destroy = tokens_destroy;
  mpt_status st = mpt_token_data_source(train, &k->train_source);
  if (st == MPT_OK && val) st = mpt_token_data_source(val, &k->val_source);
  if (st != MPT_OK) {
    mpt_train_task_free(&k->task);
    return st;
  }
  mpt_train_task *t = &k->task;
  t->name = "language model";
  t->unit = "tokens";
  t->units_per_row = mpt_token_data_config_get(train).seq_len;
  t->flops_per_unit = flops_per_unit;
  t->eval_name = "val";
  t->loss_unit = "nats/token";
  t->train = k->train_source;
  t->eval = k->val_source;
  t->samples_per_batch = 1;
  t->ctx = k;
  t->check = tokens_check;
  t->batch_view = tokens_view;
  t->loss = tokens_loss;
  *out = t;
  return MPT_OK;
}
