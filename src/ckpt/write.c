/* The checkpoint writer (include/mpitrain/ckpt.h, format version 2): mpt_ckpt_save and the meta
 * helpers.
 *
 * Invariants: the final path is only ever produced by rename(2) of a complete temporary file
 * ("<path>.tmp.<pid>") that was flushed and fsynced first, so it always holds a complete
 * checkpoint (the old one or the new one); the directory is fsynced after the rename so the
 * new name survives a node crash (core/atomic_file.h, shared with the other file writers). The size written into the preamble is computed before
 * writing and checked against the bytes actually written. Values are read from the device in
 * chunks of MPT__CKPT_CHUNK_NBYTES through host memory, so the writer needs no more host memory
 * than that whatever the model's size. Runs on the calling thread. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/ckpt_impl.h"
#include "core/atomic_file.h"
#include "core/fault.h"

mpt_ckpt_meta mpt_ckpt_meta_default(void) {
  mpt_ckpt_meta m;
  memset(&m, 0, sizeof m);
  m.world_size = 1;
  return m;
}

mpt_status mpt__ckpt_meta_check(const mpt_ckpt_meta *m, mpt_status status, const char *where) {
  const struct { const char *name; int64_t v; } f[] = {{"epoch", m->epoch},
                                                      {"global_step", m->global_step},
                                                      {"step_in_epoch", m->step_in_epoch},
                                                      {"sampler_epoch", m->sampler_epoch},
                                                      {"global_batch", m->global_batch},
                                                      {"epoch_cursor", m->epoch_cursor},
                                                      {"epoch_samples", m->epoch_samples},
                                                      {"dataset_count", m->dataset_count},
                                                      {"batch_size", m->batch_size},
                                                      {"accumulate", m->accumulate}};
  for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
    if (f[i].v < 0)
      return MPT_FAIL(status, "%s: %s %lld < 0", where, f[i].name, (long long)f[i].v);
  if (m->world_size < 1)
    return MPT_FAIL(status, "%s: world_size %d < 1", where, (int)m->world_size);
  if (m->num_rngs < 0 || m->num_rngs > MPT_CKPT_MAX_RNGS)
    return MPT_FAIL(status, "%s: num_rngs %d outside [0, %d]", where, (int)m->num_rngs,
                    MPT_CKPT_MAX_RNGS);
  return MPT_OK;
}

mpt_status mpt__ckpt_model_check(mpt_model *model, const char *what, const char *path) {
  int64_t sum[2] = {0, 0};
  for (int l = 0; l < 2; l++) {
    int n = l == 0 ? mpt_model_num_params(model) : mpt_model_num_buffers(model);
    for (int i = 0; i < n; i++)
      sum[l] += (l == 0 ? mpt_model_param_info(model, i) : mpt_model_buffer_info(model, i))->count;
  }
  if (sum[0] != mpt_model_param_count(model) || sum[1] != mpt_model_buffer_count(model) ||
      (sum[0] > 0 && !mpt_model_params(model)) || (sum[1] > 0 && !mpt_model_buffers(model)))
    return MPT_FAIL(MPT_ESTATE, "%s %s: the model is not finalised", what, path);
  return MPT_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Buffered writes that keep the CRC and the byte count                                       */

typedef struct writer {
  FILE *f;
  const char *path; /* the temporary file, for messages */
  uint32_t crc;     /* of bytes [0, nbytes) */
  uint64_t nbytes;
  void *chunk;      /* MPT__CKPT_CHUNK_NBYTES of host staging */
  uint8_t *mem;     /* non-NULL: the bytes go here (a snapshot of the whole file), not to f,
                     * and the CRC is left to the background writer (crc stays 0) */
} writer;

