/* The checkpoint file format (include/mpitrain/ckpt.h, version 1): the atomic writer
 * (mpt_ckpt_save) and the validating reader (mpt_ckpt_load, mpt_ckpt_read_meta, and the
 * stage / commit halves used by the collective wrapper in dir.c).
 *
 * Invariants of the reader: no byte of the model or optimizer is written before the whole file
 * has been checked (preamble, length, CRC, structure, signature, optimizer) and staged in host
 * memory; every length read from the file is checked against the bytes left before the CRC
 * before it is used; the only allocations are a fixed-size I/O chunk and the staging buffer,
 * whose size comes from the model and optimizer (and is only made once the file was found to
 * describe exactly those). The file is read twice: a first pass checks the CRC, so that a
 * corrupt file is reported as corrupt rather than as, say, a different model; the second pass
 * parses and stages, recomputing the CRC, so a file changed between the passes is caught too.
 *
 * Runs on the calling thread; device copies go through a temporary inline stream of the
 * device, synchronized before returning. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "ckpt/ckpt_impl.h"
#include "core/error.h"
#include "mpitrain/ops.h"

#define CKPT_MAGIC "MPTCKPT\0"
#define PREAMBLE_NBYTES 24u
#define CRC_NBYTES 4u
#define CHUNK_NBYTES ((size_t)1 << 20)
#define COPY_TIMEOUT_MS 600000.0

/* ------------------------------------------------------------------------------------------ */
/* Bytes                                                                                      */

static void put_u32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put_u64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get_u32(const uint8_t *p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
  return v;
}
static uint64_t get_u64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

/* Converts `count` float32 in place between host order and little-endian (its own inverse). */
static void floats_swap_le(void *p, size_t count) {
  const uint16_t one = 1;
  uint8_t first;
  memcpy(&first, &one, 1);
  if (first == 1) return; /* little-endian host: the bytes are already in file order */
  uint8_t *b = p;
  for (size_t i = 0; i < count; i++, b += 4) {
    uint8_t t0 = b[0], t1 = b[1];
    b[0] = b[3], b[1] = b[2], b[2] = t1, b[3] = t0;
  }
}

static uint32_t crc_update(uint32_t crc, const void *p, size_t n) {
  const Bytef *b = p;
  while (n > 0) {
    uInt len = n > (1u << 30) ? (1u << 30) : (uInt)n;
    crc = (uint32_t)crc32(crc, b, len);
    b += len, n -= len;
  }
  return crc;
}

/* ------------------------------------------------------------------------------------------ */
/* Device copies through a temporary inline stream                                            */

typedef struct copier {
  mpt_device device;
  mpt_stream *stream;
} copier;

static mpt_status copier_init(copier *c, mpt_device device) {
  c->device = device;
  c->stream = NULL;
  return mpt_stream_init(&c->stream, device, MPT_STREAM_INLINE);
}

static void copier_free(copier *c) {
  mpt_stream_free(c->stream);
  c->stream = NULL;
}

/* to_device: host -> device, else device -> host; synchronized before returning. */
static mpt_status copier_copy(copier *c, int to_device, void *dev, void *host, size_t nbytes) {
  if (nbytes == 0) return MPT_OK;
  mpt_device cpu = mpt_device_cpu();
  MPT_RETURN_IF(to_device ? mpt_op_memcpy(c->stream, c->device, dev, cpu, host, nbytes)
                          : mpt_op_memcpy(c->stream, cpu, host, c->device, dev, nbytes));
  return mpt_stream_synchronize(c->stream, COPY_TIMEOUT_MS);
}

/* ------------------------------------------------------------------------------------------ */
/* Meta                                                                                       */

mpt_ckpt_meta mpt_ckpt_meta_default(void) {
  mpt_ckpt_meta m;
  memset(&m, 0, sizeof m);
  m.world_size = 1;
  return m;
}

