/* The validating checkpoint reader (include/mpitrain/ckpt.h, format versions 1 and 2):
 * mpt_ckpt_load, mpt_ckpt_read_meta, and the stage / commit halves (ckpt_impl.h) used by the
 * collective load.
 *
 * Invariants: no byte of the model or optimizer is written before the whole file has been
 * checked (preamble, length, CRC, structure, signature, optimizer) and staged in host memory;
 * every length read from the file is checked against the bytes left before the CRC before it
 * is used; the only allocations are a fixed-size I/O chunk and the staging buffer, whose size
 * comes from the model and optimizer and is made only once the file was found to describe
 * exactly those. The file is read twice through one open handle: the first pass checks the
 * CRC, so that a corrupt file is reported as corrupt rather than as, say, a different model;
 * the second parses and stages, recomputing the CRC, so that a file rewritten in place between
 * the passes is caught as well. Runs on the calling thread. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt_impl.h"
#include "mpitrain/gpt_file.h"

typedef struct reader {
  FILE *f;
  const char *path;
  uint64_t pos;   /* bytes consumed */
  uint64_t limit; /* bytes before the CRC */
  uint32_t crc;   /* of bytes [0, pos) */
  uint32_t stored_crc;
  void *chunk;    /* MPT__CKPT_CHUNK_NBYTES */
} reader;

static mpt_status r_bytes(reader *r, void *p, uint64_t n, const char *what) {
  if (n > r->limit - r->pos)
    return MPT_FAIL(MPT_EFORMAT, "checkpoint %s: %s at offset %" PRIu64 " needs %" PRIu64
                    " bytes but only %" PRIu64 " remain before the checksum (corrupt file)",
                    r->path, what, r->pos, n, r->limit - r->pos);
  if (n > 0 && fread(p, 1, (size_t)n, r->f) != (size_t)n)
    return MPT_FAIL(MPT_EIO, "checkpoint %s: reading %s at offset %" PRIu64 " failed: %s",
                    r->path, what, r->pos,
                    ferror(r->f) ? strerror(errno) : "end of file (the file shrank?)");
  r->crc = mpt__crc_update(r->crc, p, (size_t)n);
  r->pos += n;
  return MPT_OK;
}
static mpt_status r_u32(reader *r, uint32_t *v, const char *what) {
  uint8_t b[4];
  MPT_RETURN_IF(r_bytes(r, b, 4, what));
  *v = mpt__get_u32(b);
  return MPT_OK;
}
static mpt_status r_u64(reader *r, uint64_t *v, const char *what) {
  uint8_t b[8];
  MPT_RETURN_IF(r_bytes(r, b, 8, what));
  *v = mpt__get_u64(b);
  return MPT_OK;
}
static mpt_status r_i64(reader *r, int64_t *v, const char *what) {
  uint64_t u;
  MPT_RETURN_IF(r_u64(r, &u, what));
  *v = (int64_t)u;
  return MPT_OK;
}
/* A name into buf[MPT_CKPT_MAX_NAME + 1], NUL-terminated; an embedded NUL is a format error. */
static mpt_status r_name(reader *r, char *buf, const char *what) {
  uint32_t len;
  MPT_RETURN_IF(r_u32(r, &len, what));
  if (len < 1 || len > MPT_CKPT_MAX_NAME)
    return MPT_FAIL(MPT_EFORMAT, "checkpoint %s: %s length %" PRIu32 " at offset %" PRIu64
                    " outside [1, %d]", r->path, what, len, r->pos - 4, MPT_CKPT_MAX_NAME);
  MPT_RETURN_IF(r_bytes(r, buf, len, what));
  buf[len] = '\0';
  if (strlen(buf) != len)
    return MPT_FAIL(MPT_EFORMAT, "checkpoint %s: %s at offset %" PRIu64 " contains a NUL byte",
                    r->path, what, r->pos - len);
  return MPT_OK;
}
/* Consumes n bytes through the chunk (they count in the CRC). */
static mpt_status r_skip(reader *r, uint64_t n, const char *what) {
  while (n > 0) {
    size_t k = n < MPT__CKPT_CHUNK_NBYTES ? (size_t)n : MPT__CKPT_CHUNK_NBYTES;
    MPT_RETURN_IF(r_bytes(r, r->chunk, k, what));
    n -= k;
  }
  return MPT_OK;
}

