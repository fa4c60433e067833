/* The batch loader: walks a sampler's list in batches, reading rows of a data source (a user's
 * callbacks, or an in-memory dataset wrapped as one) into two host buffers; a prefetch thread
 * fills batch k + 1 while the caller uses batch k.
 *
 * Protocol (all counters under `mutex`, one condition variable `cond`, broadcast on change):
 * - batch k lives in slot k % 2;
 * - `produced`: batches [0, produced) of this epoch are filled;
 * - `handed`: batches [0, handed) were returned by mpt_loader_next; the caller owns batch
 *   handed - 1 until its next call, which releases it (`released` = handed);
 * - the thread fills batch `produced` only while produced < released + 2 (so it never writes
 *   the slot the caller holds) and produced < num_batches, and not while `paused`;
 * - the thread copies outside the lock with `busy` set; an epoch change sets `paused`, waits
 *   for !busy, then changes the sampler and resets the counters, so the thread never reads the
 *   sampler while it changes.
 * Every wait of the caller on the thread has the config's deadline (CLOCK_MONOTONIC). The
 * thread's own idle wait has none: it is woken by work or by `stop`. Buffers are allocated once
 * at init; nothing is allocated per batch. The thread blocks the asynchronous signals
 * (core/threads.h): they are for the program's threads.
 * A failed fill of batch k (a source callback's error) is sticky in `error`, and `produced`
 * stays at k: batches before k are still handed out, batch k and every later call get the
 * error, with or without the thread. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mpitrain/core.h"
#include "core/threads.h"
#include "mpitrain/data.h"

struct loader_slot {
  unsigned char *images; /* [B, input_shape...] of the source's input dtype */
  int32_t *labels;       /* [B, label_count] */
  int64_t *indices; /* [B] dataset index of each row */
  int64_t rows;     /* rows filled */
  int64_t num_real; /* leading rows that are not sampler padding */
};

struct mpt_loader {
  const mpt_data_source *src; /* borrowed, or owned_src (mpt_loader_init over a dataset) */
  mpt_data_source *owned_src;
  mpt_sampler *sampler;  /* borrowed; its epoch changes only under `paused` */
  mpt_loader_config cfg;
  int64_t input_nbytes; /* bytes of one sample's input */
  int64_t label_count;  /* int32 labels per sample */
  int64_t num_batches;
  struct loader_slot slot[2];

  pthread_mutex_t mutex;
  pthread_cond_t cond;
  pthread_t thread;
  int thread_started;
  /* Guarded by mutex. */
  int64_t produced, released, handed;
  int busy, paused, stop;
  mpt_status error;    /* sticky error of the thread */
  char error_msg[512]; /* its detail (the thread's last-error text is thread-local) */
};

mpt_loader_config mpt_loader_config_default(void) {
  mpt_loader_config c;
  c.batch_size = 64;
  c.drop_last = 0;
  c.prefetch = 1;
  c.timeout_ms = 60000.0;
  return c;
}

static void deadline_after(struct timespec *ts, double ms) {
  clock_gettime(CLOCK_MONOTONIC, ts);
  long long ns = (long long)(ms * 1e6);
  ts->tv_sec += (time_t)(ns / 1000000000LL);
  ts->tv_nsec += (long)(ns % 1000000000LL);
  if (ts->tv_nsec >= 1000000000L) {
    ts->tv_sec += 1;
    ts->tv_nsec -= 1000000000L;
  }
}

/* Copies batch k into its slot. Reads the sampler and the dataset only. */
static mpt_status loader_fill(mpt_loader *l, int64_t k) {
  struct loader_slot *s = &l->slot[k % 2];
  const int64_t b = l->cfg.batch_size, start = k * b;
  int64_t rows = mpt_sampler_num_samples(l->sampler) - start;
  if (rows > b) rows = b;
  MPT_RETURN_IF(mpt_sampler_fill(l->sampler, start, rows, s->indices));
  const int64_t n = mpt_data_source_get_desc(l->src)->count;
  for (int64_t i = 0; i < rows; i++) {
    int64_t j = s->indices[i];
    if (j < 0 || j >= n)
      return MPT_FAIL(MPT_ESTATE, "loader: sampler gave index %lld for a dataset of %lld",
                      (long long)j, (long long)n);
    mpt_status st = mpt_data_source_read(l->src, j, s->images + i * l->input_nbytes,
                                         s->labels + i * l->label_count);
    if (st != MPT_OK) {
      char detail[512];
      snprintf(detail, sizeof detail, "%s", mpt_last_error());
      return MPT_FAIL(st, "loader: batch %lld of epoch %lld (row %lld): %s", (long long)k,
                      (long long)mpt_sampler_epoch(l->sampler), (long long)i, detail);
    }
  }
  int64_t real = mpt_sampler_num_real(l->sampler) - start;
  s->rows = rows;
  s->num_real = real < 0 ? 0 : (real > rows ? rows : real);
  return MPT_OK;
}

