/* --gemm tune in the loop (trainer.h "GEMM tuning"; ops.h "CPU GEMM tuning"): at set-up rank 0
 * reads the per-host cache, and its table, broadcast, becomes every rank's; the first step then
 * runs on that table (the fixed rule for what it lacks) while its shapes are recorded, so that
 * every model (mlp, cnn, a GPT, a user's) is tuned on the products it really computes, with
 * their transposes, and no extra step changes the run. After that step the shapes the table
 * lacks are timed, on every rank at once (the load of the real run: each rank on its own
 * cores), and rank 0's choices are broadcast: every rank computes a shape with the same library,
 * whatever its own timing said. Rank 0 logs the table in one line and writes the cache; a cache
 * it cannot read (corrupt, another host's) or write is a warning, and the run goes on.
 *
 * Fault-injection hooks (src/core/fault.h): MPT_TEST_GEMM_TUNE_BIAS=1 makes each rank's timing
 * favour a different library (rank 0 OpenBLAS, the others oneDNN), MPT_TEST_GEMM_TABLE=FILE has
 * each rank write the table it installed to FILE.<rank>. Training thread; collective. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "core/fault.h"
#include "train/train_impl.h"

#define TUNE_REPS 5            /* median of 5 alternating calls per library and transpose */
#define TUNE_BUDGET_MS 400.0   /* wall time of the timing, all shapes together */

/* Rank 0's entries [0, *count) to every rank (sizes, transposes, library as int32, the times
 * as float32: the log's figures). */
static mpt_status bcast_entries(mpt__trainer *t, mpt_cpu_gemm_tuned *e, int *count) {
  if (t->world == 1) return MPT_OK;
  int32_t n = *count;
  MPT_RETURN_IF(mpt_comm_broadcast_sync(t->comm, &n, 1, MPT_I32, 0));
  if (n < 0 || n > MPT_CPU_GEMM_TABLE_MAX)
    return MPT_FAIL(MPT_ECOMM, "GEMM tuning: rank 0 sent %d shapes", (int)n);
  if (n == 0) {
    *count = 0;
    return MPT_OK;
  }
  int32_t *iv = malloc((size_t)n * 5 * sizeof *iv);
  float *fv = malloc((size_t)n * 2 * sizeof *fv);
  mpt_status st = MPT_OK;
  if (!iv || !fv) {
    st = MPT_FAIL(MPT_ENOMEM, "GEMM tuning: no memory for %d shapes", (int)n);
    goto done;
  }
  if (t->rank == 0)
    for (int i = 0; i < n; i++) {
      iv[5 * i] = (int32_t)e[i].m, iv[5 * i + 1] = (int32_t)e[i].n;
      iv[5 * i + 2] = (int32_t)e[i].k, iv[5 * i + 3] = (int32_t)e[i].trans;
      iv[5 * i + 4] = (int32_t)e[i].gemm;
      fv[2 * i] = (float)e[i].openblas_ms, fv[2 * i + 1] = (float)e[i].onednn_ms;
    }
  if ((st = mpt_comm_broadcast_sync(t->comm, iv, 5 * (int64_t)n, MPT_I32, 0)) != MPT_OK ||
      (st = mpt_comm_broadcast_sync(t->comm, fv, 2 * (int64_t)n, MPT_F32, 0)) != MPT_OK)
    goto done;
  if (t->rank != 0)
    for (int i = 0; i < n; i++) {
      memset(&e[i], 0, sizeof e[i]);
      e[i].m = iv[5 * i], e[i].n = iv[5 * i + 1], e[i].k = iv[5 * i + 2];
      e[i].trans = (unsigned)iv[5 * i + 3], e[i].gemm = (mpt_cpu_gemm)iv[5 * i + 4];
      e[i].openblas_ms = fv[2 * i], e[i].onednn_ms = fv[2 * i + 1];
    }
  *count = n;
done:
  free(iv);
  free(fv);
  return st;
}

/* The table in one log line: "64x512x784 openblas 0.41/0.52 ms, ..." (OpenBLAS/oneDNN). */
static void log_table(const char *what, const mpt_cpu_gemm_tuned *e, int count) {
  size_t cap = 160 + (size_t)count * 64, len = 0;
  char *line = malloc(cap);
  if (!line) return;
  line[0] = '\0';
  for (int i = 0; i < count && len < cap; i++) {
    const int timed = e[i].openblas_ms > 0 || e[i].onednn_ms > 0;
    char times[64] = "untimed: the fixed rule";
    if (timed) snprintf(times, sizeof times, "%.3f/%.3f", e[i].openblas_ms, e[i].onednn_ms);
    len += (size_t)snprintf(line + len, cap - len, "%s%" PRId64 "x%" PRId64 "x%" PRId64 " %s %s",
                            i ? ", " : "", e[i].m, e[i].n, e[i].k, mpt_cpu_gemm_name(e[i].gemm),
                            times);
  }
  mpt_log(MPT_LOG_INFO, "GEMM tune: %d shape(s) %s (m x n x k, library, OpenBLAS/oneDNN ms, "
          "median of %d): %s", count, what, TUNE_REPS, line);
  free(line);
}