static mpt_status w_bytes(writer *w, const void *p, size_t n) {
  if (n == 0) return MPT_OK;
  if (w->mem) {
    memcpy(w->mem + w->nbytes, p, n);
    w->nbytes += n;
    return MPT_OK;
  }
  if (fwrite(p, 1, n, w->f) != n)
    return MPT_FAIL(MPT_EIO, "checkpoint %s: write of %zu bytes at offset %llu failed: %s",
                    w->path, n, (unsigned long long)w->nbytes, strerror(errno));
  w->crc = mpt__crc_update(w->crc, p, n);
  w->nbytes += n;
  return MPT_OK;
}
static mpt_status w_u32(writer *w, uint32_t v) {
  uint8_t b[4];
  mpt__put_u32(b, v);
  return w_bytes(w, b, 4);
}
static mpt_status w_u64(writer *w, uint64_t v) {
  uint8_t b[8];
  mpt__put_u64(b, v);
  return w_bytes(w, b, 8);
}
static mpt_status w_name(writer *w, const char *name) {
  size_t len = strlen(name);
  MPT_RETURN_IF(w_u32(w, (uint32_t)len));
  return w_bytes(w, name, len);
}

/* Writes `count` floats of device memory `src`, chunk by chunk through w->chunk. */
static mpt_status w_floats(writer *w, mpt__copier *c, const float *src, int64_t count) {
  const size_t per = MPT__CKPT_CHUNK_NBYTES / sizeof(float);
  if (w->mem && count > 0) { /* a snapshot: straight into its buffer, one copy */
    uint8_t *dst = w->mem + w->nbytes;
    MPT_RETURN_IF(mpt__copier_copy(c, 0, (void *)src, dst, (size_t)count * sizeof(float)));
    mpt__floats_swap_le(dst, (size_t)count);
    w->nbytes += (uint64_t)count * sizeof(float);
    return MPT_OK;
  }
  for (int64_t done = 0; done < count;) {
    size_t n = (size_t)(count - done) < per ? (size_t)(count - done) : per;
    MPT_RETURN_IF(mpt__copier_copy(c, 0, (void *)(src + done), w->chunk, n * sizeof(float)));
    mpt__floats_swap_le(w->chunk, n);
    MPT_RETURN_IF(w_bytes(w, w->chunk, n * sizeof(float)));
    done += (int64_t)n;
  }
  return MPT_OK;
}

/* Fault injection for the kill tests (ckpt.h): SIGKILL to self at the named point. Built with
 * --enable-fault-injection only (src/core/fault.h). */
static void test_kill_point(FILE *f, const char *point) {
  const char *v = mpt__test_env("MPT_TEST_CKPT_KILL");
  if (!v || strcmp(v, point) != 0) return;
  if (f) fflush(f);
  fprintf(stderr, "mpitrain: killing itself during a checkpoint write (MPT_TEST_CKPT_KILL=%s)\n",
          point);
  fflush(stderr);
  raise(SIGKILL);
}

static mpt_status check_name(const char *what, const char *name) {
  size_t len = name ? strlen(name) : 0;
  if (len < 1 || len > MPT_CKPT_MAX_NAME)
    return MPT_FAIL(MPT_EINVAL, "checkpoint save: %s name of %zu bytes (must be 1..%d)", what,
                    len, MPT_CKPT_MAX_NAME);
  return MPT_OK;
}

/* The end of a checkpoint file's write (core/atomic_file.h): flushes, fsyncs and closes the
 * complete temporary file, then renames it into place (the kill point "before-rename" first)
 * and fsyncs the folder. `may_inject` lets MPT_TEST_CKPT_FAIL=rename fail the rename (the
 * background writer's fault hook); the caller's mpt__afile_abort then removes the file. */
static mpt_status commit_tmp(mpt__afile *af, int may_inject) {
  MPT_RETURN_IF(mpt__afile_close(af));
  test_kill_point(NULL, "before-rename");
  const char *fail_at = may_inject ? mpt__test_env("MPT_TEST_CKPT_FAIL") : NULL;
  if (fail_at && strcmp(fail_at, "rename") == 0)
    return MPT_FAIL(MPT_EIO, "%s write: cannot rename %s to %s: injected failure "
                    "(MPT_TEST_CKPT_FAIL=rename)", af->what, af->tmp, af->path);
  return mpt__afile_rename(af);
}

static const mpt_param_info *entry_info(mpt_model *model, int np, int i) {
  return i < np ? mpt_model_param_info(model, i) : mpt_model_buffer_info(model, i - np);
}