/* The ranges of ckpt.h; `status` is MPT_EINVAL for a caller's meta, MPT_EFORMAT for a file's. */
static mpt_status meta_check(const mpt_ckpt_meta *m, mpt_status status, const char *where) {
  const struct { const char *name; int64_t v; } f[] = {{"epoch", m->epoch},
                                                      {"global_step", m->global_step},
                                                      {"step_in_epoch", m->step_in_epoch},
                                                      {"sampler_epoch", m->sampler_epoch}};
  for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
    if (f[i].v < 0) return MPT_FAIL(status, "%s: %s %lld < 0", where, f[i].name, (long long)f[i].v);
  if (m->world_size < 1)
    return MPT_FAIL(status, "%s: world_size %d < 1", where, (int)m->world_size);
  if (m->num_rngs < 0 || m->num_rngs > MPT_CKPT_MAX_RNGS)
    return MPT_FAIL(status, "%s: num_rngs %d outside [0, %d]", where, (int)m->num_rngs,
                    MPT_CKPT_MAX_RNGS);
  return MPT_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Writer                                                                                     */

typedef struct writer {
  FILE *f;
  const char *path; /* the temporary file, for messages */
  uint32_t crc;
  uint64_t nbytes;
} writer;

static mpt_status w_bytes(writer *w, const void *p, size_t n) {
  if (n == 0) return MPT_OK;
  if (fwrite(p, 1, n, w->f) != n)
    return MPT_FAIL(MPT_EIO, "checkpoint %s: write of %zu bytes at offset %llu failed: %s",
                    w->path, n, (unsigned long long)w->nbytes, strerror(errno));
  w->crc = crc_update(w->crc, p, n);
  w->nbytes += n;
  return MPT_OK;
}
static mpt_status w_u32(writer *w, uint32_t v) {
  uint8_t b[4];
  put_u32(b, v);
  return w_bytes(w, b, 4);
}
static mpt_status w_u64(writer *w, uint64_t v) {
  uint8_t b[8];
  put_u64(b, v);
  return w_bytes(w, b, 8);
}
static mpt_status w_name(writer *w, const char *name) {
  size_t len = strlen(name);
  MPT_RETURN_IF(w_u32(w, (uint32_t)len));
  return w_bytes(w, name, len);
}

/* Writes count floats from device memory through the host chunk `chunk` (CHUNK_NBYTES). */
static mpt_status w_floats(writer *w, copier *c, const float *src, int64_t count, void *chunk) {
  const size_t per = CHUNK_NBYTES / sizeof(float);
  for (int64_t done = 0; done < count;) {
    size_t n = (size_t)(count - done) < per ? (size_t)(count - done) : per;
    MPT_RETURN_IF(copier_copy(c, 0, (void *)(src + done), chunk, n * sizeof(float)));
    floats_swap_le(chunk, n);
    MPT_RETURN_IF(w_bytes(w, chunk, n * sizeof(float)));
    done += (int64_t)n;
  }
  return MPT_OK;
}

/* Fault injection for the kill tests (ckpt.h): SIGKILL to self at the named point. */
static void test_kill_point(FILE *f, const char *point) {
  const char *v = getenv("MPT_TEST_CKPT_KILL");
  if (!v || strcmp(v, point) != 0) return;
  if (f) fflush(f);
  fprintf(stderr, "mpitrain: killing itself during a checkpoint write (MPT_TEST_CKPT_KILL=%s)\n",
          point);
  raise(SIGKILL);
}

/* The byte size of one signature entry / name record. */
static uint64_t entry_nbytes(const mpt_param_info *info) {
  return 4 + strlen(info->name) + 4 + 4 + 8 * (uint64_t)info->ndim;
}

static mpt_status check_name(const char *what, const char *name) {
  size_t len = name ? strlen(name) : 0;
  if (len < 1 || len > MPT_CKPT_MAX_NAME)
    return MPT_FAIL(MPT_EINVAL, "checkpoint: %s name of %zu bytes (must be 1..%d)", what, len,
                    MPT_CKPT_MAX_NAME);
  return MPT_OK;
}

/* fsyncs the directory holding `path`. EINVAL / ENOTSUP (file systems that cannot) are not
 * errors. */
static mpt_status fsync_parent(const char *path) {
  char *dir = strdup(path);
  if (!dir) return MPT_FAIL(MPT_ENOMEM, "checkpoint: out of memory");
  char *slash = strrchr(dir, '/');
  if (!slash) strcpy(dir, ".");
  else if (slash == dir) dir[1] = '\0';
  else *slash = '\0';
  mpt_status st = MPT_OK;
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0 || (fsync(fd) != 0 && errno != EINVAL && errno != ENOTSUP))
    st = MPT_FAIL(MPT_EIO, "checkpoint %s: cannot fsync its directory %s: %s (the file was "
                  "renamed into place but may not be on disk)", path, dir, strerror(errno));
  if (fd >= 0) close(fd);
  free(dir);
  return st;
}

