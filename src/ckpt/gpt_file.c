/* llm.c model files (include/mpitrain/gpt_file.h): the validated reader and the atomic writer
 * (the parameter layout they follow is the nn layer's: src/nn/gpt_config.c).
 *
 * Invariants: the header is never trusted: magic, version and every field are checked, then
 * the file size (fstat) must equal 1024 + 4 N before a parameter is read, so a truncated file
 * or one with a wrong header is refused before the caller's buffer is touched. Sizes are
 * int64_t and offsets off_t (64-bit): files over 2 GiB work. Values are little-endian fp32,
 * read and written in chunks of GPT_CHUNK_FLOATS (byte-swapped on a big-endian host).
 * Runs on the calling thread. */
#include <errno.h>
#include <stdio.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt_impl.h"
#include "core/atomic_file.h"
#include "mpitrain/data.h"
#include "mpitrain/gpt_file.h"
#include "mpitrain/safetensors.h"

#define GPT_CHUNK_FLOATS (256 * 1024) /* 1 MiB */

static int32_t le32(const uint8_t *p) {
  return (int32_t)((uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
                   ((uint32_t)p[3] << 24));
}

/* Host floats <-> little-endian bytes, in place. */
static void swap_floats_if_big_endian(float *x, int64_t n) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  for (int64_t i = 0; i < n; i++) {
    uint32_t u;
    memcpy(&u, &x[i], 4);
    u = __builtin_bswap32(u);
    memcpy(&x[i], &u, 4);
  }
#else
  (void)x;
  (void)n;
#endif
}

/* Opens `path`, checks the header and the size; on success *fd is open and *lay filled. */
static mpt_status open_checked(const char *path, int *fd_out, mpt_gpt_config *c,
                               mpt_gpt_layout *lay) {
  *fd_out = -1;
  int fd;
  int64_t size;
  MPT_RETURN_IF(mpt__file_open_regular(path, "model file", &fd, &size));
  mpt_status st = MPT_OK;
  if (size < MPT_GPT_FILE_HEADER_NBYTES) {
    st = MPT_FAIL(MPT_EFORMAT, "model file '%s' is %lld bytes, shorter than its %d-byte header",
                  path, (long long)size, MPT_GPT_FILE_HEADER_NBYTES);
    goto fail;
  }
  uint8_t h[MPT_GPT_FILE_HEADER_NBYTES];
  MPT_CHECK(mpt__file_pread(fd, "model file", path, h, sizeof h, 0), fail);
  int32_t magic = le32(h), version = le32(h + 4);
  if (magic != MPT_GPT_FILE_MAGIC) {
    st = MPT_FAIL(MPT_EFORMAT, "model file '%s' has magic %d, expected %d%s", path, (int)magic,
                  MPT_GPT_FILE_MAGIC,
                  magic == MPT_SHARD_MAGIC ? " (this is a token shard, not a model file)"
                  : memcmp(h, MPT__CKPT_MAGIC, 8) == 0
                      ? " (this is an mpitrain checkpoint: continue it with --resume, or write "
                        "a model file with --save-model)"
                      : "");
    goto fail;
  }
  if (version != MPT_GPT_FILE_VERSION) {
    st = MPT_FAIL(MPT_EFORMAT, "model file '%s' has version %d, expected %d (fp32)%s", path,
                  (int)version, MPT_GPT_FILE_VERSION,
                  version == 5 ? "; version 5 is llm.c's bf16 file, which is not supported" : "");
    goto fail;
  }
  c->max_seq_len = le32(h + 8);
  c->vocab_size = le32(h + 12);
  c->num_layers = le32(h + 16);
  c->num_heads = le32(h + 20);
  c->channels = le32(h + 24);
  c->padded_vocab_size = le32(h + 28);
  if (c->padded_vocab_size < 1) {
    st = MPT_FAIL(MPT_EFORMAT, "model file '%s': padded vocabulary %d in its header (< 1)", path,
                  c->padded_vocab_size);
    goto fail;
  }
  if (mpt_gpt_layout_compute(c, lay) != MPT_OK) {
    char why[256]; /* the last-error text is overwritten by the MPT_FAIL below */
    snprintf(why, sizeof why, "%s", mpt_last_error());
    st = MPT_FAIL(MPT_EFORMAT, "model file '%s': bad header: %s", path, why);
    goto fail;
  }
  int64_t want = MPT_GPT_FILE_HEADER_NBYTES + 4 * lay->total;
  if (size != want) {
    st = MPT_FAIL(MPT_EFORMAT, "model file '%s' is %lld bytes, but its header (T %d, V %d, L %d, "
                  "H %d, C %d, Vp %d) describes %lld parameters (%lld bytes): %s", path,
                  (long long)size, c->max_seq_len, c->vocab_size, c->num_layers, c->num_heads,
                  c->channels, c->padded_vocab_size, (long long)lay->total, (long long)want,
                  size < want ? "truncated" : "bytes after the parameters");
    goto fail;
  }
  *fd_out = fd;
  return MPT_OK;

fail:
  close(fd);
  return st;
}

