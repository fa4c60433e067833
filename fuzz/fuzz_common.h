/* Helpers shared by the fuzz targets (fuzz/fuzz_*.c) and the seed generator (fuzz/make_seeds.c).
 *
 * The readers under test take paths, so each target keeps "scratch files" to write its input to:
 * an anonymous memfd (memfd_create), read back through its /proc/self/fd/N link, so nothing is
 * ever written to a disk. Where memfd_create is missing (old kernels), a file in a per-process
 * temporary directory (mkdtemp under $TMPDIR, default /tmp) is used instead and removed at exit.
 *
 * fuzz_fail() reports a broken invariant and aborts, which libFuzzer records as a crash with the
 * input that caused it. Header-only (static functions): each target is one translation unit. */
#ifndef MPT_FUZZ_COMMON_H
#define MPT_FUZZ_COMMON_H

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mpitrain.h"

#define FUZZ_MAX_SCRATCH 4
/* Not every includer uses every helper. */
#define FUZZ_UNUSED __attribute__((unused))

typedef struct fuzz_scratch {
  int fd;         /* open read-write; the content is replaced by fuzz_scratch_write */
  char path[512]; /* what the reader under test opens */
} fuzz_scratch;

static char fuzz_tmpdir[256];
static char fuzz_tmpfiles[FUZZ_MAX_SCRATCH][512];
static int fuzz_ntmpfiles;

static void fuzz_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void fuzz_fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("fuzz invariant broken: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  const char *detail = mpt_last_error();
  if (detail && detail[0]) fprintf(stderr, "last library error: %s\n", detail);
  abort();
}

FUZZ_UNUSED static void fuzz_cleanup(void) {
  for (int i = 0; i < fuzz_ntmpfiles; i++) unlink(fuzz_tmpfiles[i]);
  fuzz_ntmpfiles = 0;
  if (fuzz_tmpdir[0]) rmdir(fuzz_tmpdir);
  fuzz_tmpdir[0] = '\0';
}

/* Opens scratch file `name` (a short word). Aborts when neither a memfd nor a temporary file
 * can be made: the target cannot run at all then. */
FUZZ_UNUSED static void fuzz_scratch_open(fuzz_scratch *s, const char *name) {
#ifdef MFD_CLOEXEC
  s->fd = memfd_create(name, MFD_CLOEXEC);
  if (s->fd >= 0) {
    snprintf(s->path, sizeof s->path, "/proc/self/fd/%d", s->fd);
    struct stat sb;
    if (stat(s->path, &sb) == 0) return; /* /proc is mounted: use the memfd */
    close(s->fd);
  }
#endif
  if (!fuzz_tmpdir[0]) {
    const char *t = getenv("TMPDIR");
    snprintf(fuzz_tmpdir, sizeof fuzz_tmpdir, "%s/mpt_fuzz_XXXXXX", t && t[0] ? t : "/tmp");
    if (!mkdtemp(fuzz_tmpdir)) {
      fprintf(stderr, "fuzz: cannot make a temporary directory %s: %s\n", fuzz_tmpdir,
              strerror(errno));
      abort();
    }
    atexit(fuzz_cleanup);
  }
  if (fuzz_ntmpfiles == FUZZ_MAX_SCRATCH) {
    fprintf(stderr, "fuzz: more than %d scratch files\n", FUZZ_MAX_SCRATCH);
    abort();
  }
  snprintf(s->path, sizeof s->path, "%s/%s", fuzz_tmpdir, name);
  s->fd = open(s->path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (s->fd < 0) {
    fprintf(stderr, "fuzz: cannot create %s: %s\n", s->path, strerror(errno));
    abort();
  }
  snprintf(fuzz_tmpfiles[fuzz_ntmpfiles++], sizeof fuzz_tmpfiles[0], "%s", s->path);
}

/* Replaces the scratch file's content by data[size]. */
FUZZ_UNUSED static void fuzz_scratch_write(fuzz_scratch *s, const void *data, size_t size) {
  if (ftruncate(s->fd, 0) != 0) fuzz_fail("ftruncate %s: %s", s->path, strerror(errno));
  const uint8_t *p = data;
  size_t done = 0;
  while (done < size) {
    ssize_t n = pwrite(s->fd, p + done, size - done, (off_t)done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fuzz_fail("write %s: %s", s->path, strerror(errno));
    done += (size_t)n;
  }
}

/* ---- the checkpoint target's model (shared with make_seeds.c, so that the seeds fit) ---- */

/* a.weight [4, 3], a.bias [4], b.weight [2, 4]; buffers bn.mean [4], bn.var [4]. NULL on
 * failure (which cannot happen short of running out of memory). */
FUZZ_UNUSED static mpt_model *fuzz_ckpt_model(void) {
  mpt_model *m = NULL;
  int idx;
  int64_t aw[2] = {4, 3}, ab[1] = {4}, bw[2] = {2, 4};
  if (mpt_model_init(&m, mpt_device_cpu()) != MPT_OK) return NULL;
  if (mpt_model_add_param(m, "a.weight", 2, aw, MPT_INIT_FAN_IN, 3, &idx) != MPT_OK ||
      mpt_model_add_param(m, "a.bias", 1, ab, MPT_INIT_FAN_IN, 3, &idx) != MPT_OK ||
      mpt_model_add_param(m, "b.weight", 2, bw, MPT_INIT_FAN_IN, 4, &idx) != MPT_OK ||
      mpt_model_add_buffer(m, "bn.mean", 1, ab, MPT_INIT_ZEROS, &idx) != MPT_OK ||
      mpt_model_add_buffer(m, "bn.var", 1, ab, MPT_INIT_ONES, &idx) != MPT_OK ||
      mpt_model_finalize(m) != MPT_OK || mpt_model_init_params(m, 7) != MPT_OK) {
    mpt_model_free(m);
    return NULL;
  }
  return m;
}

/* An optimizer over fuzz_ckpt_model's parameters: SGD with momentum 0.9 (one state buffer) or
 * AdamW (two). */
FUZZ_UNUSED static mpt_optimizer *fuzz_ckpt_optimizer(mpt_model *m, mpt_optim_kind kind) {
  mpt_optimizer_config cfg = mpt_optimizer_config_default();
  cfg.kind = kind;
  cfg.lr = 0.05f;
  cfg.momentum = kind == MPT_OPTIM_SGD ? 0.9f : 0.0f;
  mpt_optimizer *opt = NULL;
  if (mpt_optimizer_init(&opt, &cfg, mpt_device_cpu(), mpt_model_param_count(m)) != MPT_OK)
    return NULL;
  return opt;
}

#endif