/* Opens `path` and checks, in order: regular file, magic, version, flags, the length in the
 * preamble against the real one, the CRC. Leaves r at offset 0 for the parse. */
static mpt_status open_checked(const char *path, reader *r) {
  r->path = path;
  /* O_NONBLOCK so that opening a FIFO does not wait forever for a writer (it is refused just
   * below, as is anything but a regular file); it is cleared again before reading. */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0)
    return MPT_FAIL(errno == ENOENT ? MPT_ENOENT : MPT_EIO, "checkpoint %s: cannot open: %s",
                    path, strerror(errno));
  r->f = fdopen(fd, "rb");
  if (!r->f) {
    int e = errno;
    close(fd);
    return MPT_FAIL(MPT_EIO, "checkpoint %s: cannot open: %s", path, strerror(e));
  }
  struct stat sb;
  if (fstat(fd, &sb) != 0)
    return MPT_FAIL(MPT_EIO, "checkpoint %s: cannot stat: %s", path, strerror(errno));
  if (!S_ISREG(sb.st_mode))
    return MPT_FAIL(MPT_EIO, "checkpoint %s: not a regular file", path);
  int fl = fcntl(fd, F_GETFL);
  if (fl != -1) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  uint64_t size = (uint64_t)sb.st_size;
  const uint64_t min_size = MPT__CKPT_PREAMBLE_NBYTES + MPT__CKPT_CRC_NBYTES;

  uint8_t pre[MPT__CKPT_PREAMBLE_NBYTES];
  size_t want = size < sizeof pre ? (size_t)size : sizeof pre;
  if (fread(pre, 1, want, r->f) != want)
    return MPT_FAIL(MPT_EIO, "checkpoint %s: cannot read its header: %s", path,
                    ferror(r->f) ? strerror(errno) : "end of file");
  if (want >= 8 && memcmp(pre, MPT__CKPT_MAGIC, 8) != 0) {
    if (mpt__get_u32(pre) == MPT_GPT_FILE_MAGIC) /* the reverse of --init-from's mistake */
      return MPT_FAIL(MPT_EFORMAT, "checkpoint %s: an llm.c model file (as --save-model writes "
                      "it), not an mpitrain checkpoint: start from its weights with --init-from "
                      "(mpt_gpt_load); a checkpoint holds the optimizer state and position too",
                      path);
    return MPT_FAIL(MPT_EFORMAT, "checkpoint %s: not an mpitrain checkpoint (the file does not "
                    "start with the magic \"MPTCKPT\\0\")", path);
  }
  if (size < sizeof pre)
    return MPT_FAIL(MPT_EFORMAT, "checkpoint %s is truncated: it has %" PRIu64 " bytes, fewer "
                    "than the %u of the header", path, size, MPT__CKPT_PREAMBLE_NBYTES);
  uint32_t version = mpt__get_u32(pre + 8), flags = mpt__get_u32(pre + 12);
  if (version > MPT_CKPT_VERSION)
    return MPT_FAIL(MPT_ENOTSUP, "checkpoint %s has format version %" PRIu32 ", newer than "
                    "this build of mpitrain reads (version %u): use a newer mpitrain", path,
                    version, MPT_CKPT_VERSION);
  if (version == 0)
    return MPT_FAIL(MPT_ENOTSUP, "checkpoint %s has format version 0, which does not exist "
                    "(this build reads version %u)", path, MPT_CKPT_VERSION);
  if (flags != 0)
    return MPT_FAIL(MPT_EFORMAT, "checkpoint %s: unknown flags 0x%08" PRIx32 " in its header",
                    path, flags);
  uint64_t expected = mpt__get_u64(pre + 16);
  if (size < expected)
    return MPT_FAIL(MPT_EFORMAT, "checkpoint %s is truncated: expected %" PRIu64 " bytes (the "
                    "size in its header), the file has %" PRIu64, path, expected, size);
  if (size > expected)
    return MPT_FAIL(MPT_EFORMAT, "checkpoint %s has %" PRIu64 " bytes but its header says %"
                    PRIu64 " (trailing data or a corrupt header)", path, size, expected);
  if (size < min_size)
    return MPT_FAIL(MPT_EFORMAT, "checkpoint %s: its header gives a size of %" PRIu64 " bytes, "
                    "less than the %" PRIu64 " of the header and checksum (corrupt file)", path,
                    size, min_size);

  /* Pass 1: the CRC over everything but the trailer. */
  r->limit = size - MPT__CKPT_CRC_NBYTES;
  r->pos = sizeof pre;
  r->crc = mpt__crc_update(0, pre, sizeof pre);
  MPT_RETURN_IF(r_skip(r, r->limit - r->pos, "data"));
  uint8_t trailer[4];
  if (fread(trailer, 1, 4, r->f) != 4)
    return MPT_FAIL(MPT_EIO, "checkpoint %s: cannot read its checksum: %s", path,
                    ferror(r->f) ? strerror(errno) : "end of file (the file shrank?)");
  r->stored_crc = mpt__get_u32(trailer);
  if (r->stored_crc != r->crc)
    return MPT_FAIL(MPT_EFORMAT, "checkpoint %s is corrupt: CRC-32 mismatch (stored 0x%08" PRIx32
                    ", computed 0x%08" PRIx32 " over %" PRIu64 " bytes)", path, r->stored_crc,
                    r->crc, r->limit);
  if (fseek(r->f, 0, SEEK_SET) != 0)
    return MPT_FAIL(MPT_EIO, "checkpoint %s: cannot seek: %s", path, strerror(errno));
  r->pos = 0;
  r->crc = 0;
  return MPT_OK;
}

