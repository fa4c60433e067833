/* The timing and the cache of MPT_CPU_GEMM_TUNE (include/mpitrain/ops.h, "CPU GEMM tuning"):
 * mpt_cpu_gemm_time_shapes times each shape on OpenBLAS (mpt__cpu_sgemm_openblas) and oneDNN
 * (mpt__cpu_sgemm_dnnl), the same entry points mpt_op_gemm takes, so the times include what a
 * call costs in the step (oneDNN's thread setting, OpenBLAS's buffer check); the cache file
 * keeps a table per key (host, CPU, instruction sets, library versions, threads).
 *
 * The timing is bounded: shapes go smallest first, and before timing one the untimed first call
 * of each library gives its cost, so a shape that would overrun the budget is left to the
 * fixed rule. A cache file is parsed whole and checked before any of it is returned: a cut,
 * edited or foreign file is refused with the line at fault. Calling thread only. */
#include "config.h"

#include <cblas.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/atomic_file.h"
#include "core/cpu/cpu.h"
#include "mpitrain/ops.h"

#ifdef MPT_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.h>
#endif

#define CACHE_MAGIC "mpitrain-gemm-cache 1"
/* The other library must be this much faster than the rule's (5 %) to be chosen. */
#define MARGIN 0.05

/* ---- timing ---- */

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static int cmp_macs(const void *a, const void *b) {
  const mpt_cpu_gemm_tuned *x = *(mpt_cpu_gemm_tuned *const *)a;
  const mpt_cpu_gemm_tuned *y = *(mpt_cpu_gemm_tuned *const *)b;
  const double mx = (double)x->m * (double)x->n * (double)x->k;
  const double my = (double)y->m * (double)y->n * (double)y->k;
  return mx < my ? -1 : mx > my;
}

#ifdef MPT_HAVE_ONEDNN
/* One call of library `lib` (0 OpenBLAS, 1 oneDNN) on the shape with transposes t (bit 1: A,
 * bit 0: B), row-major with tight leading dimensions; its wall milliseconds in *ms. */
static mpt_status call_once(int lib, unsigned t, const mpt_cpu_gemm_tuned *s, const float *a,
                            const float *b, float *c, double *ms) {
  const int ta = (t >> 1) & 1, tb = t & 1;
  const int64_t lda = ta ? s->m : s->k, ldb = tb ? s->k : s->n;
  const double t0 = mpt_time_ms();
  if (lib == 0)
    MPT_RETURN_IF(mpt__cpu_sgemm_openblas(ta, tb, s->m, s->n, s->k, 1.0f, a, lda, b, ldb, 0.0f,
                                          c, s->n));
  else
    MPT_RETURN_IF(mpt__cpu_sgemm_dnnl(ta, tb, s->m, s->n, s->k, 1.0f, a, lda, b, ldb, 0.0f, c,
                                      s->n));
  *ms = mpt_time_ms() - t0;
  return MPT_OK;
}

/* Times one shape: for each transpose seen, one untimed call per library (their sum goes to
 * *first_ms, so the caller can stop before a shape it cannot afford), then reps alternating
 * calls, the median per library and transpose summed into the shape's times. */
