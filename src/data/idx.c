/* IDX reader (the MNIST file format), gzip-compressed or plain, through zlib's gz* functions.
 *
 * Invariants: nothing in the header is trusted. The magic, the number of dimensions and every
 * extent are checked before any allocation; the data buffer grows (doubling from 1 MiB) with the
 * bytes actually read, capped at what the header promises, so a corrupt header claiming
 * gigabytes costs no more memory than the file really holds. After the promised bytes the file
 * must be at its end. Every error names the file. Runs on the calling thread. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "mpitrain/core.h"
#include "mpitrain/data.h"

#define IDX_CHUNK_NBYTES (1 << 20)
#define IDX_TYPE_UBYTE 0x08

static const char *idx_type_name(int type) {
  switch (type) {
    case 0x08: return "unsigned byte";
    case 0x09: return "signed byte";
    case 0x0B: return "int16";
    case 0x0C: return "int32";
    case 0x0D: return "float32";
    case 0x0E: return "float64";
    default: return "unknown";
  }
}

/* Reads up to nbytes; returns the number read (short only at end of file) or -1 on a read error
 * (the gzip stream is corrupt or the read failed), with the zlib message in *why. */
static int64_t gz_read_full(gzFile gz, uint8_t *buf, int64_t nbytes, const char **why) {
  int64_t got = 0;
  while (got < nbytes) {
    int64_t want = nbytes - got;
    if (want > IDX_CHUNK_NBYTES) want = IDX_CHUNK_NBYTES;
    int n = gzread(gz, buf + got, (unsigned)want);
    if (n < 0) {
      int errnum = 0;
      *why = gzerror(gz, &errnum);
      if (errnum == Z_ERRNO) *why = strerror(errno);
      return -1;
    }
    if (n == 0) {
      /* zlib reports a gzip stream cut short as Z_BUF_ERROR at end of file: that is a
       * truncated file, which the caller reports by the byte counts. */
      break;
    }
    got += n;
  }
  return got;
}

static uint32_t be32(const uint8_t *p) {
  return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

/* Opens path for gzread, telling a missing file (MPT_ENOENT) from other failures (MPT_EIO). */
static mpt_status idx_open(const char *path, gzFile *out) {
  /* O_NONBLOCK so that opening a FIFO does not wait forever for a writer (it is refused just
   * below, as is anything but a regular file); it is cleared again before reading. */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    int e = errno;
    if (e == ENOENT || e == ENOTDIR)
      return MPT_FAIL(MPT_ENOENT, "IDX file '%s' does not exist", path);
    return MPT_FAIL(MPT_EIO, "cannot open IDX file '%s': %s", path, strerror(e));
  }
  struct stat sb;
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    close(fd);
    return MPT_FAIL(MPT_EIO, "IDX file '%s' is not a regular file", path);
  }
  int flags = fcntl(fd, F_GETFL);
  if (flags != -1) fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  gzFile gz = gzdopen(fd, "rb");
  if (!gz) {
    close(fd);
    return MPT_FAIL(MPT_ENOMEM, "cannot open IDX file '%s': zlib could not allocate its state",
                    path);
  }
  gzbuffer(gz, 256 * 1024);
  *out = gz;
  return MPT_OK;
}

/* Reads and validates the magic and extents. Fills idx->ndim, shape, count. */
static mpt_status idx_read_header(gzFile gz, const char *path, int expected_ndim, mpt_idx *idx) {
  uint8_t head[4 + 4 * 255];
  const char *why = "";
  int64_t got = gz_read_full(gz, head, 4, &why);
  if (got < 0) return MPT_FAIL(MPT_EIO, "cannot read IDX file '%s': %s", path, why);
  if (got == 0) return MPT_FAIL(MPT_EFORMAT, "IDX file '%s' is empty", path);
  if (got < 4)
    return MPT_FAIL(MPT_EFORMAT, "IDX file '%s' is truncated in its header: got %lld of 4 magic bytes",
                    path, (long long)got);
  uint32_t magic = be32(head);
  int type = (int)head[2];
  int ndim = (int)head[3];
  if (head[0] != 0 || head[1] != 0)
    return MPT_FAIL(MPT_EFORMAT,
                    "IDX file '%s' has bad magic 0x%08X: an IDX magic starts with two zero bytes "
                    "(expected 0x0000080%c); is this an IDX file?",
                    path, magic, expected_ndim > 0 ? '0' + expected_ndim : 'N');
  if (type != IDX_TYPE_UBYTE)
    return MPT_FAIL(MPT_EFORMAT,
                    "IDX file '%s' has magic 0x%08X: element type 0x%02X (%s) is not supported, "
                    "expected 0x08 (unsigned byte)",
                    path, magic, type, idx_type_name(type));
  if (ndim < 1 || ndim > MPT_IDX_MAX_DIMS || (expected_ndim > 0 && ndim != expected_ndim)) {
    if (expected_ndim > 0)
      return MPT_FAIL(MPT_EFORMAT,
                      "IDX file '%s' has magic 0x%08X: %d dimensions, expected %d (magic 0x%08X)",
                      path, magic, ndim, expected_ndim, 0x800u | (unsigned)expected_ndim);
    return MPT_FAIL(MPT_EFORMAT, "IDX file '%s' has magic 0x%08X: %d dimensions, expected 1 to %d",
                    path, magic, ndim, MPT_IDX_MAX_DIMS);
  }
  got = gz_read_full(gz, head + 4, 4 * (int64_t)ndim, &why);
  if (got < 0) return MPT_FAIL(MPT_EIO, "cannot read IDX file '%s': %s", path, why);
  if (got < 4 * ndim)
    return MPT_FAIL(MPT_EFORMAT,
                    "IDX file '%s' is truncated in its header: expected %d bytes of extents, got %lld",
                    path, 4 * ndim, (long long)got);
  int64_t count = 1;
  for (int d = 0; d < ndim; d++) {
    int64_t e = (int64_t)be32(head + 4 + 4 * d);
    if (e < 1 || e > MPT_IDX_MAX_EXTENT)
      return MPT_FAIL(MPT_EFORMAT,
                      "IDX file '%s': dimension %d has extent %lld, expected 1 to %lld", path, d,
                      (long long)e, (long long)MPT_IDX_MAX_EXTENT);
    /* count <= MAX_NBYTES (2^33) and e <= 10^9 keep the product far inside int64. */
    count *= e;
    if (count > MPT_IDX_MAX_NBYTES)
      return MPT_FAIL(MPT_EFORMAT,
                      "IDX file '%s': the header's extents describe more than %lld bytes of data "
                      "(limit); the header is probably corrupt",
                      path, (long long)MPT_IDX_MAX_NBYTES);
    idx->shape[d] = e;
  }
  idx->ndim = ndim;
  idx->count = count;
  return MPT_OK;
}