/* The header fields the parse extracts. */
typedef struct parsed {
  mpt_ckpt_meta meta;
  uint32_t num_params, num_buffers;
  uint64_t param_count, buffer_count;
  uint32_t opt_kind, opt_nbuffers;
  int64_t opt_step_count;
  uint64_t opt_count;
} parsed;

/* One signature entry as read from the file. */
typedef struct entry {
  char name[MPT_CKPT_MAX_NAME + 1];
  uint32_t dtype, ndim;
  int64_t shape[MPT_MAX_DIMS];
  uint64_t count; /* product of the shape */
} entry;

/* Reads signature entry `index` of a list (`kind`: "parameter" / "buffer") into *e. */
static mpt_status read_entry(reader *r, const char *kind, uint32_t index, entry *e) {
  char what[64];
  snprintf(what, sizeof what, "%s %" PRIu32 " name", kind, index);
  MPT_RETURN_IF(r_name(r, e->name, what));
  MPT_RETURN_IF(r_u32(r, &e->dtype, "dtype"));
  MPT_RETURN_IF(r_u32(r, &e->ndim, "ndim"));
  if (mpt_dtype_size((mpt_dtype)e->dtype) == 0 || e->ndim > MPT_MAX_DIMS)
    return MPT_FAIL(MPT_EFORMAT, "checkpoint %s: %s %" PRIu32 " '%s' has dtype %" PRIu32
                    " and ndim %" PRIu32 " (corrupt file)", r->path, kind, index, e->name,
                    e->dtype, e->ndim);
  /* Each extent, and the product, is at most the number of floats the file could hold. */
  const uint64_t cap = r->limit / 4;
  e->count = 1;
  for (uint32_t d = 0; d < e->ndim; d++) {
    MPT_RETURN_IF(r_i64(r, &e->shape[d], "shape"));
    int64_t x = e->shape[d];
    if (x < 0 || (uint64_t)x > cap || (x > 0 && e->count > cap / (uint64_t)x))
      return MPT_FAIL(MPT_EFORMAT, "checkpoint %s: %s %" PRIu32 " '%s' has an extent %" PRId64
                      " that the file cannot hold (corrupt file)", r->path, kind, index,
                      e->name, x);
    e->count *= (uint64_t)x;
  }
  return MPT_OK;
}