static mpt_status time_shape(mpt_cpu_gemm_tuned *s, int reps, double left_ms, int *skipped) {
  const unsigned mask = s->trans & 15u ? s->trans & 15u : 1u;
  const size_t na = (size_t)(s->m * s->k), nb = (size_t)(s->k * s->n), nc = (size_t)(s->m * s->n);
  float *buf = NULL;
  double *times = malloc(2 * (size_t)reps * sizeof *times);
  mpt_status st = MPT_OK;
  *skipped = 0;
  if (!times || mpt_device_alloc(mpt_device_cpu(), (na + nb + nc) * sizeof(float),
                                 (void **)&buf) != MPT_OK) {
    st = MPT_FAIL(MPT_ENOMEM, "GEMM tuning: no memory for a %lld x %lld x %lld product",
                  (long long)s->m, (long long)s->n, (long long)s->k);
    goto done;
  }
  /* small exact values: the same work as the step's data, no denormals */
  for (size_t i = 0; i < na + nb; i++) buf[i] = (float)((int)(i % 7) - 3) * 0.125f;
  double ob = 0, dn = 0, first = 0;
  for (unsigned t = 0; t < 4; t++) {
    if (!(mask & (1u << t))) continue; /* bit t = 2 ta + tb */
    double ms = 0;
    for (int lib = 0; lib < 2; lib++) {
      if ((st = call_once(lib, t, s, buf, buf + na, buf + na + nb, &ms)) != MPT_OK) goto done;
      first += ms;
    }
    if (first * reps > left_ms) { /* this shape would overrun: leave it to the rule */
      *skipped = 1;
      goto done;
    }
    for (int r = 0; r < reps; r++)
      for (int lib = 0; lib < 2; lib++) {
        const int l = (r & 1) ? 1 - lib : lib; /* alternate which goes first */
        if ((st = call_once(l, t, s, buf, buf + na, buf + na + nb, &times[l * reps + r])) !=
            MPT_OK)
          goto done;
      }
    qsort(times, (size_t)reps, sizeof *times, cmp_double);
    qsort(times + reps, (size_t)reps, sizeof *times, cmp_double);
    ob += times[reps / 2];
    dn += times[reps + reps / 2];
  }
  s->openblas_ms = ob;
  s->onednn_ms = dn;
  /* the fixed rule's library (in s->gemm) stays unless the other is MARGIN faster: near ties
   * flip with the load from run to run, and would change the bits for nothing */
  if (s->gemm == MPT_CPU_GEMM_OPENBLAS && dn < ob * (1 - MARGIN)) s->gemm = MPT_CPU_GEMM_ONEDNN;
  else if (s->gemm == MPT_CPU_GEMM_ONEDNN && ob < dn * (1 - MARGIN))
    s->gemm = MPT_CPU_GEMM_OPENBLAS;
done:
  mpt_device_free(mpt_device_cpu(), buf);
  free(times);
  return st;
}
#endif

mpt_status mpt_cpu_gemm_time_shapes(mpt_cpu_gemm_tuned *shapes, int count, int reps,
                                    double budget_ms) {
  if (count < 0 || count > MPT_CPU_GEMM_TABLE_MAX || (count > 0 && !shapes) || reps < 1)
    return MPT_FAIL(MPT_EINVAL, "mpt_cpu_gemm_time_shapes: %d shapes (0 to %d, not NULL), %d "
                    "repetitions (>= 1)", count, MPT_CPU_GEMM_TABLE_MAX, reps);
  for (int i = 0; i < count; i++) {
    const mpt_cpu_gemm_tuned *s = &shapes[i];
    if (s->m < 1 || s->n < 1 || s->k < 1 || s->m > INT_MAX || s->n > INT_MAX || s->k > INT_MAX)
      return MPT_FAIL(MPT_EINVAL, "mpt_cpu_gemm_time_shapes: shape %d is %lld x %lld x %lld "
                      "(sizes 1 to INT_MAX)", i, (long long)s->m, (long long)s->n,
                      (long long)s->k);
  }
  for (int i = 0; i < count; i++) {
    shapes[i].gemm = mpt__cpu_gemm_rule(shapes[i].m, shapes[i].n, shapes[i].k);
    shapes[i].openblas_ms = shapes[i].onednn_ms = 0;
  }
#ifdef MPT_HAVE_ONEDNN
  MPT_RETURN_IF(mpt_cpu_isa_init());
  mpt_cpu_gemm_tuned **order = malloc((size_t)(count ? count : 1) * sizeof *order);
  if (!order) return MPT_FAIL(MPT_ENOMEM, "mpt_cpu_gemm_time_shapes: no memory");
  for (int i = 0; i < count; i++) order[i] = &shapes[i];
  qsort(order, (size_t)count, sizeof *order, cmp_macs);
  const double t0 = mpt_time_ms();
  mpt_status st = MPT_OK;
  /* multiply-adds per ms, to foresee a shape's cost before its first call: 10^7 (20 GFLOP/s)
   * until a timed shape shows more; shapes go smallest first, so the figure errs low */
  double rate = 1e7;
  for (int i = 0; i < count; i++) {
    const double left = budget_ms - (mpt_time_ms() - t0);
    if (left <= 0) break;
    const mpt_cpu_gemm_tuned *o = order[i];
    const double macs = (double)o->m * (double)o->n * (double)o->k;
    const int ntrans = __builtin_popcount(o->trans & 15u ? o->trans & 15u : 1u);
    if (2.0 * ntrans * macs / rate > left) break; /* even the untimed calls would overrun */
    int skipped = 0;
    const mpt_cpu_gemm rule = order[i]->gemm;
    if ((st = time_shape(order[i], reps, left, &skipped)) != MPT_OK) break;
    const double best = order[i]->openblas_ms < order[i]->onednn_ms ? order[i]->openblas_ms
                                                                    : order[i]->onednn_ms;
    if (!skipped && best > 0 && ntrans * macs / best > rate) rate = ntrans * macs / best;
    if (skipped) {
      order[i]->gemm = rule;
      order[i]->openblas_ms = order[i]->onednn_ms = 0;
      break; /* the rest are larger */
    }
  }
  free(order);
  return st;
#else
  (void)budget_ms;
  return MPT_OK;
#endif
}