/* Reads exactly idx->count data bytes into a buffer that grows with what arrives. */
static mpt_status idx_read_data(gzFile gz, const char *path, mpt_idx *idx) {
  int64_t want = idx->count, got = 0, cap = 0;
  uint8_t *buf = NULL;
  const char *why = "";
  while (got < want) {
    if (got == cap) {
      int64_t ncap = cap ? cap * 2 : IDX_CHUNK_NBYTES;
      if (ncap > want) ncap = want;
      uint8_t *nbuf = realloc(buf, (size_t)ncap);
      if (!nbuf) {
        free(buf);
        return MPT_FAIL(MPT_ENOMEM, "IDX file '%s': cannot allocate %lld bytes for its data",
                        path, (long long)ncap);
      }
      buf = nbuf;
      cap = ncap;
    }
    int64_t n = gz_read_full(gz, buf + got, cap - got, &why);
    if (n < 0) {
      free(buf);
      return MPT_FAIL(MPT_EIO, "cannot read IDX file '%s' after %lld data bytes: %s", path,
                      (long long)got, why);
    }
    got += n;
    if (got < cap) break; /* end of file */
  }
  if (got < want) {
    free(buf);
    return MPT_FAIL(MPT_EFORMAT,
                    "IDX file '%s' is truncated: its header promises %lld data bytes, got %lld",
                    path, (long long)want, (long long)got);
  }
  /* The file must end here: count whatever follows. */
  uint8_t scratch[4096];
  int64_t extra = 0;
  for (;;) {
    int64_t n = gz_read_full(gz, scratch, (int64_t)sizeof scratch, &why);
    if (n < 0) {
      /* A broken gzip tail after complete data: still a malformed file. */
      free(buf);
      return MPT_FAIL(MPT_EIO, "cannot read IDX file '%s' after its %lld data bytes: %s", path,
                      (long long)want, why);
    }
    extra += n;
    if (n < (int64_t)sizeof scratch) break;
  }
  if (extra > 0) {
    free(buf);
    return MPT_FAIL(MPT_EFORMAT,
                    "IDX file '%s' has %lld unexpected bytes after its %lld data bytes (header "
                    "and data disagree)",
                    path, (long long)extra, (long long)want);
  }
  idx->data = buf;
  return MPT_OK;
}

mpt_status mpt_idx_read(const char *path, int expected_ndim, mpt_idx *idx) {
  if (!idx) return MPT_FAIL(MPT_EINVAL, "mpt_idx_read: idx is NULL");
  memset(idx, 0, sizeof *idx);
  if (!path) return MPT_FAIL(MPT_EINVAL, "mpt_idx_read: path is NULL");
  if (expected_ndim < 0 || expected_ndim > MPT_IDX_MAX_DIMS)
    return MPT_FAIL(MPT_EINVAL, "mpt_idx_read('%s'): expected_ndim %d is outside 0..%d", path,
                    expected_ndim, MPT_IDX_MAX_DIMS);
  mpt_status st;
  gzFile gz = NULL;
  MPT_CHECK(idx_open(path, &gz), fail);
  MPT_CHECK(idx_read_header(gz, path, expected_ndim, idx), fail_close);
  MPT_CHECK(idx_read_data(gz, path, idx), fail_close);
  gzclose(gz);
  return MPT_OK;

fail_close:
  gzclose(gz);
fail:
  memset(idx, 0, sizeof *idx);
  return st;
}

void mpt_idx_free(mpt_idx *idx) {
  if (!idx) return;
  free(idx->data);
  memset(idx, 0, sizeof *idx);
}