/* MPT_ESHAPE naming how entry `index` differs from the model's, or MPT_OK. */
static mpt_status compare_entry(const reader *r, const char *kind, uint32_t index,
                                const entry *e, const mpt_param_info *want) {
  char a[96], b[96];
  if (strcmp(e->name, want->name) != 0)
    return MPT_FAIL(MPT_ESHAPE, "checkpoint %s is of a different model: %s %" PRIu32 " is '%s' "
                    "in the checkpoint, '%s' in the model", r->path, kind, index, e->name,
                    want->name);
  if ((mpt_dtype)e->dtype != want->dtype)
    return MPT_FAIL(MPT_ESHAPE, "checkpoint %s is of a different model: %s %" PRIu32 " '%s' is "
                    "%s in the checkpoint, %s in the model", r->path, kind, index, e->name,
                    mpt_dtype_name((mpt_dtype)e->dtype), mpt_dtype_name(want->dtype));
  int same = (int)e->ndim == want->ndim;
  for (uint32_t d = 0; same && d < e->ndim; d++) same = e->shape[d] == want->shape[d];
  if (!same)
    return MPT_FAIL(MPT_ESHAPE, "checkpoint %s is of a different model: %s %" PRIu32 " '%s' has "
                    "shape %s in the checkpoint, %s in the model", r->path, kind, index,
                    e->name, mpt_shape_str((int)e->ndim, e->shape, a, sizeof a),
                    mpt_shape_str(want->ndim, want->shape, b, sizeof b));
  return MPT_OK;
}

/* Reads the n entries of one list (parameters or buffers), comparing each with the model's
 * when a model is given; *sum receives the total element count. */
static mpt_status parse_list(reader *r, const char *kind, uint32_t n, const mpt_model *model,
                             int is_param, uint64_t *sum) {
  int model_n = !model ? 0 : is_param ? mpt_model_num_params(model) : mpt_model_num_buffers(model);
  char a[96];
  entry e;
  *sum = 0;
  for (uint32_t i = 0; i < n; i++) {
    MPT_RETURN_IF(read_entry(r, kind, i, &e));
    if (model) {
      const mpt_param_info *want = is_param ? mpt_model_param_info(model, (int)i)
                                            : mpt_model_buffer_info(model, (int)i);
      if (!want)
        return MPT_FAIL(MPT_ESHAPE, "checkpoint %s is of a different model: it has %" PRIu32
                        " %ss, the model %d; the first extra one is %s %" PRIu32 " '%s' %s",
                        r->path, n, kind, model_n, kind, i, e.name,
                        mpt_shape_str((int)e.ndim, e.shape, a, sizeof a));
      MPT_RETURN_IF(compare_entry(r, kind, i, &e, want));
    }
    *sum += e.count; /* no overflow: each count and the running sum are <= limit / 4 */
    if (*sum > r->limit / 4)
      return MPT_FAIL(MPT_EFORMAT, "checkpoint %s: its %ss hold more values than the file "
                      "(corrupt file)", r->path, kind);
  }
  if (model && (int64_t)n < model_n) {
    const mpt_param_info *miss =
        is_param ? mpt_model_param_info(model, (int)n) : mpt_model_buffer_info(model, (int)n);
    return MPT_FAIL(MPT_ESHAPE, "checkpoint %s is of a different model: the model's %s %" PRIu32
                    " '%s' %s is not in the checkpoint (it has %" PRIu32 " %ss, the model %d)",
                    r->path, kind, n, miss->name,
                    mpt_shape_str(miss->ndim, miss->shape, a, sizeof a), n, kind, model_n);
  }
  return MPT_OK;
}