static void *loader_thread(void *arg) {
  mpt_loader *l = arg;
  pthread_mutex_lock(&l->mutex);
  for (;;) {
    while (!l->stop && (l->paused || l->error != MPT_OK || l->produced >= l->num_batches ||
                        l->produced >= l->released + 2))
      pthread_cond_wait(&l->cond, &l->mutex);
    if (l->stop) break;
    int64_t k = l->produced;
    l->busy = 1;
    pthread_mutex_unlock(&l->mutex);
    mpt_status st = loader_fill(l, k);
    pthread_mutex_lock(&l->mutex);
    l->busy = 0;
    if (st == MPT_OK) {
      l->produced = k + 1;
    } else {
      l->error = st;
      strncpy(l->error_msg, mpt_last_error(), sizeof l->error_msg - 1);
    }
    pthread_cond_broadcast(&l->cond);
  }
  pthread_mutex_unlock(&l->mutex);
  return NULL;
}

/* Waits (mutex held) until pred holds or the deadline passes. */
#define LOADER_WAIT(l, pred, dl, timed_out)                                 \
  do {                                                                      \
    (timed_out) = 0;                                                        \
    while (!(pred)) {                                                       \
      int rc__ = pthread_cond_timedwait(&(l)->cond, &(l)->mutex, &(dl));    \
      if (rc__ == ETIMEDOUT && !(pred)) {                                   \
        (timed_out) = 1;                                                    \
        break;                                                              \
      }                                                                     \
    }                                                                       \
  } while (0)

static mpt_status loader_sticky(mpt_loader *l) {
  return MPT_FAIL(l->error, "loader: the prefetch thread failed earlier: %s", l->error_msg);
}

mpt_status mpt_loader_init(mpt_loader **loader, const mpt_dataset *ds, mpt_sampler *sampler,
                           const mpt_loader_config *config) {
  if (!loader) return MPT_FAIL(MPT_EINVAL, "mpt_loader_init: loader is NULL");
  *loader = NULL;
  if (!ds || !sampler) return MPT_FAIL(MPT_EINVAL, "mpt_loader_init: dataset or sampler is NULL");
  mpt_data_source *src = NULL;
  MPT_RETURN_IF(mpt_data_source_init_dataset(&src, ds));
  mpt_status st = mpt_loader_init_source(loader, src, sampler, config);
  if (st != MPT_OK) {
    mpt_data_source_free(src);
    return st;
  }
  (*loader)->owned_src = src;
  return MPT_OK;
}

