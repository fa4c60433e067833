/* Internal interface of the checkpoint layer, shared by src/ckpt/write.c (the writer),
 * src/ckpt/read.c (the validating reader) and src/ckpt/dir.c (directories and the collective
 * wrappers): little-endian byte helpers, the CRC, device copies through host memory, and the
 * two halves of a load.
 *
 * A load is split in two so that the collective wrapper can make every rank validate its file
 * before any rank changes its model: stage (read and validate the whole file into host memory
 * sized from the model and optimizer) then commit (copy to the devices). */
#ifndef MPT_CKPT_IMPL_H
#define MPT_CKPT_IMPL_H

#include <string.h>
#include <zlib.h>

#include "mpitrain/ckpt.h"
#include "mpitrain/ops.h"

#define MPT__CKPT_MAGIC "MPTCKPT\0" /* 8 bytes, the NUL included */
#define MPT__CKPT_PREAMBLE_NBYTES 24u
#define MPT__CKPT_CRC_NBYTES 4u
/* The "resume" block of format version 2 (ckpt.h): five i64, an i32 and a reserved u32. */
#define MPT__CKPT_RESUME_NBYTES (5u * 8u + 4u + 4u)
/* Host I/O chunk of the writer and the CRC pass. */
#define MPT__CKPT_CHUNK_NBYTES ((size_t)1 << 20)
/* Deadline of one device copy. */
#define MPT__CKPT_COPY_TIMEOUT_MS 600000.0

/* ---- bytes ---- */

static inline void mpt__put_u32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void mpt__put_u64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint32_t mpt__get_u32(const uint8_t *p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
  return v;
}
static inline uint64_t mpt__get_u64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

/* Converts `count` float32 in place between host order and little-endian (its own inverse; a
 * no-op on little-endian hosts). */
static inline void mpt__floats_swap_le(void *p, size_t count) {
  const uint16_t one = 1;
  uint8_t first;
  memcpy(&first, &one, 1);
  if (first == 1) return;
  uint8_t *b = p;
  for (size_t i = 0; i < count; i++, b += 4) {
    uint8_t t0 = b[0], t1 = b[1];
    b[0] = b[3], b[1] = b[2], b[2] = t1, b[3] = t0;
  }
}

/* zlib's crc32 over any length (it takes at most uInt bytes per call). Start from 0. */
static inline uint32_t mpt__crc_update(uint32_t crc, const void *p, size_t n) {
  const Bytef *b = p;
  while (n > 0) {
    uInt len = n > ((size_t)1 << 30) ? (1u << 30) : (uInt)n;
    crc = (uint32_t)crc32(crc, b, len);
    b += len, n -= len;
  }
  return crc;
}

/* ---- device copies through a temporary inline stream of the device ---- */

typedef struct mpt__copier {
  mpt_device device;
  mpt_stream *stream;
} mpt__copier;

static inline mpt_status mpt__copier_init(mpt__copier *c, mpt_device device) {
  c->device = device;
  c->stream = NULL;
  return mpt_stream_init(&c->stream, device, MPT_STREAM_INLINE);
}

static inline void mpt__copier_free(mpt__copier *c) {
  mpt_stream_free(c->stream);
  c->stream = NULL;
}

/* to_device: host -> dev, else dev -> host; synchronized before returning. */
static inline mpt_status mpt__copier_copy(mpt__copier *c, int to_device, void *dev, void *host,
                                          size_t nbytes) {
  if (nbytes == 0) return MPT_OK;
  mpt_device cpu = mpt_device_cpu();
  mpt_status st = to_device ? mpt_op_memcpy(c->stream, c->device, dev, cpu, host, nbytes)
                            : mpt_op_memcpy(c->stream, cpu, host, c->device, dev, nbytes);
  if (st != MPT_OK) return st;
  return mpt_stream_synchronize(c->stream, MPT__CKPT_COPY_TIMEOUT_MS);
}

/* ---- shared checks (write.c) ---- */

/* The ranges of mpt_ckpt_meta (ckpt.h); `status` is MPT_EINVAL for a caller's meta and
 * MPT_EFORMAT for a file's; `where` starts the message. */