/* Compares the file's optimizer section with `opt`. */
static mpt_status compare_optimizer(const reader *r, const parsed *p,
                                    char names[][MPT_CKPT_MAX_NAME + 1], mpt_optimizer *opt) {
  mpt_optimizer_state os;
  MPT_RETURN_IF(mpt_optimizer_get_state(opt, &os));
  mpt_optim_kind kind = mpt_optimizer_get_config(opt)->kind;
  if (p->opt_kind == MPT_CKPT_NO_OPTIMIZER)
    return MPT_FAIL(MPT_ESHAPE, "checkpoint %s holds no optimizer state, but a %s optimizer "
                    "was given to restore", r->path, mpt_optimizer_kind_name(kind));
  if (p->opt_kind != (uint32_t)kind)
    return MPT_FAIL(MPT_ESHAPE, "checkpoint %s is of a different optimizer: %s in the "
                    "checkpoint, %s given", r->path,
                    mpt_optimizer_kind_name((mpt_optim_kind)p->opt_kind),
                    mpt_optimizer_kind_name(kind));
  if (p->opt_nbuffers != (uint32_t)os.nbuffers)
    return MPT_FAIL(MPT_ESHAPE, "checkpoint %s: its %s optimizer has %" PRIu32 " state "
                    "buffer(s) (%s), the given one %d (%s) (momentum changed?)", r->path,
                    mpt_optimizer_kind_name(kind), p->opt_nbuffers,
                    p->opt_nbuffers ? names[0] : "none", os.nbuffers,
                    os.nbuffers ? os.names[0] : "none");
  for (int s = 0; s < os.nbuffers; s++)
    if (strcmp(names[s], os.names[s]) != 0)
      return MPT_FAIL(MPT_ESHAPE, "checkpoint %s: optimizer state %d is '%s' in the "
                      "checkpoint, '%s' in the optimizer", r->path, s, names[s], os.names[s]);
  if (p->opt_count != (uint64_t)os.count)
    return MPT_FAIL(MPT_ESHAPE, "checkpoint %s: its optimizer state has %" PRIu64 " elements "
                    "per buffer, the given optimizer %" PRId64, r->path, p->opt_count, os.count);
  return MPT_OK;
}

/* Parses everything up to the data (preamble, meta, signature, optimizer header) and checks
 * that the data section's size is exactly what the header describes. With a model (and an
 * optimizer), compares the signature (and optimizer section) with them. */