mpt_status mpt_loader_init_source(mpt_loader **loader, const mpt_data_source *src,
                                  mpt_sampler *sampler, const mpt_loader_config *config) {
  if (!loader) return MPT_FAIL(MPT_EINVAL, "mpt_loader_init: loader is NULL");
  *loader = NULL;
  if (!src || !sampler)
    return MPT_FAIL(MPT_EINVAL, "mpt_loader_init: data source or sampler is NULL");
  const mpt_data_source_desc *d = mpt_data_source_get_desc(src);
  mpt_loader_config cfg = config ? *config : mpt_loader_config_default();
  if (cfg.batch_size < 1 || !(cfg.timeout_ms > 0))
    return MPT_FAIL(MPT_EINVAL, "loader: batch_size %lld (must be >= 1), timeout_ms %g (must be > 0)",
                    (long long)cfg.batch_size, cfg.timeout_ms);
  if (mpt_sampler_dataset_count(sampler) != d->count)
    return MPT_FAIL(MPT_ESHAPE, "loader: the sampler covers %lld samples but the dataset has %lld",
                    (long long)mpt_sampler_dataset_count(sampler), (long long)d->count);
  mpt_status st;
  mpt_loader *l = calloc(1, sizeof *l);
  if (!l) return MPT_FAIL(MPT_ENOMEM, "loader: out of memory");
  l->src = src;
  l->sampler = sampler;
  l->cfg = cfg;
  l->input_nbytes = mpt_data_source_input_nbytes(src);
  l->label_count = d->label_count;
  int64_t n = mpt_sampler_num_samples(sampler), b = cfg.batch_size;
  l->num_batches = cfg.drop_last ? n / b : (n + b - 1) / b;
  l->error = MPT_OK;

  /* A batch never holds more rows than this rank's samples: size the buffers for that. */
  const int64_t rows = b < n ? b : (n > 0 ? n : 1);
  int64_t image_bytes, label_count;
  if (__builtin_mul_overflow(rows, l->input_nbytes, &image_bytes) ||
      __builtin_mul_overflow(rows, (int64_t)l->label_count, &label_count) ||
      label_count > INT64_MAX / (int64_t)sizeof(int32_t)) {
    st = MPT_FAIL(MPT_ENOMEM, "loader: a batch of %lld x %lld bytes does not fit in 64 bits",
                  (long long)rows, (long long)l->input_nbytes);
    free(l);
    return st;
  }
  for (int i = 0; i < 2; i++) {
    struct loader_slot *s = &l->slot[i];
    s->images = malloc((size_t)image_bytes);
    s->labels = malloc((size_t)label_count * sizeof(int32_t));
    s->indices = malloc((size_t)rows * sizeof(int64_t));
    if (!s->images || !s->labels || !s->indices) {
      st = MPT_FAIL(MPT_ENOMEM, "loader: cannot allocate two batches of %lld x %lld bytes",
                    (long long)b, (long long)l->input_nbytes);
      goto fail_buffers;
    }
  }
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  int rc = pthread_cond_init(&l->cond, &ca);
  pthread_condattr_destroy(&ca);
  if (rc != 0) {
    st = MPT_FAIL(MPT_EIO, "loader: pthread_cond_init failed (%d)", rc);
    goto fail_buffers;
  }
  pthread_mutex_init(&l->mutex, NULL);
  if (cfg.prefetch) {
    rc = mpt__thread_create(&l->thread, NULL, loader_thread, l);
    if (rc != 0) {
      st = MPT_FAIL(MPT_EIO, "loader: cannot start the prefetch thread: %s", strerror(rc));
      goto fail_sync;
    }
    l->thread_started = 1;
  }
  *loader = l;
  return MPT_OK;

fail_sync:
  pthread_mutex_destroy(&l->mutex);
  pthread_cond_destroy(&l->cond);
fail_buffers:
  for (int i = 0; i < 2; i++) {
    free(l->slot[i].images);
    free(l->slot[i].labels);
    free(l->slot[i].indices);
  }
  free(l);
  return st;
}

void mpt_loader_free(mpt_loader *loader) {
  if (!loader) return;
  mpt_loader *l = loader;
  if (l->thread_started) {
    pthread_mutex_lock(&l->mutex);
    l->stop = 1;
    pthread_cond_broadcast(&l->cond);
    pthread_mutex_unlock(&l->mutex);
    /* The thread only ever copies one batch before it sees `stop`; the deadline guards a
     * stuck thread anyway. If it passes, leak the loader rather than free memory in use.
     * (helgrind does not model pthread_timedjoin_np as a join and reports the destroy below as
     * a race; with pthread_join it reports nothing.) */
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += (time_t)(l->cfg.timeout_ms / 1000.0) + 1;
    int rc = pthread_timedjoin_np(l->thread, NULL, &dl);
    if (rc != 0) {
      mpt_log(MPT_LOG_ERROR,
              "loader: the prefetch thread did not stop within %.0f ms (%s); leaking it",
              l->cfg.timeout_ms, strerror(rc));
      return;
    }
  }
  pthread_mutex_destroy(&l->mutex);
  pthread_cond_destroy(&l->cond);
  for (int i = 0; i < 2; i++) {
    free(l->slot[i].images);
    free(l->slot[i].labels);
    free(l->slot[i].indices);
  }
  mpt_data_source_free(l->owned_src);
  free(l);
}

int64_t mpt_loader_num_batches(const mpt_loader *loader) { return loader->num_batches; }