/* ---- the key ---- */

/* The CPU's model string from /proc/cpuinfo ("model name"), or "unknown". */
static void cpu_model(char *out, size_t nbytes) {
  snprintf(out, nbytes, "unknown");
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (!f) return;
  char line[512];
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, "model name", 10) != 0) continue;
    const char *v = strchr(line, ':');
    if (!v) continue;
    v++;
    while (*v == ' ' || *v == '\t') v++;
    snprintf(out, nbytes, "%s", v);
    out[strcspn(out, "\r\n")] = '\0';
    break;
  }
  fclose(f);
}

/* The version word of openblas_get_config() ("OpenBLAS 0.3.21 DYNAMIC_ARCH ..."). */
static void openblas_version(char *out, size_t nbytes) {
  const char *cfg = openblas_get_config();
  char word[64] = "unknown";
  if (cfg && sscanf(cfg, "%*s %63s", word) != 1) snprintf(word, sizeof word, "unknown");
  snprintf(out, nbytes, "%s", word);
}

mpt_status mpt_cpu_gemm_cache_key(char *buf, size_t nbytes) {
  if (!buf || nbytes < 1) return MPT_FAIL(MPT_EINVAL, "mpt_cpu_gemm_cache_key: NULL buffer");
  (void)mpt_cpu_isa_init(); /* a bad MPT_CPU_ISA reaches the caller through its own calls */
  char host[256] = "unknown", model[256], blas_ver[64], dnnl_ver[64] = "none",
       dnnl_isa[32] = "none";
  if (gethostname(host, sizeof host - 1) != 0) snprintf(host, sizeof host, "unknown");
  host[sizeof host - 1] = '\0';
  cpu_model(model, sizeof model);
  openblas_version(blas_ver, sizeof blas_ver);
#ifdef MPT_HAVE_ONEDNN
  const dnnl_version_t *v = dnnl_version();
  snprintf(dnnl_ver, sizeof dnnl_ver, "%d.%d.%d", v->major, v->minor, v->patch);
  snprintf(dnnl_isa, sizeof dnnl_isa, "0x%x", (unsigned)dnnl_get_effective_cpu_isa());
#endif
  const int n = snprintf(buf, nbytes,
                         "host %s\ncpu %s\nisa %s onednn-isa %s blas %s\n"
                         "versions openblas %s onednn %s\nthreads %d\n",
                         host, model, mpt_cpu_isa_name(mpt_cpu_isa_active()), dnnl_isa,
                         mpt_cpu_blas_name(), blas_ver, dnnl_ver, mpt_cpu_gemm_threads());
  if (n < 0 || (size_t)n >= nbytes)
    return MPT_FAIL(MPT_EINVAL, "mpt_cpu_gemm_cache_key: %zu bytes are too few (%d needed)",
                    nbytes, n + 1);
  return MPT_OK;
}