static mpt_status parse_header(reader *r, parsed *p, const mpt_model *model, mpt_optimizer *opt) {
  memset(p, 0, sizeof *p);
  uint8_t pre[MPT__CKPT_PREAMBLE_NBYTES];
  MPT_RETURN_IF(r_bytes(r, pre, sizeof pre, "header"));

  mpt_ckpt_meta *m = &p->meta;
  uint32_t u;
  MPT_RETURN_IF(r_i64(r, &m->epoch, "epoch"));
  MPT_RETURN_IF(r_i64(r, &m->global_step, "global step"));
  MPT_RETURN_IF(r_i64(r, &m->step_in_epoch, "step in epoch"));
  MPT_RETURN_IF(r_i64(r, &m->sampler_epoch, "sampler epoch"));
  MPT_RETURN_IF(r_u64(r, &m->seed, "seed"));
  MPT_RETURN_IF(r_u32(r, &u, "world size"));
  m->world_size = (int32_t)u;
  MPT_RETURN_IF(r_u32(r, &u, "RNG count"));
  if (u > MPT_CKPT_MAX_RNGS)
    return MPT_FAIL(MPT_EFORMAT, "checkpoint %s: %" PRIu32 " RNG states, more than %d (corrupt "
                    "file)", r->path, u, MPT_CKPT_MAX_RNGS);
  m->num_rngs = (int32_t)u;
  for (int k = 0; k < m->num_rngs; k++)
    for (int i = 0; i < 4; i++) MPT_RETURN_IF(r_u64(r, &m->rngs[k].s[i], "RNG state"));
  m->format_version = mpt__get_u32(pre + 8);
  if (m->format_version >= 2) {
    uint32_t reserved;
    MPT_RETURN_IF(r_i64(r, &m->global_batch, "global batch"));
    MPT_RETURN_IF(r_i64(r, &m->epoch_cursor, "epoch cursor"));
    MPT_RETURN_IF(r_i64(r, &m->epoch_samples, "epoch samples"));
    MPT_RETURN_IF(r_i64(r, &m->dataset_count, "data set count"));
    MPT_RETURN_IF(r_i64(r, &m->batch_size, "batch size"));
    MPT_RETURN_IF(r_u32(r, &u, "accumulate"));
    m->accumulate = (int32_t)u;
    MPT_RETURN_IF(r_u32(r, &reserved, "reserved"));
    if (reserved != 0)
      return MPT_FAIL(MPT_EFORMAT, "checkpoint %s: reserved field 0x%08" PRIx32 " is not 0 "
                      "(corrupt file)", r->path, reserved);
  }
  char where[512];
  snprintf(where, sizeof where, "checkpoint %.400s (corrupt meta)", r->path);
  MPT_RETURN_IF(mpt__ckpt_meta_check(m, MPT_EFORMAT, where));

  uint32_t np, nb;
  MPT_RETURN_IF(r_u32(r, &np, "parameter count"));
  MPT_RETURN_IF(r_u32(r, &nb, "buffer count"));
  p->num_params = np, p->num_buffers = nb;
  uint64_t psum, bsum;
  MPT_RETURN_IF(parse_list(r, "parameter", np, model, 1, &psum));
  MPT_RETURN_IF(parse_list(r, "buffer", nb, model, 0, &bsum));
  MPT_RETURN_IF(r_u64(r, &p->param_count, "parameter element count"));
  MPT_RETURN_IF(r_u64(r, &p->buffer_count, "buffer element count"));
  if (p->param_count != psum || p->buffer_count != bsum)
    return MPT_FAIL(MPT_EFORMAT, "checkpoint %s: element counts %" PRIu64 " / %" PRIu64 " differ "
                    "from the shapes' %" PRIu64 " / %" PRIu64 " (corrupt file)", r->path,
                    p->param_count, p->buffer_count, psum, bsum);

  MPT_RETURN_IF(r_u32(r, &p->opt_kind, "optimizer kind"));
  MPT_RETURN_IF(r_u32(r, &p->opt_nbuffers, "optimizer state count"));
  MPT_RETURN_IF(r_i64(r, &p->opt_step_count, "optimizer step count"));
  MPT_RETURN_IF(r_u64(r, &p->opt_count, "optimizer element count"));
  int none = p->opt_kind == MPT_CKPT_NO_OPTIMIZER;
  if ((!none && p->opt_kind != MPT_OPTIM_SGD && p->opt_kind != MPT_OPTIM_ADAMW) ||
      p->opt_nbuffers > MPT_OPTIM_MAX_STATE || p->opt_step_count < 0 || p->opt_count > r->limit ||
      (none && (p->opt_nbuffers || p->opt_count || p->opt_step_count)))
    return MPT_FAIL(MPT_EFORMAT, "checkpoint %s: invalid optimizer section (kind %" PRIu32
                    ", %" PRIu32 " buffers of %" PRIu64 ", step count %" PRId64 ") (corrupt file)",
                    r->path, p->opt_kind, p->opt_nbuffers, p->opt_count, p->opt_step_count);
  char names[MPT_OPTIM_MAX_STATE][MPT_CKPT_MAX_NAME + 1];
  for (uint32_t s = 0; s < p->opt_nbuffers; s++)
    MPT_RETURN_IF(r_name(r, names[s], "optimizer state name"));

  /* The data: exactly the floats described, then the CRC. Each term is bounded (counts are
   * <= limit / 4, opt_count <= limit, nbuffers <= 2), so the sum cannot overflow. */
  uint64_t floats = p->param_count + p->buffer_count + (uint64_t)p->opt_nbuffers * p->opt_count;
  if (floats > (r->limit - r->pos) / 4 || 4 * floats != r->limit - r->pos)
    return MPT_FAIL(MPT_EFORMAT, "checkpoint %s: its data section has %" PRIu64 " bytes, its "
                    "header describes %" PRIu64 " values (corrupt file)", r->path,
                    r->limit - r->pos, floats);
  if (model && (p->param_count != (uint64_t)mpt_model_param_count(model) ||
                p->buffer_count != (uint64_t)mpt_model_buffer_count(model)))
    return MPT_FAIL(MPT_ESHAPE, "checkpoint %s: %" PRIu64 " parameter and %" PRIu64 " buffer "
                    "values, the model has %" PRId64 " and %" PRId64, r->path, p->param_count,
                    p->buffer_count, mpt_model_param_count(model), mpt_model_buffer_count(model));
  if (opt) MPT_RETURN_IF(compare_optimizer(r, p, names, opt));
  return MPT_OK;
}

