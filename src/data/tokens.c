/* Token shards in llm.c's format (include/mpitrain/data.h): header check, validated reader,
 * atomic writer.
 *
 * Invariants: nothing in the header is trusted. The magic, version and count are checked and
 * the file's size (fstat) must equal 1024 + 2 N before anything is allocated, so memory never
 * grows beyond what the file holds. Offsets and sizes are int64_t / off_t (64-bit), so shards
 * over 2 GiB work; data is read with pread(2) in chunks of SHARD_CHUNK_TOKENS. The format is
 * little-endian and decoded byte by byte (independent of the host's byte order). Every error
 * names the file. Runs on the calling thread. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/atomic_file.h"
#include "mpitrain/core.h"
#include "data/tokens_impl.h"
#include "mpitrain/data.h"

#define SHARD_CHUNK_TOKENS (512 * 1024) /* 1 MiB of uint16 */
#define GPT_FILE_MAGIC 20240326         /* llm.c's model file, named when given as a shard */

static int32_t le32(const uint8_t *p) {
  return (int32_t)((uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
                   ((uint32_t)p[3] << 24));
}

static void put_le32(uint8_t *p, int32_t v) {
  uint32_t u = (uint32_t)v;
  for (int k = 0; k < 4; k++) p[k] = (uint8_t)(u >> (8 * k));
}

mpt_status mpt__shard_pread(int fd, const char *path, void *buf, int64_t nbytes, int64_t offset) {
  return mpt__file_pread(fd, "token shard", path, buf, nbytes, offset);
}

mpt_status mpt__shard_check_tokens(const char *path, const uint8_t *bytes, int64_t count,
                                   int64_t first_token, int vocab_size, uint16_t *out16,
                                   int32_t *out32) {
  for (int64_t i = 0; i < count; i++) {
    unsigned v = (unsigned)bytes[2 * i] | ((unsigned)bytes[2 * i + 1] << 8);
    if (v >= (unsigned)vocab_size) {
      int64_t t = first_token + i;
      return MPT_FAIL(MPT_EFORMAT, "token shard '%s': token %lld (byte offset %lld) is %u, "
                      "outside the vocabulary of %d", path, (long long)t,
                      (long long)(MPT_SHARD_HEADER_NBYTES + 2 * t), v, vocab_size);
    }
    if (out16) out16[i] = (uint16_t)v;
    if (out32) out32[i] = (int32_t)v;
  }
  return MPT_OK;
}

mpt_status mpt__shard_open(const char *path, int *fd_out, int64_t *count) {
  *fd_out = -1;
  *count = 0;
  int fd;
  int64_t size;
  MPT_RETURN_IF(mpt__file_open_regular(path, "token shard", &fd, &size));
  mpt_status st = MPT_OK;
  if (size < MPT_SHARD_HEADER_NBYTES) {
    st = MPT_FAIL(MPT_EFORMAT, "token shard '%s' is %lld bytes, shorter than its %d-byte "
                  "header (truncated, or not a shard)", path, (long long)size,
                  MPT_SHARD_HEADER_NBYTES);
    goto fail;
  }
  uint8_t head[MPT_SHARD_HEADER_NBYTES];
  MPT_CHECK(mpt__shard_pread(fd, path, head, MPT_SHARD_HEADER_NBYTES, 0), fail);
  int32_t magic = le32(head), version = le32(head + 4), n = le32(head + 8);
  if (magic != MPT_SHARD_MAGIC) {
    st = MPT_FAIL(MPT_EFORMAT, "token shard '%s' has magic %d, expected %d%s", path, (int)magic,
                  MPT_SHARD_MAGIC,
                  magic == GPT_FILE_MAGIC ? " (this is an llm.c model file, not a shard)" : "");
    goto fail;
  }
  if (version != MPT_SHARD_VERSION) {
    st = MPT_FAIL(MPT_EFORMAT, "token shard '%s' has version %d, expected %d", path,
                  (int)version, MPT_SHARD_VERSION);
    goto fail;
  }
  if (n < 0) {
    st = MPT_FAIL(MPT_EFORMAT, "token shard '%s': negative token count %d in its header", path,
                  (int)n);
    goto fail;
  }
  int64_t want = MPT_SHARD_HEADER_NBYTES + 2 * (int64_t)n;
  if (size != want) {
    st = MPT_FAIL(MPT_EFORMAT, "token shard '%s' is %lld bytes, but its header says %lld tokens "
                  "(%lld bytes): %s", path, (long long)size, (long long)n, (long long)want,
                  size < want ? "truncated" : "bytes after the data");
    goto fail;
  }
  *fd_out = fd;
  *count = n;
  return MPT_OK;

fail:
  close(fd);
  return st;
}

mpt_status mpt_token_shard_read_header(const char *path, int64_t *count) {
  if (!path || !count) return MPT_FAIL(MPT_EINVAL, "mpt_token_shard_read_header: NULL argument");
  int fd;
  MPT_RETURN_IF(mpt__shard_open(path, &fd, count));
  close(fd);
  return MPT_OK;
}

mpt_status mpt_token_shard_read(const char *path, int vocab_size, mpt_token_shard *shard) {
  if (!shard) return MPT_FAIL(MPT_EINVAL, "mpt_token_shard_read: shard is NULL");
  memset(shard, 0, sizeof *shard);
  if (!path) return MPT_FAIL(MPT_EINVAL, "mpt_token_shard_read: path is NULL");
  if (vocab_size < 1 || vocab_size > 65536)
    return MPT_FAIL(MPT_EINVAL, "mpt_token_shard_read('%s'): vocab_size %d outside 1..65536",
                    path, vocab_size);
  int fd = -1;
  int64_t n = 0;
  uint8_t *chunk = NULL;
  uint16_t *tokens = NULL;
  mpt_status st;
  MPT_CHECK(mpt__shard_open(path, &fd, &n), fail);
  if (n > 0) {
    tokens = malloc((size_t)n * sizeof *tokens);
    chunk = malloc(2 * (size_t)(n < SHARD_CHUNK_TOKENS ? n : SHARD_CHUNK_TOKENS));
    if (!tokens || !chunk) {
      st = MPT_FAIL(MPT_ENOMEM, "token shard '%s': cannot allocate %lld tokens", path,
                    (long long)n);
      goto fail;
    }
  }
  for (int64_t t = 0; t < n; t += SHARD_CHUNK_TOKENS) {
    int64_t m = n - t < SHARD_CHUNK_TOKENS ? n - t : SHARD_CHUNK_TOKENS;
    MPT_CHECK(mpt__shard_pread(fd, path, chunk, 2 * m, MPT_SHARD_HEADER_NBYTES + 2 * t), fail);
    MPT_CHECK(mpt__shard_check_tokens(path, chunk, m, t, vocab_size, tokens + t, NULL), fail);
  }
  close(fd);
  free(chunk);
  shard->count = n;
  shard->tokens = tokens;
  return MPT_OK;

fail:
  if (fd >= 0) close(fd);
  free(chunk);
  free(tokens);
  return st;
}

void mpt_token_shard_free(mpt_token_shard *shard) {
  if (!shard) return;
  free(shard->tokens);
  memset(shard, 0, sizeof *shard);
}

mpt_status mpt_token_shard_write(const char *path, const uint16_t *tokens, int64_t count) {
  if (!path || !path[0]) return MPT_FAIL(MPT_EINVAL, "token shard write: empty path");
  if (count < 0 || count > MPT_SHARD_MAX_TOKENS || (count > 0 && !tokens))
    return MPT_FAIL(MPT_EINVAL, "token shard write %s: %lld tokens (must be 0..%lld, with a "
                    "non-NULL array)", path, (long long)count, (long long)MPT_SHARD_MAX_TOKENS);
  uint8_t head[MPT_SHARD_HEADER_NBYTES];
  memset(head, 0, sizeof head);
  put_le32(head, MPT_SHARD_MAGIC);
  put_le32(head + 4, MPT_SHARD_VERSION);
  put_le32(head + 8, (int32_t)count);
  uint8_t *chunk = NULL;
  mpt__afile af;
  mpt_status st;
  MPT_CHECK(mpt__afile_open(&af, path, "token shard"), out);
  MPT_CHECK(mpt__afile_write(&af, head, sizeof head), out);
  if (count > 0) {
    chunk = malloc(2 * (size_t)(count < SHARD_CHUNK_TOKENS ? count : SHARD_CHUNK_TOKENS));
    if (!chunk) {
      st = MPT_FAIL(MPT_ENOMEM, "token shard write %s: out of host memory", path);
      goto out;
    }
  }
  for (int64_t t = 0; t < count; t += SHARD_CHUNK_TOKENS) {
    int64_t m = count - t < SHARD_CHUNK_TOKENS ? count - t : SHARD_CHUNK_TOKENS;
    for (int64_t i = 0; i < m; i++) {
      chunk[2 * i] = (uint8_t)(tokens[t + i] & 0xFF);
      chunk[2 * i + 1] = (uint8_t)(tokens[t + i] >> 8);
    }
    MPT_CHECK(mpt__afile_write(&af, chunk, 2 * (size_t)m), out);
  }
  MPT_CHECK(mpt__afile_commit(&af), out);
out:
  mpt__afile_abort(&af);
  free(chunk);
  return st;
}