mpt_status mpt_gpt_file_read_header(const char *path, mpt_gpt_config *config) {
  if (!path || !config) return MPT_FAIL(MPT_EINVAL, "mpt_gpt_file_read_header: NULL argument");
  if (mpt_gpt_st_is_path(path)) return mpt_gpt_st_read_header(path, config);
  memset(config, 0, sizeof *config);
  int fd;
  mpt_gpt_layout lay;
  mpt_gpt_config c;
  MPT_RETURN_IF(open_checked(path, &fd, &c, &lay));
  close(fd);
  *config = c;
  return MPT_OK;
}

mpt_status mpt_gpt_file_read(const char *path, const mpt_gpt_config *expect,
                             mpt_gpt_config *config, float *params, int64_t capacity) {
  if (!path || !params) return MPT_FAIL(MPT_EINVAL, "mpt_gpt_file_read: NULL argument");
  if (mpt_gpt_st_is_path(path)) return mpt_gpt_st_read(path, expect, config, params, capacity);
  int fd;
  mpt_gpt_layout lay;
  mpt_gpt_config c;
  MPT_RETURN_IF(open_checked(path, &fd, &c, &lay));
  mpt_status st = MPT_OK;
  if (expect) {
    const struct { const char *name; int file, want; } f[] = {
        {"max sequence length", c.max_seq_len, expect->max_seq_len},
        {"vocabulary size", c.vocab_size, expect->vocab_size},
        {"layers", c.num_layers, expect->num_layers},
        {"heads", c.num_heads, expect->num_heads},
        {"channels", c.channels, expect->channels},
        {"padded vocabulary", c.padded_vocab_size, expect->padded_vocab_size}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
      if (f[i].want != 0 && f[i].file != f[i].want) {
        st = MPT_FAIL(MPT_ESHAPE, "model file '%s' has %s %d, the model expects %d", path,
                      f[i].name, f[i].file, f[i].want);
        goto out;
      }
  }
  if (lay.total > capacity) {
    st = MPT_FAIL(MPT_ESHAPE, "model file '%s' holds %lld parameters, the buffer %lld", path,
                  (long long)lay.total, (long long)capacity);
    goto out;
  }
  for (int64_t i = 0; i < lay.total; i += GPT_CHUNK_FLOATS) {
    int64_t m = lay.total - i < GPT_CHUNK_FLOATS ? lay.total - i : GPT_CHUNK_FLOATS;
    MPT_CHECK(mpt__file_pread(fd, "model file", path, params + i, 4 * m, MPT_GPT_FILE_HEADER_NBYTES + 4 * i), out);
    swap_floats_if_big_endian(params + i, m);
  }
  if (config) *config = c;
out:
  close(fd);
  return st;
}

mpt_status mpt_gpt_file_write(const char *path, const mpt_gpt_config *config,
                              const float *params) {
  if (!path || !config || !params)
    return MPT_FAIL(MPT_EINVAL, "mpt_gpt_file_write: NULL argument");
  struct stat dir;
  if (mpt_gpt_st_is_path(path) || (stat(path, &dir) == 0 && S_ISDIR(dir.st_mode)))
    return mpt_gpt_st_write(path, config, params, NULL);
  mpt_gpt_layout lay;
  MPT_RETURN_IF(mpt_gpt_layout_compute(config, &lay));
  mpt_gpt_config c = *config;
  if (!c.padded_vocab_size) c.padded_vocab_size = (int)mpt_gpt_padded_vocab(c.vocab_size);
  const int32_t fields[8] = {MPT_GPT_FILE_MAGIC, MPT_GPT_FILE_VERSION, c.max_seq_len,
                             c.vocab_size, c.num_layers, c.num_heads, c.channels,
                             c.padded_vocab_size};
  uint8_t h[MPT_GPT_FILE_HEADER_NBYTES];
  memset(h, 0, sizeof h);
  for (int i = 0; i < 8; i++)
    for (int k = 0; k < 4; k++) h[4 * i + k] = (uint8_t)((uint32_t)fields[i] >> (8 * k));
  float *chunk = NULL;
  mpt__afile af;
  mpt_status st;
  MPT_CHECK(mpt__afile_open(&af, path, "model file"), out);
  MPT_CHECK(mpt__afile_write(&af, h, sizeof h), out);
  chunk = malloc(sizeof(float) * GPT_CHUNK_FLOATS);
  if (!chunk) {
    st = MPT_FAIL(MPT_ENOMEM, "model file write %s: out of host memory", path);
    goto out;
  }
  for (int64_t i = 0; i < lay.total; i += GPT_CHUNK_FLOATS) {
    int64_t m = lay.total - i < GPT_CHUNK_FLOATS ? lay.total - i : GPT_CHUNK_FLOATS;
    memcpy(chunk, params + i, (size_t)m * sizeof(float));
    swap_floats_if_big_endian(chunk, m);
    MPT_CHECK(mpt__afile_write(&af, chunk, (size_t)m * sizeof(float)), out);
  }
  MPT_CHECK(mpt__afile_commit(&af), out);
out:
  mpt__afile_abort(&af);
  free(chunk);
  return st;
}
