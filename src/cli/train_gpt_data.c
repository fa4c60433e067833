/* The GPT trainer's data agreement check (train_data.c's check, for token shards). Ranks started
 * with the same --shards glob from different working directories (or on hosts whose copies of
 * the shards differ) hold different windows: with different window counts each rank's sampler
 * deals a different epoch, so the ranks run different numbers of steps and their collectives no
 * longer pair up (one rank's all-reduce of 2 floats met another's gradient bucket:
 * MPI_ERR_TRUNCATE, or a bus error in the shared-memory transport); with the same counts and
 * other text they train silently on data that was not meant. Before training, each rank
 * fingerprints its training and validation shards and the ranks compare (one all-gather of a few
 * integers); a difference stops every rank, naming the rank, what differs and the first shard
 * each read. (The start-up token id check, trainer_gpt_check_token_ids, reads every token but
 * each rank only its share of the shards, so it does not compare them.)
 *
 * The fingerprint of a set of shards: the number of shards, of tokens and of windows, and a
 * CRC-32 (zlib) over each shard's token count and a sample of its bytes: the whole shard up to
 * SAMPLE_ALL_NBYTES, else SAMPLE_BLOCKS blocks of SAMPLE_BLOCK_NBYTES spread evenly over it
 * (the first and the last included), so the cost stays at most 1 MiB read per shard whatever
 * its size. Shards that differ only between the sampled blocks are not caught.
 *
 * Runs on the training thread; collective over the trainer's comm (every rank sees the same
 * table and takes the same branch). */
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <fcntl.h>
#include <zlib.h>

#include "cli/train_impl.h"
#include "mpitrain.h"

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

mpt_status trainer_gpt_check_same_data(mpt_comm *comm, const mpt_cli_options *o,
                                       const mpt_token_data *train, const mpt_token_data *val) {
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
  describe(is_val ? val : train, is_val ? o->val_shards : o->shards, my + PATH_BYTES, PATH_BYTES);
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