mpt_status mpt_cpu_gemm_cache_path(const char *key, char *buf, size_t nbytes) {
  if (!key || !buf || nbytes < 1)
    return MPT_FAIL(MPT_EINVAL, "mpt_cpu_gemm_cache_path: NULL argument");
  const char *env = getenv("MPT_GEMM_CACHE");
  int n;
  if (env && env[0]) {
    n = snprintf(buf, nbytes, "%s", env);
  } else {
    uint64_t h = 1469598103934665603ull; /* FNV-1a, 64 bits */
    for (const unsigned char *p = (const unsigned char *)key; *p; p++)
      h = (h ^ *p) * 1099511628211ull;
    char host[256] = "unknown";
    if (gethostname(host, sizeof host - 1) != 0) snprintf(host, sizeof host, "unknown");
    host[sizeof host - 1] = '\0';
    for (char *p = host; *p; p++) /* a file name: no '/' */
      if (*p == '/') *p = '_';
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (xdg && xdg[0])
      n = snprintf(buf, nbytes, "%s/mpitrain/gemm-%s-%016llx.txt", xdg, host,
                   (unsigned long long)h);
    else if (home && home[0])
      n = snprintf(buf, nbytes, "%s/.cache/mpitrain/gemm-%s-%016llx.txt", home, host,
                   (unsigned long long)h);
    else
      return MPT_FAIL(MPT_ENOENT, "GEMM tuning cache: neither XDG_CACHE_HOME nor HOME is set "
                      "(name a file with --gemm-cache or MPT_GEMM_CACHE)");
  }
  if (n < 0 || (size_t)n >= nbytes)
    return MPT_FAIL(MPT_EINVAL, "mpt_cpu_gemm_cache_path: the path is longer than %zu bytes",
                    nbytes - 1);
  return MPT_OK;
}

/* ---- the file ---- */

/* Creates the folders above path (as mkdir -p); errors are left to the file's creation. */
static void make_parents(const char *path) {
  char dir[4096];
  if (snprintf(dir, sizeof dir, "%s", path) >= (int)sizeof dir) return;
  for (char *p = dir + 1; *p; p++) {
    if (*p != '/') continue;
    *p = '\0';
    (void)mkdir(dir, 0777);
    *p = '/';
  }
}

mpt_status mpt_cpu_gemm_cache_write(const char *path, const char *key,
                                    const mpt_cpu_gemm_tuned *entries, int count) {
  if (!path || !path[0] || !key || count < 0 || count > MPT_CPU_GEMM_TABLE_MAX ||
      (count > 0 && !entries))
    return MPT_FAIL(MPT_EINVAL, "mpt_cpu_gemm_cache_write: NULL or empty argument, or %d "
                    "entries (0 to %d)", count, MPT_CPU_GEMM_TABLE_MAX);
  for (int i = 0; i < count; i++) {
    const mpt_cpu_gemm_tuned *e = &entries[i];
    if (e->m < 1 || e->n < 1 || e->k < 1 || e->m > INT_MAX || e->n > INT_MAX ||
        e->k > INT_MAX || (e->gemm != MPT_CPU_GEMM_OPENBLAS && e->gemm != MPT_CPU_GEMM_ONEDNN) ||
        !(e->openblas_ms >= 0) || !(e->onednn_ms >= 0) || !isfinite(e->openblas_ms) ||
        !isfinite(e->onednn_ms))
      return MPT_FAIL(MPT_EINVAL, "mpt_cpu_gemm_cache_write: entry %d (%lld x %lld x %lld %s) "
                      "is not a table entry", i, (long long)e->m, (long long)e->n,
                      (long long)e->k, mpt_cpu_gemm_name(e->gemm));
  }
  size_t cap = strlen(key) + 64 + (size_t)count * 128, len = 0;
  char *text = malloc(cap);
  if (!text) return MPT_FAIL(MPT_ENOMEM, "mpt_cpu_gemm_cache_write: no memory");
  len += (size_t)snprintf(text + len, cap - len, CACHE_MAGIC "\n%s", key);
  if (len > 0 && text[len - 1] != '\n') len += (size_t)snprintf(text + len, cap - len, "\n");
  len += (size_t)snprintf(text + len, cap - len, "shapes %d\n", count);
  for (int i = 0; i < count; i++) {
    const mpt_cpu_gemm_tuned *e = &entries[i];
    len += (size_t)snprintf(text + len, cap - len, "%lld %lld %lld %u %s %.4f %.4f\n",
                            (long long)e->m, (long long)e->n, (long long)e->k, e->trans & 15u,
                            mpt_cpu_gemm_name(e->gemm), e->openblas_ms, e->onednn_ms);
  }
  len += (size_t)snprintf(text + len, cap - len, "end\n");
  make_parents(path);
  mpt__afile af;
  mpt_status st = mpt__afile_open(&af, path, "GEMM tuning cache");
  if (st == MPT_OK) st = mpt__afile_write(&af, text, len);
  if (st == MPT_OK) st = mpt__afile_commit(&af);
  mpt__afile_abort(&af);
  free(text);
  return st;
}