/* MPT_TEST_GEMM_TABLE=FILE: this rank's installed table to FILE.<rank>, "m n k library". */
static void dump_table(const mpt__trainer *t) {
  const char *v = mpt__test_env("MPT_TEST_GEMM_TABLE");
  if (!v || !v[0]) return;
  char path[4200];
  snprintf(path, sizeof path, "%s.%d", v, t->rank);
  FILE *f = fopen(path, "w");
  if (!f) return;
  mpt_cpu_gemm_tuned e[MPT_CPU_GEMM_TABLE_MAX];
  const int n = mpt_cpu_gemm_table(e, MPT_CPU_GEMM_TABLE_MAX);
  for (int i = 0; i < n; i++)
    fprintf(f, "%" PRId64 " %" PRId64 " %" PRId64 " %s\n", e[i].m, e[i].n, e[i].k,
            mpt_cpu_gemm_name(e[i].gemm));
  fclose(f);
}

/* MPT_TEST_GEMM_TUNE_BIAS=1: rank 0's timing favours OpenBLAS, the others' oneDNN. */
static void maybe_bias(const mpt__trainer *t, mpt_cpu_gemm_tuned *e, int count) {
  const char *v = mpt__test_env("MPT_TEST_GEMM_TUNE_BIAS");
  if (!v || strcmp(v, "1") != 0) return;
  for (int i = 0; i < count; i++) {
    if (t->rank == 0) e[i].onednn_ms = e[i].openblas_ms * 1000 + 1;
    else e[i].openblas_ms = e[i].onednn_ms * 1000 + 1;
    e[i].gemm = t->rank == 0 ? MPT_CPU_GEMM_OPENBLAS : MPT_CPU_GEMM_ONEDNN;
  }
}

static mpt_status tune_begin(mpt__trainer *t, mpt_cpu_gemm_tuned *e);

mpt_status mpt__train_gemm_tune_begin(mpt__trainer *t) {
  t->gemm_tune_pending = 0;
  if (mpt_cpu_gemm_setting() != MPT_CPU_GEMM_TUNE || t->device.type != MPT_DEVICE_CPU)
    return MPT_OK;
  mpt_cpu_gemm_tuned *e = calloc(MPT_CPU_GEMM_TABLE_MAX, sizeof *e);
  if (!e) return MPT_FAIL(MPT_ENOMEM, "GEMM tuning: no memory for the table");
  mpt_status st = tune_begin(t, e);
  free(e);
  return st;
}

static mpt_status tune_begin(mpt__trainer *t, mpt_cpu_gemm_tuned *e) {
  int count = 0;
  if (t->rank == 0) {
    char key[2048];
    MPT_RETURN_IF(mpt_cpu_gemm_cache_key(key, sizeof key));
    t->gemm_cache_path[0] = '\0';
    if (t->c.gemm_cache[0]) {
      snprintf(t->gemm_cache_path, sizeof t->gemm_cache_path, "%s", t->c.gemm_cache);
    } else if (mpt_cpu_gemm_cache_path(key, t->gemm_cache_path, sizeof t->gemm_cache_path) !=
               MPT_OK) {
      mpt_log(MPT_LOG_WARN, "GEMM tune: %s; the choice is not cached", mpt_last_error());
      t->gemm_cache_path[0] = '\0';
    }
    if (t->gemm_cache_path[0]) {
      const mpt_status st = mpt_cpu_gemm_cache_read(t->gemm_cache_path, key, e,
                                                    MPT_CPU_GEMM_TABLE_MAX, &count);
      if (st == MPT_ENOENT)
        mpt_log(MPT_LOG_INFO, "GEMM tune: no cache at %s yet: the first step's shapes will be "
                "timed after it", t->gemm_cache_path);
      else if (st != MPT_OK)
        mpt_log(MPT_LOG_WARN, "GEMM tune: %s: the cache is ignored, the shapes are timed again",
                mpt_last_error());
      if (st != MPT_OK) count = 0;
    }
  }
  MPT_RETURN_IF(bcast_entries(t, e, &count));
  MPT_RETURN_IF(mpt_cpu_gemm_table_set(e, count));
  if (count > 0 && t->rank == 0) {
    char what[4300];
    snprintf(what, sizeof what, "from the cache %s", t->gemm_cache_path);
    log_table(what, e, count);
  }
  mpt_cpu_gemm_record(1);
  t->gemm_tune_pending = 1;
  return MPT_OK;
}