/* Writes everything (with the CRC) to w; see the layout in ckpt.h. */
static mpt_status write_all(writer *w, mpt_model *model, const mpt_optimizer_state *os,
                            mpt_optim_kind kind, const mpt_ckpt_meta *m, uint64_t total,
                            void *chunk) {
  uint8_t pre[PREAMBLE_NBYTES];
  memcpy(pre, CKPT_MAGIC, 8);
  put_u32(pre + 8, MPT_CKPT_VERSION);
  put_u32(pre + 12, 0);
  put_u64(pre + 16, total);
  MPT_RETURN_IF(w_bytes(w, pre, sizeof pre));
  const int64_t head[] = {m->epoch, m->global_step, m->step_in_epoch, m->sampler_epoch};
  for (size_t i = 0; i < 4; i++) MPT_RETURN_IF(w_u64(w, (uint64_t)head[i]));
  MPT_RETURN_IF(w_u64(w, m->seed));
  MPT_RETURN_IF(w_u32(w, (uint32_t)m->world_size));
  MPT_RETURN_IF(w_u32(w, (uint32_t)m->num_rngs));
  for (int r = 0; r < m->num_rngs; r++)
    for (int i = 0; i < 4; i++) MPT_RETURN_IF(w_u64(w, m->rngs[r].s[i]));

  int np = mpt_model_num_params(model), nb = mpt_model_num_buffers(model);
  MPT_RETURN_IF(w_u32(w, (uint32_t)np));
  MPT_RETURN_IF(w_u32(w, (uint32_t)nb));
  for (int i = 0; i < np + nb; i++) {
    const mpt_param_info *info =
        i < np ? mpt_model_param_info(model, i) : mpt_model_buffer_info(model, i - np);
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

  copier c = {0};
  mpt_status st;
  MPT_CHECK(copier_init(&c, mpt_model_device(model)), out);
  MPT_CHECK(w_floats(w, &c, mpt_model_params(model), pc / 2, chunk), out);
  test_kill_point(w->f, "mid-write");
  MPT_CHECK(w_floats(w, &c, mpt_model_params(model) + pc / 2, pc - pc / 2, chunk), out);
  MPT_CHECK(w_floats(w, &c, mpt_model_buffers(model), bc, chunk), out);
  if (os && os->nbuffers > 0) {
    copier_free(&c);
    MPT_CHECK(copier_init(&c, os->device), out);
    for (int s = 0; s < os->nbuffers; s++)
      MPT_CHECK(w_floats(w, &c, os->buffers[s], os->count, chunk), out);
  }
  if (w->nbytes + CRC_NBYTES != total) {
    st = MPT_FAIL(MPT_ESTATE, "checkpoint %s: wrote %llu bytes, planned %llu (internal error)",
                  w->path, (unsigned long long)(w->nbytes + CRC_NBYTES),
                  (unsigned long long)total);
    goto out;
  }
  uint8_t crc[4];
  put_u32(crc, w->crc);
  MPT_CHECK(w_bytes(w, crc, 4), out);
out:
  copier_free(&c);
  return st;
}

mpt_status mpt_ckpt_save(const char *path, mpt_model *model, mpt_optimizer *optimizer,
                         const mpt_ckpt_meta *meta) {
  if (!path || !path[0] || !model)
    return MPT_FAIL(MPT_EINVAL, "checkpoint save: NULL or empty path, or NULL model");
  mpt_ckpt_meta m = meta ? *meta : mpt_ckpt_meta_default();
  MPT_RETURN_IF(meta_check(&m, MPT_EINVAL, "checkpoint save"));
  int np = mpt_model_num_params(model), nb = mpt_model_num_buffers(model);
  int64_t pc = mpt_model_param_count(model), bc = mpt_model_buffer_count(model);
  if ((pc > 0 && !mpt_model_params(model)) || (bc > 0 && !mpt_model_buffers(model)))
    return MPT_FAIL(MPT_ESTATE, "checkpoint save %s: the model is not finalised", path);

  /* The exact file size, written into the preamble. */
  uint64_t total = PREAMBLE_NBYTES + 5 * 8 + 4 + 4 + 32 * (uint64_t)m.num_rngs + 4 + 4 + 8 + 8;
  for (int i = 0; i < np + nb; i++) {
    const mpt_param_info *info =
        i < np ? mpt_model_param_info(model, i) : mpt_model_buffer_info(model, i - np);
    MPT_RETURN_IF(check_name(i < np ? "parameter" : "buffer", info->name));
    total += entry_nbytes(info);
  }
  mpt_optimizer_state os;
  mpt_optim_kind kind = MPT_OPTIM_SGD;
  total += 4 + 4 + 8 + 8;
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
  total += 4 * (uint64_t)(pc + bc) + CRC_NBYTES;

  size_t plen = strlen(path);
  char *tmp = malloc(plen + 32);
  void *chunk = malloc(CHUNK_NBYTES);
  FILE *f = NULL;
  int created = 0;
  mpt_status st = MPT_OK;
  if (!tmp || !chunk) {
    st = MPT_FAIL(MPT_ENOMEM, "checkpoint save %s: out of host memory", path);
    goto out;
  }
  snprintf(tmp, plen + 32, "%s.tmp.%ld", path, (long)getpid());
  f = fopen(tmp, "wbe");
  if (!f) {
    st = MPT_FAIL(MPT_EIO, "checkpoint save: cannot create %s: %s", tmp, strerror(errno));
    goto out;
  }
  created = 1;
  writer w = {f, tmp, 0, 0};
  MPT_CHECK(write_all(&w, model, optimizer ? &os : NULL, kind, &m, total, chunk), out);
  if (fflush(f) != 0 || fsync(fileno(f)) != 0) {
    st = MPT_FAIL(MPT_EIO, "checkpoint save: cannot flush %s to disk: %s", tmp, strerror(errno));
    goto out;
  }
  int rc = fclose(f);
  f = NULL;
  if (rc != 0) {
    st = MPT_FAIL(MPT_EIO, "checkpoint save: cannot close %s: %s", tmp, strerror(errno));
    goto out;
  }
  test_kill_point(NULL, "before-rename");
  if (rename(tmp, path) != 0) {
    st = MPT_FAIL(MPT_EIO, "checkpoint save: cannot rename %s to %s: %s", tmp, path,
                  strerror(errno));
    goto out;
  }
  created = 0;
  st = fsync_parent(path);
out:
  if (f) fclose(f);
  if (created) unlink(tmp);
  free(chunk);
  free(tmp);
  return st;
}

/* ------------------------------------------------------------------------------------------ */
/* Reader                                                                                     */

typedef struct reader {
  FILE *f;
  const char *path;
  uint64_t pos;   /* bytes consumed */
  uint64_t limit; /* bytes before the CRC */
  uint32_t crc;   /* of bytes [0, pos) */
} reader;

static mpt_status r_bytes(reader *r, void *p, uint64_t n, const char *what) {
  if (n > r->limit - r->pos)
    return MPT_FAIL(MPT_EFORMAT, "checkpoint %s: %s at offset %llu needs %llu bytes, but only "
                    "%llu remain before the checksum (corrupt file)", r->path, what,
                    (unsigned long long)r->pos, (unsigned long long)n,
                    (unsigned long long)(r->limit - r->pos));
  if (n > 0 && fread(p, 1, (size_t)n, r->f) != (size_t)n)
    return MPT_FAIL(MPT_EIO, "checkpoint %s: read of %s at offset %llu failed: %s (the file "
                    "changed while it was read?)", r->path, what, (unsigned long long)r->pos,
                    ferror(r->f) ? strerror(errno) : "unexpected end of file");
  r->crc = crc_update(r->crc, p, (size_t)n);
  r->pos += n;
  return MPT_OK;
}
static mpt_status r_u32(reader *r, uint32_t *v, const char *what) {
  uint8_t b[4];
  MPT_RETURN_IF(r_bytes(r, b, 4, what));
  *v = get_u32(b);
  return MPT_OK;
}
static mpt_status r_u64(reader *r, uint64_t *v, const char *what) {
  uint8_t b[8];
  MPT_RETURN_IF(r_bytes(r, b, 8, what));
  *v = get_u64(b);
  return MPT_OK;
}
static mpt_status r_i64(reader *r, int64_t *v, const char *what) {
  uint64_t u;
  MPT_RETURN_IF(r_u64(r, &u, what));
  *v = (int64_t)u;
  return MPT_OK;
}
/* A name into buf[MPT_CKPT_MAX_NAME + 1], NUL-terminated; embedded NULs are a format error. */
static mpt_status r_name(reader *r, char *buf, const char *what) {
  uint32_t len;
  MPT_RETURN_IF(r_u32(r, &len, what));
  if (len < 1 || len > MPT_CKPT_MAX_NAME)
    return MPT_FAIL(MPT_EFORMAT, "checkpoint %s: %s length %u at offset %llu outside [1, %d]",
                    r->path, what, len, (unsigned long long)(r->pos - 4), MPT_CKPT_MAX_NAME);
  MPT_RETURN_IF(r_bytes(r, buf, len, what));
  buf[len] = '\0';
  if (strlen(buf) != len)
    return MPT_FAIL(MPT_EFORMAT, "checkpoint %s: %s at offset %llu contains a NUL byte", r->path,
                    what, (unsigned long long)(r->pos - len));
  return MPT_OK;
}

/* The header fields the parser extracts. */
typedef struct parsed {
  mpt_ckpt_meta meta;
  uint64_t param_count, buffer_count;
  uint32_t opt_kind, opt_nbuffers;
  int64_t opt_step_count;
  uint64_t opt_count;
} parsed;

#include "ckpt/parse.inc"