/* Writes the whole file, CRC included, in the layout of ckpt.h. os NULL: no optimizer. */
static mpt_status write_all(writer *w, mpt_model *model, const mpt_optimizer_state *os,
                            mpt_optim_kind kind, const mpt_ckpt_meta *m, uint64_t total) {
  uint8_t pre[MPT__CKPT_PREAMBLE_NBYTES];
  memcpy(pre, MPT__CKPT_MAGIC, 8);
  mpt__put_u32(pre + 8, MPT_CKPT_VERSION);
  mpt__put_u32(pre + 12, 0);
  mpt__put_u64(pre + 16, total);
  MPT_RETURN_IF(w_bytes(w, pre, sizeof pre));

  const int64_t head[] = {m->epoch, m->global_step, m->step_in_epoch, m->sampler_epoch};
  for (size_t i = 0; i < 4; i++) MPT_RETURN_IF(w_u64(w, (uint64_t)head[i]));
  MPT_RETURN_IF(w_u64(w, m->seed));
  MPT_RETURN_IF(w_u32(w, (uint32_t)m->world_size));
  MPT_RETURN_IF(w_u32(w, (uint32_t)m->num_rngs));
  for (int r = 0; r < m->num_rngs; r++)
    for (int i = 0; i < 4; i++) MPT_RETURN_IF(w_u64(w, m->rngs[r].s[i]));
  const int64_t resume[] = {m->global_batch, m->epoch_cursor, m->epoch_samples,
                            m->dataset_count, m->batch_size};
  for (size_t i = 0; i < 5; i++) MPT_RETURN_IF(w_u64(w, (uint64_t)resume[i]));
  MPT_RETURN_IF(w_u32(w, (uint32_t)m->accumulate));
  MPT_RETURN_IF(w_u32(w, 0));

  int np = mpt_model_num_params(model), nb = mpt_model_num_buffers(model);
  MPT_RETURN_IF(w_u32(w, (uint32_t)np));
  MPT_RETURN_IF(w_u32(w, (uint32_t)nb));
  for (int i = 0; i < np + nb; i++) {
    const mpt_param_info *info = entry_info(model, np, i);
    MPT_RETURN_IF(w_name(w, info->name));
    MPT_RETURN_IF(w_u32(w, (uint32_t)info->dtype));
    MPT_RETURN_IF(w_u32(w, (uint32_t)info->ndim));
    for (int d = 0; d < info->ndim; d++) MPT_RETURN_IF(w_u64(w, (uint64_t)info->shape[d]));
  }
  int64_t pc = mpt_model_param_count(model), bc = mpt_model_buffer_count(model);
  MPT_RETURN_IF(w_u64(w, (uint64_t)pc));
  MPT_RETURN_IF(w_u64(w, (uint64_t)bc));

  MPT_RETURN_IF(w_u32(w, os ? (uint32_t)kind : MPT_CKPT_NO_OPTIMIZER));
  MPT_RETURN_IF(w_u32(w, os ? (uint32_t)os->nbuffers : 0));
  MPT_RETURN_IF(w_u64(w, os ? (uint64_t)os->step_count : 0));
  MPT_RETURN_IF(w_u64(w, os ? (uint64_t)os->count : 0));
  for (int s = 0; os && s < os->nbuffers; s++) MPT_RETURN_IF(w_name(w, os->names[s]));

  mpt__copier c = {0};
  mpt_status st;
  MPT_CHECK(mpt__copier_init(&c, mpt_model_device(model)), out);
  const float *params = mpt_model_params(model);
  MPT_CHECK(w_floats(w, &c, params, pc / 2), out);
  if (!w->mem) test_kill_point(w->f, "mid-write"); /* a snapshot's is in mpt__ckpt_write_bytes */
  MPT_CHECK(w_floats(w, &c, params + pc / 2, pc - pc / 2), out);
  MPT_CHECK(w_floats(w, &c, mpt_model_buffers(model), bc), out);
  if (os && os->nbuffers > 0 && os->count > 0) {
    mpt__copier_free(&c);
    MPT_CHECK(mpt__copier_init(&c, os->device), out);
    for (int s = 0; s < os->nbuffers; s++) MPT_CHECK(w_floats(w, &c, os->buffers[s], os->count), out);
  }
  if (w->nbytes + MPT__CKPT_CRC_NBYTES != total) {
    st = MPT_FAIL(MPT_ESTATE, "checkpoint %s: wrote %llu bytes, planned %llu (internal error)",
                  w->path, (unsigned long long)(w->nbytes + MPT__CKPT_CRC_NBYTES),
                  (unsigned long long)total);
    goto out;
  }
  uint8_t crc[4];
  mpt__put_u32(crc, w->crc);
  MPT_CHECK(w_bytes(w, crc, 4), out);
out:
  mpt__copier_free(&c);
  return st;
}