static mpt_status tune_end(mpt__trainer *t, mpt_cpu_gemm_tuned *table, mpt_cpu_gemm_tuned *fresh,
                           mpt_cpu_gemm_tuned *rec);

mpt_status mpt__train_gemm_tune_end(mpt__trainer *t) {
  t->gemm_tune_pending = 0;
  mpt_cpu_gemm_record(0);
  mpt_cpu_gemm_tuned *buf = calloc(3 * MPT_CPU_GEMM_TABLE_MAX, sizeof *buf);
  if (!buf) return MPT_FAIL(MPT_ENOMEM, "GEMM tuning: no memory for the table");
  mpt_status st = tune_end(t, buf, buf + MPT_CPU_GEMM_TABLE_MAX, buf + 2 * MPT_CPU_GEMM_TABLE_MAX);
  free(buf);
  return st;
}

/* table: the installed table and room for the new shapes; fresh, rec: scratch. */
static mpt_status tune_end(mpt__trainer *t, mpt_cpu_gemm_tuned *table, mpt_cpu_gemm_tuned *fresh,
                           mpt_cpu_gemm_tuned *rec) {
  const int have = mpt_cpu_gemm_table(table, MPT_CPU_GEMM_TABLE_MAX);
  int count = 0;
  if (t->rank == 0) { /* rank 0's list of the shapes to time */
    int nrec = mpt_cpu_gemm_recorded(rec, MPT_CPU_GEMM_TABLE_MAX);
    if (nrec > MPT_CPU_GEMM_TABLE_MAX) nrec = MPT_CPU_GEMM_TABLE_MAX;
    for (int i = 0; i < nrec && have + count < MPT_CPU_GEMM_TABLE_MAX; i++) {
      int known = 0;
      for (int j = 0; j < have && !known; j++)
        known = table[j].m == rec[i].m && table[j].n == rec[i].n && table[j].k == rec[i].k;
      if (!known) fresh[count++] = rec[i];
    }
  }
  MPT_RETURN_IF(bcast_entries(t, fresh, &count));
  if (count == 0) {
    if (have == 0 && t->rank == 0)
      mpt_log(MPT_LOG_INFO, "GEMM tune: the first step computed no fp32 CPU product to time");
    dump_table(t);
    return MPT_OK;
  }
  const double t0 = mpt_time_ms();
  MPT_RETURN_IF(mpt_cpu_gemm_time_shapes(fresh, count, TUNE_REPS, TUNE_BUDGET_MS));
  const double ms = mpt_time_ms() - t0;
  maybe_bias(t, fresh, count);
  MPT_RETURN_IF(bcast_entries(t, fresh, &count)); /* rank 0's choices, everywhere */
  memcpy(table + have, fresh, (size_t)count * sizeof *fresh);
  MPT_RETURN_IF(mpt_cpu_gemm_table_set(table, have + count));
  dump_table(t);
  if (t->rank != 0) return MPT_OK;
  char what[4400];
  int timed = 0;
  for (int i = 0; i < count; i++) timed += fresh[i].openblas_ms > 0 || fresh[i].onednn_ms > 0;
  snprintf(what, sizeof what, "(%d of %d new timed in %.0f ms after the first step, within %.0f "
           "ms%s)", timed, count, ms, TUNE_BUDGET_MS, have ? "; the others from the cache" : "");
  log_table(what, table, have + count);
  if (t->gemm_cache_path[0]) {
    /* the timed shapes only: one left to the rule by the budget is timed by a later run */
    int keep = 0;
    for (int i = 0; i < have + count; i++)
      if (table[i].openblas_ms > 0 || table[i].onednn_ms > 0) table[keep++] = table[i];
    char key[2048];
    mpt_status st = mpt_cpu_gemm_cache_key(key, sizeof key);
    if (st == MPT_OK) st = mpt_cpu_gemm_cache_write(t->gemm_cache_path, key, table, keep);
    if (st != MPT_OK)
      mpt_log(MPT_LOG_WARN, "GEMM tune: the cache could not be written (%s); the run goes on",
              mpt_last_error());
  }
  return MPT_OK;
}