/* Reads n floats into dst (host), from little-endian. */
static mpt_status r_floats(reader *r, float *dst, uint64_t n, const char *what) {
  MPT_RETURN_IF(r_bytes(r, dst, 4 * n, what));
  mpt__floats_swap_le(dst, (size_t)n);
  return MPT_OK;
}

void mpt__ckpt_staged_free(mpt__ckpt_staged *staged) {
  if (!staged) return;
  free(staged->data);
  memset(staged, 0, sizeof *staged);
}

static void reader_close(reader *r) {
  if (r->f) fclose(r->f);
  free(r->chunk);
  r->f = NULL;
  r->chunk = NULL;
}

static mpt_status reader_open(reader *r, const char *path) {
  memset(r, 0, sizeof *r);
  r->chunk = malloc(MPT__CKPT_CHUNK_NBYTES);
  if (!r->chunk) return MPT_FAIL(MPT_ENOMEM, "checkpoint %s: out of host memory", path);
  return open_checked(path, r);
}

mpt_status mpt__ckpt_stage(const char *path, mpt_model *model, mpt_optimizer *optimizer,
                           mpt__ckpt_staged *staged) {
  if (!staged) return MPT_FAIL(MPT_EINVAL, "checkpoint load: NULL staging");
  memset(staged, 0, sizeof *staged);
  if (!path || !model) return MPT_FAIL(MPT_EINVAL, "checkpoint load: NULL path or model");
  MPT_RETURN_IF(mpt__ckpt_model_check(model, "checkpoint load", path));
  if (optimizer && mpt_optimizer_num_ranges(optimizer) > 0)
    return MPT_FAIL(MPT_EINVAL, "checkpoint load %s: the optimizer holds one shard of the state "
                    "(ZeRO-1): load into a whole one, then mpt_ddp_optimizer_scatter", path);
  int64_t pc = mpt_model_param_count(model), bc = mpt_model_buffer_count(model);

  reader r;
  parsed p;
  mpt_status st = reader_open(&r, path);
  if (st != MPT_OK) goto out;
  MPT_CHECK(parse_header(&r, &p, model, optimizer), out);

  /* Sizes now come from the model and optimizer, which the file was found to match. */
  mpt_optimizer_state os = {0};
  if (optimizer) MPT_CHECK(mpt_optimizer_get_state(optimizer, &os), out);
  size_t nfloats = (size_t)pc + (size_t)bc + (size_t)os.nbuffers * (size_t)os.count;
  staged->data = malloc(nfloats ? nfloats * sizeof(float) : 1);
  if (!staged->data) {
    st = MPT_FAIL(MPT_ENOMEM, "checkpoint load %s: cannot stage %zu values in host memory",
                  path, nfloats);
    goto out;
  }
  float *d = staged->data;
  MPT_CHECK(r_floats(&r, d, (uint64_t)pc, "parameters"), out);
  MPT_CHECK(r_floats(&r, d + pc, (uint64_t)bc, "buffers"), out);
  if (optimizer) {
    for (int s = 0; s < os.nbuffers; s++)
      MPT_CHECK(r_floats(&r, d + pc + bc + (int64_t)s * os.count, (uint64_t)os.count,
                         "optimizer state"), out);
  } else {
    MPT_CHECK(r_skip(&r, 4 * (uint64_t)p.opt_nbuffers * p.opt_count, "optimizer state"), out);
  }
  if (r.crc != r.stored_crc) {
    st = MPT_FAIL(MPT_EIO, "checkpoint %s changed while it was being read (CRC-32 0x%08" PRIx32
                  " on the second read, 0x%08" PRIx32 " stored)", path, r.crc, r.stored_crc);
    goto out;
  }
  staged->param_count = pc;
  staged->buffer_count = bc;
  staged->has_optimizer = optimizer != NULL;
  staged->opt_nbuffers = os.nbuffers;
  staged->opt_count = os.count;
  staged->opt_step_count = p.opt_step_count;
  staged->meta = p.meta;
  staged->crc = r.stored_crc;
out:
  reader_close(&r);
  if (st != MPT_OK) mpt__ckpt_staged_free(staged);
  return st;
}