/* Reads a whole small file (at most 1 MiB) into a NUL-terminated string. */
static mpt_status slurp(const char *path, char **out) {
  *out = NULL;
  int fd;
  int64_t size;
  /* a regular file only: a FIFO would block the open, a folder or device is no cache */
  mpt_status st = mpt__file_open_regular(path, "GEMM tuning cache", &fd, &size);
  if (st != MPT_OK) return st;
  const int64_t cap = 1 << 20;
  if (size > cap) {
    close(fd);
    return MPT_FAIL(MPT_EFORMAT, "GEMM tuning cache %s: larger than 1 MiB", path);
  }
  char *text = malloc((size_t)size + 1);
  if (!text) {
    close(fd);
    return MPT_FAIL(MPT_ENOMEM, "GEMM tuning cache %s: no memory", path);
  }
  st = mpt__file_pread(fd, "GEMM tuning cache", path, text, size, 0);
  close(fd);
  if (st != MPT_OK) {
    free(text);
    return st;
  }
  text[size] = '\0';
  if (strlen(text) != (size_t)size) {
    free(text);
    return MPT_FAIL(MPT_EFORMAT, "GEMM tuning cache %s: a NUL byte (not a text file)", path);
  }
  *out = text;
  return MPT_OK;
}

/* The next line of *p (its newline replaced by NUL), or NULL at the end or for a last line
 * without its newline (a cut file). */
static char *next_line(char **p) {
  char *s = *p, *nl = strchr(s, '\n');
  if (!nl) return NULL;
  *nl = '\0';
  *p = nl + 1;
  return s;
}

static int parse_size(const char *w, int64_t *out) {
  char *end = NULL;
  errno = 0;
  const long long v = strtoll(w, &end, 10);
  if (errno || end == w || *end || v < 1 || v > INT_MAX) return 0;
  *out = v;
  return 1;
}

static int parse_ms(const char *w, double *out) {
  char *end = NULL;
  errno = 0;
  const double v = strtod(w, &end);
  if (errno || end == w || *end || !isfinite(v) || v < 0) return 0;
  *out = v;
  return 1;
}

/* One shape line "m n k trans library openblas_ms onednn_ms" into *e; 0 if malformed. */
static int parse_entry(char *line, mpt_cpu_gemm_tuned *e) {
  char *w[8];
  int nw = 0;
  for (char *tok = strtok(line, " "); tok; tok = strtok(NULL, " ")) {
    if (nw == 8) return 0;
    w[nw++] = tok;
  }
  if (nw != 7) return 0;
  memset(e, 0, sizeof *e);
  int64_t trans = 0;
  if (!parse_size(w[0], &e->m) || !parse_size(w[1], &e->n) || !parse_size(w[2], &e->k))
    return 0;
  if (strcmp(w[3], "0") == 0) trans = 0;
  else if (!parse_size(w[3], &trans) || trans > 15) return 0;
  e->trans = (unsigned)trans;
  if (strcmp(w[4], "openblas") == 0) e->gemm = MPT_CPU_GEMM_OPENBLAS;
  else if (strcmp(w[4], "onednn") == 0) e->gemm = MPT_CPU_GEMM_ONEDNN;
  else return 0;
  return parse_ms(w[5], &e->openblas_ms) && parse_ms(w[6], &e->onednn_ms);
}