int mpt_loader_next(mpt_loader *loader, mpt_batch *batch) {
  if (!loader || !batch) return MPT_FAIL(MPT_EINVAL, "mpt_loader_next: loader or batch is NULL");
  mpt_loader *l = loader;
  memset(batch, 0, sizeof *batch);
  int ret = MPT_OK;
  pthread_mutex_lock(&l->mutex);
  /* A failed batch k leaves produced at k: earlier batches still go out, k gets the error. */
  if (l->error != MPT_OK && l->produced <= l->handed && l->handed < l->num_batches) {
    ret = loader_sticky(l);
    goto out;
  }
  /* Release the batch handed out last time: its slot may be refilled now. */
  if (l->released < l->handed) {
    l->released = l->handed;
    pthread_cond_broadcast(&l->cond);
  }
  if (l->handed >= l->num_batches) {
    ret = MPT_LOADER_END;
    goto out;
  }
  const int64_t k = l->handed;
  if (l->thread_started) {
    struct timespec dl;
    int timed_out;
    deadline_after(&dl, l->cfg.timeout_ms);
    LOADER_WAIT(l, l->produced > k || l->error != MPT_OK, dl, timed_out);
    if (timed_out) {
      ret = MPT_FAIL(MPT_ETIMEOUT,
                     "loader: batch %lld of epoch %lld not ready after %.0f ms (prefetch thread "
                     "stuck)",
                     (long long)k, (long long)mpt_sampler_epoch(l->sampler), l->cfg.timeout_ms);
      goto out;
    }
    if (l->produced <= k) {
      ret = loader_sticky(l);
      goto out;
    }
  } else if (l->produced <= k) {
    ret = loader_fill(l, k);
    if (ret != MPT_OK) {
      l->error = ret;
      snprintf(l->error_msg, sizeof l->error_msg, "%s", mpt_last_error());
      goto out;
    }
    l->produced = k + 1;
  }
  l->handed = k + 1;
  const struct loader_slot *s = &l->slot[k % 2];
  const mpt_data_source_desc *d = mpt_data_source_get_desc(l->src);
  int64_t ishape[MPT_DATA_MAX_DIMS + 1] = {s->rows};
  for (int i = 0; i < d->input_ndim; i++) ishape[i + 1] = d->input_shape[i];
  int64_t lshape[2] = {s->rows, l->label_count};
  batch->images = mpt_tensor_view(s->images, mpt_device_cpu(), d->input_dtype,
                                  d->input_ndim + 1, ishape);
  batch->labels = mpt_tensor_view(s->labels, mpt_device_cpu(), MPT_I32,
                                  l->label_count > 1 ? 2 : 1, lshape);
  batch->sample_indices = s->indices;
  batch->count = s->rows;
  batch->num_real = s->num_real;
  batch->index = k;
  batch->epoch = mpt_sampler_epoch(l->sampler);
out:
  pthread_mutex_unlock(&l->mutex);
  return ret;
}

mpt_status mpt_loader_start_epoch(mpt_loader *loader, int64_t epoch) {
  if (!loader) return MPT_FAIL(MPT_EINVAL, "mpt_loader_start_epoch: loader is NULL");
  if (epoch < 0) return MPT_FAIL(MPT_EINVAL, "loader: epoch %lld is negative", (long long)epoch);
  mpt_loader *l = loader;
  mpt_status st = MPT_OK;
  pthread_mutex_lock(&l->mutex);
  if (l->error != MPT_OK) {
    st = loader_sticky(l);
    goto out;
  }
  l->paused = 1;
  struct timespec dl;
  int timed_out;
  deadline_after(&dl, l->cfg.timeout_ms);
  LOADER_WAIT(l, !l->busy, dl, timed_out);
  if (timed_out) {
    l->paused = 0;
    pthread_cond_broadcast(&l->cond);
    st = MPT_FAIL(MPT_ETIMEOUT, "loader: the prefetch thread did not go idle within %.0f ms",
                  l->cfg.timeout_ms);
    goto out;
  }
  st = mpt_sampler_set_epoch(l->sampler, epoch);
  l->produced = l->released = l->handed = 0;
  l->paused = 0;
  pthread_cond_broadcast(&l->cond);
out:
  pthread_mutex_unlock(&l->mutex);
  return st;
}

mpt_status mpt_loader_reset(mpt_loader *loader) {
  if (!loader) return MPT_FAIL(MPT_EINVAL, "mpt_loader_reset: loader is NULL");
  return mpt_loader_start_epoch(loader, mpt_sampler_epoch(loader->sampler));
}