mpt_status mpt__ckpt_meta_check(const mpt_ckpt_meta *m, mpt_status status, const char *where);

/* MPT_ESTATE ("<what> <path>: the model is not finalised") unless the model's flat buffers
 * exist and hold every registered parameter and buffer. */
mpt_status mpt__ckpt_model_check(mpt_model *model, const char *what, const char *path);

/* ---- load in two halves (read.c) ---- */

typedef struct mpt__ckpt_staged {
  float *data;            /* host: [param_count + buffer_count + opt_nbuffers * opt_count] */
  int64_t param_count;    /* = mpt_model_param_count of the model it was staged for */
  int64_t buffer_count;   /* = mpt_model_buffer_count */
  int has_optimizer;      /* optimizer state was staged (an optimizer was given) */
  int opt_nbuffers;
  int64_t opt_count;      /* elements per optimizer state buffer */
  int64_t opt_step_count;
  mpt_ckpt_meta meta;
  uint32_t crc;           /* the file's CRC-32 */
} mpt__ckpt_staged;

/* Reads and validates `path` against model and optimizer (NULL: ignore the file's optimizer
 * state) into *staged (zeroed first). Errors as mpt_ckpt_load. Nothing is written to the model
 * or optimizer. On error *staged owns nothing. */
mpt_status mpt__ckpt_stage(const char *path, mpt_model *model, mpt_optimizer *optimizer,
                           mpt__ckpt_staged *staged);
/* Copies the staged values onto the model's (and optimizer's) device, sets the optimizer's
 * step count, and fills *meta (may be NULL). Errors: the device copy's. */
mpt_status mpt__ckpt_commit(const mpt__ckpt_staged *staged, mpt_model *model,
                            mpt_optimizer *optimizer, mpt_ckpt_meta *meta);
/* Frees the staging memory; zeroes *staged. */
void mpt__ckpt_staged_free(mpt__ckpt_staged *staged);

/* ---- background checkpoints (src/ckpt/write.c, src/ckpt/dir.c) ---- */

/* The bytes mpt_ckpt_save would write to `path`, in a malloc'd buffer *bytes of *nbytes that
 * the caller frees, all but the trailing CRC (left 0 to keep the stall short: mpt__ckpt_seal
 * computes it); `path` names the file in messages only. */
mpt_status mpt__ckpt_snapshot(const char *path, mpt_model *model, mpt_optimizer *optimizer,
                              const mpt_ckpt_meta *meta, uint8_t **bytes, size_t *nbytes);

/* Puts the CRC-32 of bytes [0, nbytes - 4) into the last 4 bytes: the snapshot becomes the
 * exact file. */
void mpt__ckpt_seal(uint8_t *bytes, size_t nbytes);

/* Writes bytes to "<path>.tmp.<pid>", flushes and fsyncs it, renames it to path and fsyncs the
 * directory, as mpt_ckpt_save does; a crash at any point leaves path as it was before. */
mpt_status mpt__ckpt_write_bytes(const char *path, const uint8_t *bytes, size_t nbytes);

/* One background writer: a thread that writes a snapshot into a checkpoint directory (as
 * mpt_ckpt_save_dir names, writes and prunes). */
typedef struct mpt__ckpt_async mpt__ckpt_async;

/* Starts the thread writing `bytes` (taken over: freed by the writer) as the checkpoint of
 * `step` in `dir`, keeping the last keep_last_k. *out is the writer to wait for. */
mpt_status mpt__ckpt_async_start(mpt__ckpt_async **out, const char *dir, int keep_last_k,
                                 int64_t step, uint8_t *bytes, size_t nbytes);

/* Waits up to timeout_s seconds (<= 0: no limit) for the writer, frees it and sets *a to NULL,
 * and returns the write's status (its message in mpt_last_error) with the file's path in
 * path_out (may be NULL). On MPT_ETIMEOUT the writer is left running and *a unchanged. A NULL
 * *a returns MPT_OK at once. */
mpt_status mpt__ckpt_async_wait(mpt__ckpt_async **a, double timeout_s, char *path_out,
                                size_t path_nbytes);

#endif