/* Checks the arguments and computes the exact file size into *total (it goes into the
 * preamble); *os and *kind describe the optimizer's state when there is one. */
static mpt_status plan(const char *path, mpt_model *model, mpt_optimizer *optimizer,
                       const mpt_ckpt_meta *meta, mpt_ckpt_meta *out_meta,
                       mpt_optimizer_state *out_os, mpt_optim_kind *out_kind, uint64_t *out_total) {
  mpt_ckpt_meta m = meta ? *meta : mpt_ckpt_meta_default();
  MPT_RETURN_IF(mpt__ckpt_meta_check(&m, MPT_EINVAL, "checkpoint save"));
  MPT_RETURN_IF(mpt__ckpt_model_check(model, "checkpoint save", path));
  int np = mpt_model_num_params(model), nb = mpt_model_num_buffers(model);
  int64_t pc = mpt_model_param_count(model), bc = mpt_model_buffer_count(model);

  /* The exact file size, which goes into the preamble: preamble, meta, signature counts and
   * totals, optimizer header, then the variable parts. */
  uint64_t total = MPT__CKPT_PREAMBLE_NBYTES + (5 * 8 + 4 + 4) + 32 * (uint64_t)m.num_rngs +
                   MPT__CKPT_RESUME_NBYTES +
                   (4 + 4 + 8 + 8) + (4 + 4 + 8 + 8) + 4 * (uint64_t)(pc + bc) +
                   MPT__CKPT_CRC_NBYTES;
  for (int i = 0; i < np + nb; i++) {
    const mpt_param_info *info = entry_info(model, np, i);
    MPT_RETURN_IF(check_name(i < np ? "parameter" : "buffer", info->name));
    total += 4 + strlen(info->name) + 4 + 4 + 8 * (uint64_t)info->ndim;
  }
  mpt_optimizer_state os;
  mpt_optim_kind kind = MPT_OPTIM_SGD;
  if (optimizer && mpt_optimizer_num_ranges(optimizer) > 0)
    return MPT_FAIL(MPT_EINVAL, "checkpoint save %s: the optimizer holds one shard of the state "
                    "(ZeRO-1): gather it first (mpt_ddp_optimizer_gather)", path);
  if (optimizer) {
    MPT_RETURN_IF(mpt_optimizer_get_state(optimizer, &os));
    kind = mpt_optimizer_get_config(optimizer)->kind;
    for (int s = 0; s < os.nbuffers; s++) {
      MPT_RETURN_IF(check_name("optimizer state", os.names[s]));
      total += 4 + strlen(os.names[s]);
      if (os.count > 0 && !os.buffers[s])
        return MPT_FAIL(MPT_ESTATE, "checkpoint save %s: optimizer state '%s' is NULL", path,
                        os.names[s]);
    }
    total += 4 * (uint64_t)os.nbuffers * (uint64_t)os.count;
  }
  *out_meta = m;
  if (optimizer) *out_os = os;
  *out_kind = kind;
  *out_total = total;
  return MPT_OK;
}