mpt_status mpt__ckpt_commit(const mpt__ckpt_staged *staged, mpt_model *model,
                            mpt_optimizer *optimizer, mpt_ckpt_meta *meta) {
  if (!staged || !model || (staged->has_optimizer && !optimizer))
    return MPT_FAIL(MPT_EINVAL, "checkpoint commit: NULL staging, model or optimizer");
  mpt__copier c = {0};
  mpt_status st;
  float *d = staged->data;
  int64_t pc = staged->param_count, bc = staged->buffer_count;
  MPT_CHECK(mpt__copier_init(&c, mpt_model_device(model)), out);
  MPT_CHECK(mpt__copier_copy(&c, 1, mpt_model_params(model), d, (size_t)pc * sizeof(float)), out);
  MPT_CHECK(mpt__copier_copy(&c, 1, mpt_model_buffers(model), d + pc, (size_t)bc * sizeof(float)),
            out);
  if (staged->has_optimizer) {
    mpt_optimizer_state os;
    MPT_CHECK(mpt_optimizer_get_state(optimizer, &os), out);
    if (os.nbuffers != staged->opt_nbuffers || os.count != staged->opt_count) {
      st = MPT_FAIL(MPT_EINVAL, "checkpoint commit: not the optimizer it was staged for");
      goto out;
    }
    if (os.nbuffers > 0 && os.count > 0) {
      mpt__copier_free(&c);
      MPT_CHECK(mpt__copier_init(&c, os.device), out);
      for (int s = 0; s < os.nbuffers; s++)
        MPT_CHECK(mpt__copier_copy(&c, 1, os.buffers[s], d + pc + bc + (int64_t)s * os.count,
                                   (size_t)os.count * sizeof(float)), out);
    }
    MPT_CHECK(mpt_optimizer_set_step_count(optimizer, staged->opt_step_count), out);
  }
  if (meta) *meta = staged->meta;
out:
  mpt__copier_free(&c);
  return st;
}

mpt_status mpt_ckpt_load(const char *path, mpt_model *model, mpt_optimizer *optimizer,
                         mpt_ckpt_meta *meta) {
  mpt__ckpt_staged staged;
  MPT_RETURN_IF(mpt__ckpt_stage(path, model, optimizer, &staged));
  mpt_status st = mpt__ckpt_commit(&staged, model, optimizer, meta);
  mpt__ckpt_staged_free(&staged);
  return st;
}

mpt_status mpt_ckpt_read_meta(const char *path, mpt_ckpt_meta *meta, int *has_optimizer) {
  if (!path) return MPT_FAIL(MPT_EINVAL, "checkpoint read_meta: NULL path");
  reader r;
  parsed p;
  mpt_status st = reader_open(&r, path);
  if (st == MPT_OK) st = parse_header(&r, &p, NULL, NULL);
  reader_close(&r);
  if (st != MPT_OK) return st;
  if (meta) *meta = p.meta;
  if (has_optimizer) *has_optimizer = p.opt_kind != MPT_CKPT_NO_OPTIMIZER;
  return MPT_OK;
}

mpt_status mpt_ckpt_read_info(const char *path, mpt_ckpt_info *info) {
  if (!path || !info) return MPT_FAIL(MPT_EINVAL, "checkpoint read_info: NULL path or info");
  reader r;
  parsed p;
  mpt_status st = reader_open(&r, path);
  if (st == MPT_OK) st = parse_header(&r, &p, NULL, NULL);
  mpt_ckpt_info out;
  memset(&out, 0, sizeof out);
  if (st == MPT_OK) {
    out.meta = p.meta;
    out.file_nbytes = r.limit + MPT__CKPT_CRC_NBYTES;
    out.crc = r.stored_crc;
    out.num_params = (int32_t)p.num_params;
    out.num_buffers = (int32_t)p.num_buffers;
    out.param_count = p.param_count;
    out.buffer_count = p.buffer_count;
    out.optimizer_kind = p.opt_kind;
    out.optimizer_nbuffers = (int32_t)p.opt_nbuffers;
    out.optimizer_step_count = p.opt_step_count;
    out.optimizer_count = p.opt_count;
  }
  reader_close(&r);
  if (st != MPT_OK) return st;
  *info = out;
  return MPT_OK;
}