mpt_status mpt_cpu_gemm_cache_read(const char *path, const char *key, mpt_cpu_gemm_tuned *entries,
                                   int cap, int *count) {
  if (count) *count = 0;
  if (!path || !key || !count || cap < 0 || (cap > 0 && !entries))
    return MPT_FAIL(MPT_EINVAL, "mpt_cpu_gemm_cache_read: NULL argument");
  char *text = NULL, *keycopy = strdup(key);
  if (!keycopy) return MPT_FAIL(MPT_ENOMEM, "mpt_cpu_gemm_cache_read: no memory");
  mpt_status st = slurp(path, &text);
  if (st != MPT_OK) goto done;
  char *p = text, *kp = keycopy, *line = next_line(&p);
  int lineno = 1;
  if (!line || strcmp(line, CACHE_MAGIC) != 0) {
    st = MPT_FAIL(MPT_EFORMAT, "GEMM tuning cache %s: line 1 is not \"" CACHE_MAGIC "\"", path);
    goto done;
  }
  /* the key: every line of ours, in order, up to "shapes" */
  for (char *want = next_line(&kp); want; want = next_line(&kp)) {
    line = next_line(&p);
    lineno++;
    if (!line || strncmp(line, "shapes ", 7) == 0) {
      st = MPT_FAIL(MPT_EFORMAT, "GEMM tuning cache %s: line %d: the key ends early (\"%s\" "
                    "expected)", path, lineno, want);
      goto done;
    }
    if (strcmp(line, want) != 0) {
      st = MPT_FAIL(MPT_EMISMATCH, "GEMM tuning cache %s was written for another machine or "
                    "setting: line %d is \"%s\", this process has \"%s\"", path, lineno, line,
                    want);
      goto done;
    }
  }
  line = next_line(&p);
  lineno++;
  int want_count = -1;
  char tail = 0;
  if (!line || sscanf(line, "shapes %d%c", &want_count, &tail) != 1 || want_count < 0) {
    st = MPT_FAIL(line && strncmp(line, "shapes ", 7) != 0 ? MPT_EMISMATCH : MPT_EFORMAT,
                  "GEMM tuning cache %s: line %d: \"shapes N\" expected after the key%s", path,
                  lineno, line && strncmp(line, "shapes ", 7) != 0
                                  ? " (the file's key has more lines than this process's)"
                                  : "");
    goto done;
  }
  if (want_count > cap || want_count > MPT_CPU_GEMM_TABLE_MAX) {
    st = MPT_FAIL(MPT_EFORMAT, "GEMM tuning cache %s: %d shapes, more than %d", path,
                  want_count, cap < MPT_CPU_GEMM_TABLE_MAX ? cap : MPT_CPU_GEMM_TABLE_MAX);
    goto done;
  }
  for (int i = 0; i < want_count; i++) {
    line = next_line(&p);
    lineno++;
    if (!line || !parse_entry(line, &entries[i])) {
      st = MPT_FAIL(MPT_EFORMAT, "GEMM tuning cache %s: line %d: %s", path, lineno,
                    line ? "not \"m n k trans openblas|onednn openblas_ms onednn_ms\""
                         : "the file ends before its shapes do (cut)");
      goto done;
    }
    for (int j = 0; j < i; j++)
      if (entries[j].m == entries[i].m && entries[j].n == entries[i].n &&
          entries[j].k == entries[i].k) {
        st = MPT_FAIL(MPT_EFORMAT, "GEMM tuning cache %s: line %d: a shape listed twice", path,
                      lineno);
        goto done;
      }
  }
  line = next_line(&p);
  lineno++;
  if (!line || strcmp(line, "end") != 0 || *p != '\0') {
    st = MPT_FAIL(MPT_EFORMAT, "GEMM tuning cache %s: line %d: \"end\" and the end of the file "
                  "expected (a cut file, or the count line disagrees with the shapes)", path,
                  lineno);
    goto done;
  }
#ifndef MPT_HAVE_ONEDNN
  for (int i = 0; i < want_count; i++)
    if (entries[i].gemm == MPT_CPU_GEMM_ONEDNN) {
      st = MPT_FAIL(MPT_EMISMATCH, "GEMM tuning cache %s names oneDNN, which this build lacks",
                    path);
      goto done;
    }
#endif
  *count = want_count;
done:
  free(text);
  free(keycopy);
  return st;
}