mpt_status mpt_ckpt_save(const char *path, mpt_model *model, mpt_optimizer *optimizer,
                         const mpt_ckpt_meta *meta) {
  if (!path || !path[0] || !model)
    return MPT_FAIL(MPT_EINVAL, "checkpoint save: NULL or empty path, or NULL model");
  mpt_ckpt_meta m;
  mpt_optimizer_state os;
  mpt_optim_kind kind;
  uint64_t total;
  MPT_RETURN_IF(plan(path, model, optimizer, meta, &m, &os, &kind, &total));

  mpt__afile af = {0};
  mpt_status st = MPT_OK;
  void *chunk = malloc(MPT__CKPT_CHUNK_NBYTES);
  if (!chunk) {
    st = MPT_FAIL(MPT_ENOMEM, "checkpoint save %s: out of host memory", path);
    goto out;
  }
  MPT_CHECK(mpt__afile_open(&af, path, "checkpoint"), out);
  writer w = {af.f, af.tmp, 0, 0, chunk, NULL};
  MPT_CHECK(write_all(&w, model, optimizer ? &os : NULL, kind, &m, total), out);
  st = commit_tmp(&af, 0);
out:
  mpt__afile_abort(&af);
  free(chunk);
  return st;
}

/* ------------------------------------------------------------------------------------------ */
/* Background checkpoints: the file's bytes into host memory, then written from there          */

mpt_status mpt__ckpt_snapshot(const char *path, mpt_model *model, mpt_optimizer *optimizer,
                              const mpt_ckpt_meta *meta, uint8_t **bytes, size_t *nbytes) {
  if (!path || !path[0] || !model || !bytes || !nbytes)
    return MPT_FAIL(MPT_EINVAL, "checkpoint snapshot: NULL argument");
  mpt_ckpt_meta m;
  mpt_optimizer_state os;
  mpt_optim_kind kind;
  uint64_t total;
  MPT_RETURN_IF(plan(path, model, optimizer, meta, &m, &os, &kind, &total));
  if (total > (uint64_t)SIZE_MAX)
    return MPT_FAIL(MPT_ENOMEM, "checkpoint snapshot %s: %llu bytes do not fit in memory", path,
                    (unsigned long long)total);
  uint8_t *mem = malloc((size_t)total);
  void *chunk = malloc(MPT__CKPT_CHUNK_NBYTES);
  if (!mem || !chunk) {
    free(mem);
    free(chunk);
    return MPT_FAIL(MPT_ENOMEM, "checkpoint snapshot %s: cannot allocate %llu bytes of host "
                    "memory (--checkpoint-async off writes without it)", path,
                    (unsigned long long)total);
  }
  writer w = {NULL, path, 0, 0, chunk, mem};
  mpt_status st = write_all(&w, model, optimizer ? &os : NULL, kind, &m, total);
  free(chunk);
  test_kill_point(NULL, "snapshot");
  if (st != MPT_OK) {
    free(mem);
    return st;
  }
  *bytes = mem;
  *nbytes = (size_t)total;
  return MPT_OK;
}

void mpt__ckpt_seal(uint8_t *bytes, size_t nbytes) {
  if (!bytes || nbytes < MPT__CKPT_CRC_NBYTES) return;
  size_t body = nbytes - MPT__CKPT_CRC_NBYTES;
  mpt__put_u32(bytes + body, mpt__crc_update(0, bytes, body));
}

mpt_status mpt__ckpt_write_bytes(const char *path, const uint8_t *bytes, size_t nbytes) {
  if (!path || !path[0] || (!bytes && nbytes))
    return MPT_FAIL(MPT_EINVAL, "checkpoint write: NULL argument");
  mpt__afile af;
  mpt_status st = MPT_OK;
  MPT_CHECK(mpt__afile_open(&af, path, "checkpoint"), out);
  size_t half = nbytes / 2;
  MPT_CHECK(mpt__afile_write(&af, bytes, half), out);
  test_kill_point(af.f, "mid-write");
  MPT_CHECK(mpt__afile_write(&af, bytes + half, nbytes - half), out);
  test_kill_point(af.f, "before-fsync");
  st = commit_tmp(&af, 1);
  if (st == MPT_OK) test_kill_point(NULL, "after-rename");
out:
  mpt__afile_abort(&af);
  return st;
}
