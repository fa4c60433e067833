/* DataParallel (include/mpitrain/dp.h): replicas, one persistent thread per device, and the
 * step: broadcast, scatter, parallel forward + loss + backward, gather, reduce.
 *
 * Threads. The caller's thread runs mpt_dp_* and the first device's extra work (buffer
 * broadcast, gather, reduce) on dp->stream. Replica k's thread sleeps on dp->wake between
 * steps; a step bumps dp->generation, and each replica whose index is below dp->active runs
 * its job on its own stream (reps[k].stream, an inline stream of its device), records
 * reps[k].done, and reports under dp->mutex (finished = generation, status). The caller reads
 * a replica's results only after seeing finished == generation under the mutex, so the
 * mutex orders every hand-over; the job fields of dp are written before the bump and only
 * read by the threads during the step. The replica threads block the asynchronous signals
 * (core/threads.h): they run GEMMs, and a signal is the program's thread's to take.
 *
 * Ordering between devices goes through events, never through the host alone: the replicas'
 * streams wait for dp->start (recorded on dp->stream after the caller's earlier work and the
 * buffer broadcast), and dp->stream waits for reps[k].done before gathering or reducing replica
 * k. On the CPU (inline streams) these are complete when recorded, and the ops run on the
 * calling thread.
 *
 * Invariants: the model's gradient buffer is written during a step by replica 0's backward
 * (accumulating) and then only by the caller, which adds replicas 1, 2, ... in index order
 * after replica 0 finished, so the sum is the same for any thread timing. Replica 0 is the
 * model: its BatchNorm updates are the model's. Once a wait has timed out the mpt_dp is marked
 * broken (a replica may still be running) and refuses further steps. */
#include "config.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mpitrain/core.h"
#include "core/threads.h"
#ifdef MPT_HAVE_CUDA
#include "core/cuda/cuda.h"
#endif
#include "dp/dp_impl.h"
#include "mpitrain/ops.h"

typedef struct replica {
  struct mpt_dp *dp;
  int index;
  mpt_device device;
  mpt_model *model;   /* index 0: the caller's model (not owned) */
  mpt_tape *tape;
  mpt_stream *stream; /* inline stream of `device`: the replica's thread during a step */
  mpt_event *done;    /* recorded on `stream` at the end of the replica's work */
  void *x, *y;        /* this replica's rows: inputs [count, ...], labels [count, ...] */
  size_t x_nbytes, y_nbytes; /* their capacities */
  float *stage;       /* [param_count] on devices[0] when `device` is another memory space */
  pthread_t thread;
  int has_thread;
  /* under dp->mutex */
  uint64_t seen, finished; /* generations taken and finished */
  int exited;
  mpt_status status;
  /* the job (written by the caller before the wake) and its results (by the thread) */
  int64_t first, count;
  mpt_var *logits; /* [count, C] in the tape's arena, valid until the next reset */
  float loss;
  int64_t correct;
  char detail[1024];
  double ms;
} replica;

struct mpt_dp {
  mpt_model *model;
  mpt_stream *stream;     /* the caller's stream on devices[0], or own_stream */
  mpt_stream *own_stream;
  mpt_dp_config cfg;
  char list[256];         /* the device list as text, for messages */
  int n;
  replica *reps;          /* [n] */
  pthread_mutex_t mutex;
  pthread_cond_t wake, done; /* wake: new generation or stop; done: a replica finished */
  int sync_ready;
  uint64_t generation;
  int stop, broken;
  /* the current job: read-only for the threads during a step */
  const mpt_tensor *images, *labels;
  int64_t batch, row_elems, label_elems; /* B, and the elements of an input and a label row */
  float scale;
  uint64_t seed;
  int backward, training, active;
  mpt_event *start; /* recorded on `stream` when the replicas may start */
  /* gathered outputs [batch, C] on the output device */
  void *out_data;
  size_t out_nbytes;
  mpt_tensor out;
  int have_out;
  mpt_dp_stats stats;
  mpt_trace *trace;
};

mpt_dp_config mpt_dp_config_default(void) {
  mpt_dp_config c;
  c.output_device = 0;
  c.gather_outputs = 1;
  c.timeout_ms = 300000.0;
  c.precision = MPT_PRECISION_FP32;
  c.loss = NULL;
  c.loss_ctx = NULL;
  return c;
}

/* CPU devices share one address space; a CUDA device is its own. */
static int same_memory(mpt_device a, mpt_device b) {
  return a.type == b.type && (a.type == MPT_DEVICE_CPU || a.index == b.index);
}

static struct timespec deadline_after(double timeout_ms) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  long long ns = (long long)(timeout_ms * 1e6);
  ts.tv_sec += (time_t)(ns / 1000000000LL);
  ts.tv_nsec += (long)(ns % 1000000000LL);
  if (ts.tv_nsec >= 1000000000L) {
    ts.tv_sec += 1;
    ts.tv_nsec -= 1000000000L;
  }
  return ts;
}

/* Grows a device allocation to at least `need` bytes (contents are not kept). */
static mpt_status ensure_capacity(mpt_device device, void **ptr, size_t *cap, size_t need) {
  if (need <= *cap) return MPT_OK;
  mpt_device_free(device, *ptr);
  *ptr = NULL;
  *cap = 0;
  MPT_RETURN_IF(mpt_device_alloc(device, need, ptr));
  *cap = need;
  return MPT_OK;
}

/* ---- the replicas' side ---- */

/* Replica r's work for one step, on its thread and its stream. */
static mpt_status replica_run(replica *r) {
  mpt_dp *dp = r->dp;
  mpt_model *m = r->model;
  MPT_RETURN_IF(mpt_stream_wait_event(r->stream, dp->start, dp->cfg.timeout_ms));
  if (r->index > 0) { /* replicate: the first device's parameters (buffers came from the caller) */
    mpt_model_set_training(m, dp->training);
    MPT_RETURN_IF(mpt_op_memcpy(r->stream, r->device, mpt_model_params(m),
                                mpt_model_device(dp->model), mpt_model_params(dp->model),
                                (size_t)mpt_model_param_count(m) * sizeof(float)));
    if (dp->backward) MPT_RETURN_IF(mpt_model_zero_grad(m, r->stream));
  }
  /* scatter: this replica's rows into its own memory */
  const mpt_tensor *im = dp->images, *lb = dp->labels;
  size_t xb = (size_t)(r->count * dp->row_elems) * mpt_dtype_size(im->dtype);
  size_t yb = (size_t)(r->count * dp->label_elems) * sizeof(int32_t);
  MPT_RETURN_IF(ensure_capacity(r->device, &r->x, &r->x_nbytes, xb));
  MPT_RETURN_IF(ensure_capacity(r->device, &r->y, &r->y_nbytes, yb));
  const size_t xrow = (size_t)dp->row_elems * mpt_dtype_size(im->dtype);
  MPT_RETURN_IF(mpt_op_memcpy(r->stream, r->device, r->x, im->device,
                              (const char *)im->data + (size_t)r->first * xrow, xb));
  MPT_RETURN_IF(mpt_op_memcpy(r->stream, r->device, r->y, lb->device,
                              (const int32_t *)lb->data + r->first * dp->label_elems, yb));
  int64_t shape[MPT_MAX_DIMS], yshape[MPT_MAX_DIMS];
  memcpy(shape, im->shape, sizeof shape);
  memcpy(yshape, lb->shape, sizeof yshape);
  shape[0] = yshape[0] = r->count;
  mpt_tensor xt = mpt_tensor_view(r->x, r->device, im->dtype, im->ndim, shape);
  mpt_tensor yt = mpt_tensor_view(r->y, r->device, MPT_I32, lb->ndim, yshape);
  /* forward, loss, backward; each phase is a trace event on the replica's lane */
  const double f0 = mpt_time_ms();
  mpt_tape_reset(r->tape, dp->seed + (uint64_t)r->index);
  mpt_tape_set_grad_enabled(r->tape, dp->backward);
  mpt_var *in = NULL, *loss = NULL;
  MPT_RETURN_IF(mpt_tape_input(r->tape, &xt, &in));
  MPT_RETURN_IF(mpt_model_forward(m, r->tape, in, &r->logits));
  const mpt_tensor *lv = mpt_var_value(r->logits);
  const int classifier = !dp->cfg.loss;
  if (lv->ndim < 1 || lv->shape[0] != r->count || (classifier && lv->ndim != 2)) {
    char buf[128];
    return MPT_FAIL(MPT_ESHAPE, "dp: the model's output is %s, want %s [%lld, ...]",
                    mpt_shape_str(lv->ndim, lv->shape, buf, sizeof buf),
                    classifier ? "logits" : "rows", (long long)r->count);
  }
  if (classifier)
    MPT_RETURN_IF(mpt_nn_cross_entropy(r->tape, r->logits, &yt, &loss));
  else
    MPT_RETURN_IF(dp->cfg.loss(dp->cfg.loss_ctx, r->tape, r->logits, &yt, &loss));
  MPT_RETURN_IF(mpt_var_item(r->tape, loss, &r->loss));
  r->correct = 0;
  if (lv->ndim == 2 && yt.ndim == 1)
    MPT_RETURN_IF(mpt_op_count_correct(r->stream, lv->data, r->y, r->count, lv->shape[1],
                                       &r->correct));
  const double f1 = mpt_time_ms();
  if (dp->trace) mpt_trace_add(dp->trace, "forward", 2 + r->index, f0, f1 - f0, r->index);
  if (dp->backward) { /* the chunk's mean weighs count / B in the batch's mean */
    MPT_RETURN_IF(mpt_tape_backward(
        r->tape, loss, (float)((double)dp->scale * (double)r->count / (double)dp->batch)));
    if (dp->trace)
      mpt_trace_add(dp->trace, "backward", 2 + r->index, f1, mpt_time_ms() - f1, r->index);
  }
  return mpt_event_record(r->done, r->stream);
}

static void *replica_thread(void *arg) {
  replica *r = arg;
  mpt_dp *dp = r->dp;
  pthread_mutex_lock(&dp->mutex);
  for (;;) {
    while (!dp->stop && r->seen == dp->generation) pthread_cond_wait(&dp->wake, &dp->mutex);
    if (dp->stop) break;
    uint64_t generation = dp->generation;
    r->seen = generation;
    int run = r->index < dp->active;
    pthread_mutex_unlock(&dp->mutex);
    mpt_status st = MPT_OK;
    if (run) {
      double t0 = mpt_time_ms();
      mpt_error_clear();
      st = replica_run(r);
      if (st != MPT_OK) snprintf(r->detail, sizeof r->detail, "%s", mpt_last_error());
      r->ms = mpt_time_ms() - t0;
    }
    pthread_mutex_lock(&dp->mutex);
    r->status = st;
    r->finished = generation;
    pthread_cond_broadcast(&dp->done);
  }
  r->exited = 1;
  pthread_cond_broadcast(&dp->done);
  pthread_mutex_unlock(&dp->mutex);
  return NULL;
}

/* ---- lifetime ---- */

static mpt_status replica_setup(mpt_dp *d, int k, mpt_device device) {
  replica *r = &d->reps[k];
  r->dp = d;
  r->index = k;
  r->device = device;
  if (k == 0)
    r->model = d->model;
  else
    MPT_RETURN_IF(mpt_model_replicate(d->model, device, &r->model));
  MPT_RETURN_IF(mpt_stream_init(&r->stream, device, MPT_STREAM_INLINE));
  MPT_RETURN_IF(mpt_tape_init(&r->tape, r->model, r->stream));
  MPT_RETURN_IF(mpt_tape_set_precision(r->tape, d->cfg.precision));
  /* DataParallel drives its replicas itself: a DDP wrapping the model (hybrid) reduces the
   * gathered gradients with mpt_ddp_allreduce_grads, not from replica 0's backward. */
  mpt_tape_set_model_hooks(r->tape, 0);
  MPT_RETURN_IF(mpt_event_init(&r->done, device));
  mpt_device first = d->reps[0].device;
  if (k > 0 && !same_memory(device, first))
    MPT_RETURN_IF(mpt_device_alloc(first,
                                   (size_t)mpt_model_param_count(d->model) * sizeof(float),
                                   (void **)&r->stage));
  if (mpt__thread_create(&r->thread, NULL, replica_thread, r) != 0) {
    char name[32];
    return MPT_FAIL(MPT_EDEVICE, "dp: cannot start the thread of %s",
                    mpt_device_str(device, name, sizeof name));
  }
  r->has_thread = 1;
  return MPT_OK;
}

mpt_status mpt_dp_init(mpt_dp **dp, mpt_model *model, const mpt_device *devices, int ndevices,
                       mpt_stream *stream, const mpt_dp_config *config) {
  if (!dp || !model || !devices) return MPT_FAIL(MPT_EINVAL, "dp_init: NULL argument");
  *dp = NULL;
  if (ndevices < 1 || ndevices > MPT_DP_MAX_DEVICES)
    return MPT_FAIL(MPT_EINVAL, "dp_init: %d devices (want 1 .. %d)", ndevices,
                    MPT_DP_MAX_DEVICES);
  mpt_dp_config cfg = config ? *config : mpt_dp_config_default();
  if (cfg.output_device < 0 || cfg.output_device >= ndevices)
    return MPT_FAIL(MPT_EINVAL, "dp_init: output_device %d is not in the list of %d devices",
                    cfg.output_device, ndevices);
  if (!(cfg.timeout_ms > 0))
    return MPT_FAIL(MPT_EINVAL, "dp_init: timeout_ms = %g must be > 0", cfg.timeout_ms);
  char list[256] = "";
  size_t used = 0;
  for (int k = 0; k < ndevices && used < sizeof list; k++) {
    char name[32];
    used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", k ? "," : "",
                             mpt_device_str(devices[k], name, sizeof name));
  }
  MPT_RETURN_IF(mpt__dp_check_list(devices, ndevices, list));
  char want[32], have[32];
  mpt_device_str(devices[0], want, sizeof want);
  if (!same_memory(mpt_model_device(model), devices[0]))
    return MPT_FAIL(MPT_EINVAL, "dp_init: the model is on %s, not on the first device %s",
                    mpt_device_str(mpt_model_device(model), have, sizeof have), want);
  if (mpt_model_num_params(model) > 0 && !mpt_model_params(model))
    return MPT_FAIL(MPT_ESTATE, "dp_init: the model is not finalised");
  if (stream ? !same_memory(mpt_stream_device(stream), devices[0])
             : devices[0].type != MPT_DEVICE_CPU)
    return MPT_FAIL(MPT_EINVAL, "dp_init: the stream is %s%s, not a stream of the first device "
                    "%s", stream ? "on " : "NULL (the CPU)",
                    stream ? mpt_device_str(mpt_stream_device(stream), have, sizeof have) : "",
                    want);

  mpt_status st = MPT_OK;
  mpt_dp *d = calloc(1, sizeof *d);
  if (!d) return MPT_FAIL(MPT_ENOMEM, "dp_init: out of host memory");
  d->reps = calloc((size_t)ndevices, sizeof *d->reps);
  if (!d->reps) {
    free(d);
    return MPT_FAIL(MPT_ENOMEM, "dp_init: out of host memory");
  }
  d->model = model;
  d->cfg = cfg;
  d->n = ndevices;
  snprintf(d->list, sizeof d->list, "%s", list);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_mutex_init(&d->mutex, NULL);
  pthread_cond_init(&d->wake, &ca);
  pthread_cond_init(&d->done, &ca);
  pthread_condattr_destroy(&ca);
  d->sync_ready = 1;
  if (!stream) MPT_CHECK(mpt_stream_init(&d->own_stream, devices[0], MPT_STREAM_INLINE), fail);
  d->stream = stream ? stream : d->own_stream;
  MPT_CHECK(mpt_event_init(&d->start, devices[0]), fail);
  for (int k = 0; k < ndevices; k++) MPT_CHECK(replica_setup(d, k, devices[k]), fail);
#ifdef MPT_HAVE_CUDA
  /* Copies between the GPUs of the group (parameters out, outputs and gradients back) go
   * directly over NVLink / PCIe with peer access; without it the driver stages them through
   * host memory. */
  for (int i = 0; i < ndevices; i++)
    for (int j = 0; j < ndevices; j++)
      if (i != j && devices[i].type == MPT_DEVICE_CUDA && devices[j].type == MPT_DEVICE_CUDA &&
          devices[i].index != devices[j].index &&
          !mpt__cuda_enable_peer_access(devices[i].index, devices[j].index))
        mpt_log(MPT_LOG_DEBUG,
                "dp: no peer access from cuda:%d to cuda:%d (copies go through the host)",
                devices[i].index, devices[j].index);
#endif
  *dp = d;
  return MPT_OK;
fail:
  mpt_dp_free(d);
  return st;
}

void mpt_dp_free(mpt_dp *d) {
  if (!d) return;
  if (d->sync_ready) {
    struct timespec dl = deadline_after(d->cfg.timeout_ms);
    int hung = 0;
    pthread_mutex_lock(&d->mutex);
    d->stop = 1;
    pthread_cond_broadcast(&d->wake);
    for (int k = 0; k < d->n; k++) {
      int rc = 0;
      while (d->reps[k].has_thread && !d->reps[k].exited && rc != ETIMEDOUT)
        rc = pthread_cond_timedwait(&d->done, &d->mutex, &dl);
      if (d->reps[k].has_thread && !d->reps[k].exited) hung = 1;
    }
    pthread_mutex_unlock(&d->mutex);
    if (hung) { /* never free memory under a running thread */
      mpt_log(MPT_LOG_WARN, "dp: a replica thread of [%s] did not stop within %.0f ms; its "
              "memory is leaked", d->list, d->cfg.timeout_ms);
      for (int k = 0; k < d->n; k++)
        if (d->reps[k].has_thread) pthread_detach(d->reps[k].thread);
      return;
    }
    for (int k = 0; k < d->n; k++)
      if (d->reps[k].has_thread) pthread_join(d->reps[k].thread, NULL);
  }
  mpt_device first = d->n > 0 ? d->reps[0].device : mpt_device_cpu();
  for (int k = 0; k < d->n; k++) {
    replica *r = &d->reps[k];
    mpt_tape_free(r->tape);
    mpt_event_free(r->done);
    mpt_device_free(r->device, r->x);
    mpt_device_free(r->device, r->y);
    mpt_device_free(first, r->stage);
    if (k > 0) mpt_model_free(r->model);
    mpt_stream_free(r->stream);
  }
  if (d->out_data) mpt_device_free(d->reps[d->cfg.output_device].device, d->out_data);
  mpt_event_free(d->start);
  mpt_stream_free(d->own_stream);
  if (d->sync_ready) {
    pthread_cond_destroy(&d->wake);
    pthread_cond_destroy(&d->done);
    pthread_mutex_destroy(&d->mutex);
  }
  free(d->reps);
  free(d);
}

int mpt_dp_num_devices(const mpt_dp *d) { return d ? d->n : 0; }

mpt_device mpt_dp_device(const mpt_dp *d, int index) {
  if (!d) return mpt_device_cpu();
  return d->reps[index >= 0 && index < d->n ? index : 0].device;
}

mpt_model *mpt_dp_replica(mpt_dp *d, int index) {
  return d && index >= 0 && index < d->n ? d->reps[index].model : NULL;
}

const mpt_tensor *mpt_dp_output(const mpt_dp *d) { return d && d->have_out ? &d->out : NULL; }

mpt_dp_stats mpt_dp_get_stats(const mpt_dp *d) {
  mpt_dp_stats s;
  if (d) return d->stats;
  memset(&s, 0, sizeof s);
  return s;
}

void mpt_dp_reset_stats(mpt_dp *d) {
  if (d) memset(&d->stats, 0, sizeof d->stats);
}

void mpt_dp_set_trace(mpt_dp *d, mpt_trace *trace) {
  if (d) d->trace = trace;
}

/* ---- the caller's side of a step ---- */

/* Waits (until `deadline`) for replica r to finish generation `gen`. A timeout breaks the dp. */
static mpt_status replica_wait(mpt_dp *d, replica *r, uint64_t gen,
                               const struct timespec *deadline) {
  pthread_mutex_lock(&d->mutex);
  int rc = 0;
  while (r->finished < gen && rc != ETIMEDOUT)
    rc = pthread_cond_timedwait(&d->done, &d->mutex, deadline);
  int finished = r->finished >= gen;
  mpt_status st = r->status;
  pthread_mutex_unlock(&d->mutex);
  char name[32];
  mpt_device_str(r->device, name, sizeof name);
  if (!finished) {
    d->broken = 1;
    return MPT_FAIL(MPT_ETIMEOUT, "dp: the replica on %s did not finish its step within %.0f "
                    "ms (device list %s)", name, d->cfg.timeout_ms, d->list);
  }
  if (st != MPT_OK) return mpt_error_set(st, "%s: %s", name, r->detail);
  return MPT_OK;
}

/* Copies replica r's outputs to rows [first, first + count) of the gathered output. */
static mpt_status gather_one(mpt_dp *d, replica *r) {
  const mpt_tensor *lv = mpt_var_value(r->logits);
  const int64_t classes = lv->count / r->count; /* elements per row: C for logits [rows, C] */
  mpt_device out_dev = d->reps[d->cfg.output_device].device;
  if (r->index == 0) {
    size_t need = (size_t)(d->batch * classes) * sizeof(float);
    MPT_RETURN_IF(ensure_capacity(out_dev, &d->out_data, &d->out_nbytes, need));
    int64_t shape[MPT_MAX_DIMS];
    memcpy(shape, lv->shape, sizeof shape);
    shape[0] = d->batch;
    d->out = mpt_tensor_view(d->out_data, out_dev, MPT_F32, lv->ndim, shape);
  } else if (classes != d->out.count / d->batch) {
    return MPT_FAIL(MPT_ESHAPE, "dp: replica %d returned rows of %lld values, replica 0 %lld",
                    r->index, (long long)classes, (long long)(d->out.count / d->batch));
  }
  MPT_RETURN_IF(mpt_stream_wait_event(d->stream, r->done, d->cfg.timeout_ms));
  return mpt_op_memcpy(d->stream, out_dev, (float *)d->out_data + r->first * classes, r->device,
                       lv->data, (size_t)(r->count * classes) * sizeof(float));
}

/* model.grads += replica r's gradients (through the staging buffer across memory spaces). */
static mpt_status reduce_one(mpt_dp *d, replica *r) {
  int64_t count = mpt_model_param_count(d->model);
  const float *src = mpt_model_grads(r->model);
  MPT_RETURN_IF(mpt_stream_wait_event(d->stream, r->done, d->cfg.timeout_ms));
  if (r->stage) {
    MPT_RETURN_IF(mpt_op_memcpy(d->stream, d->reps[0].device, r->stage, r->device, src,
                                (size_t)count * sizeof(float)));
    src = r->stage;
  }
  return mpt_op_axpy(d->stream, count, 1.0f, src, mpt_model_grads(d->model));
}

static mpt_status check_inputs(mpt_dp *d, const mpt_tensor *images, const mpt_tensor *labels) {
  char a[96], b[96], dev[32];
  if (!d || !images || !labels) return MPT_FAIL(MPT_EINVAL, "dp: NULL argument");
  if (d->broken)
    return MPT_FAIL(MPT_ESTATE, "dp: an earlier step timed out on [%s]; this DataParallel is "
                    "unusable", d->list);
  if ((images->dtype != MPT_F32 && images->dtype != MPT_I32) || images->ndim < 1 ||
      !images->data || images->shape[0] < 1)
    return MPT_FAIL(MPT_EINVAL, "dp: images must be float32 or int32 [B, ...] with B >= 1 (got "
                    "%s %s)", mpt_dtype_name(images->dtype),
                    mpt_shape_str(images->ndim, images->shape, a, sizeof a));
  if (labels->dtype != MPT_I32 || labels->ndim < 1 || labels->shape[0] != images->shape[0] ||
      (!d->cfg.loss && labels->ndim != 1) || !labels->data)
    return MPT_FAIL(MPT_ESHAPE, "dp: labels %s %s for images %s (want int32 [%lld%s])",
                    mpt_dtype_name(labels->dtype),
                    mpt_shape_str(labels->ndim, labels->shape, a, sizeof a),
                    mpt_shape_str(images->ndim, images->shape, b, sizeof b),
                    (long long)images->shape[0], d->cfg.loss ? ", ..." : "");
  const mpt_tensor *t[2] = {images, labels};
  for (int i = 0; i < 2; i++)
    if (t[i]->device.type != MPT_DEVICE_CPU && !same_memory(t[i]->device, d->reps[0].device))
      return MPT_FAIL(MPT_EINVAL, "dp: %s are on %s; give them on the host or on %s",
                      i ? "labels" : "images", mpt_device_str(t[i]->device, dev, sizeof dev),
                      mpt_device_str(d->reps[0].device, a, sizeof a));
  return MPT_OK;
}

static mpt_status dp_run(mpt_dp *d, const mpt_tensor *images, const mpt_tensor *labels,
                         int backward, float scale, uint64_t seed, float *loss_out,
                         int64_t *correct_out) {
  MPT_RETURN_IF(check_inputs(d, images, labels));
  const double t0 = mpt_time_ms();
  const int64_t batch = images->shape[0];
  int64_t counts[MPT_DP_MAX_DEVICES];
  const int active = mpt_dp_split(batch, d->n, counts);
  int64_t first = 0;
  for (int k = 0; k < active; k++) {
    d->reps[k].first = first;
    d->reps[k].count = counts[k];
    first += counts[k];
  }
  d->have_out = 0;

  /* 1. broadcast the buffers (replica 0 is the model: nothing to copy) */
  const int64_t nbuf = mpt_model_buffer_count(d->model);
  for (int k = 1; k < active; k++)
    MPT_RETURN_IF(mpt_op_memcpy(d->stream, d->reps[k].device, mpt_model_buffers(d->reps[k].model),
                                d->reps[0].device, mpt_model_buffers(d->model),
                                (size_t)nbuf * sizeof(float)));
  MPT_RETURN_IF(mpt_event_record(d->start, d->stream));
  const double t1 = mpt_time_ms();
  if (d->trace && active > 1) mpt_trace_add(d->trace, "dp broadcast", 0, t0, t1 - t0, -1);

  /* 2-3. wake the replicas: scatter, forward, loss, backward */
  pthread_mutex_lock(&d->mutex);
  d->images = images;
  d->labels = labels;
  d->batch = batch;
  d->row_elems = images->count / batch;
  d->label_elems = labels->count / batch;
  d->scale = scale;
  d->seed = seed;
  d->backward = backward;
  d->training = mpt_model_training(d->model);
  d->active = active;
  const uint64_t gen = ++d->generation;
  pthread_cond_broadcast(&d->wake);
  pthread_mutex_unlock(&d->mutex);

  /* 4-5. as each replica finishes, in index order: gather its outputs, add its gradients */
  const struct timespec deadline = deadline_after(d->cfg.timeout_ms);
  mpt_status err = MPT_OK;
  char detail[1024] = "";
  double wait_ms = 0, gather_ms = 0, reduce_ms = 0, loss = 0;
  int64_t correct = 0;
  for (int k = 0; k < active; k++) {
    replica *r = &d->reps[k];
    double w0 = mpt_time_ms();
    mpt_status st = replica_wait(d, r, gen, &deadline);
    double w1 = mpt_time_ms();
    wait_ms += w1 - w0;
    if (st == MPT_ETIMEOUT) return st; /* broken: the others may hang too */
    if (st == MPT_OK && err == MPT_OK && d->cfg.gather_outputs) {
      st = gather_one(d, r);
      gather_ms += mpt_time_ms() - w1;
      if (d->trace) mpt_trace_add(d->trace, "dp gather", 0, w1, mpt_time_ms() - w1, k);
    }
    /* dp->stream orders after every replica's work, replica 0's included: without gathered
     * outputs nothing else makes it wait for replica 0, and the reduction (which adds into the
     * model's gradients, written by replica 0's backward) and the caller's optimizer would race
     * replica 0's backward on a device. */
    if (st == MPT_OK && err == MPT_OK && !d->cfg.gather_outputs)
      st = mpt_stream_wait_event(d->stream, r->done, d->cfg.timeout_ms);
    if (st == MPT_OK && err == MPT_OK && backward && k > 0) {
      double r0 = mpt_time_ms();
      st = reduce_one(d, r);
      reduce_ms += mpt_time_ms() - r0;
      if (d->trace) mpt_trace_add(d->trace, "dp reduce", 0, r0, mpt_time_ms() - r0, k);
    }
    if (st != MPT_OK && err == MPT_OK) { /* keep waiting so that no replica is still running */
      err = st;
      snprintf(detail, sizeof detail, "%s", mpt_last_error());
    }
    loss += (double)r->count * (double)r->loss;
    correct += r->correct;
  }
  if (err != MPT_OK) return mpt_error_set(err, "%s", detail);
  d->have_out = d->cfg.gather_outputs;
  if (loss_out) *loss_out = (float)(loss / (double)batch);
  if (correct_out) *correct_out = correct;

  if (backward) {
    mpt_dp_stats *s = &d->stats;
    s->replicas = active;
    s->step_ms = mpt_time_ms() - t0;
    s->broadcast_ms = t1 - t0;
    s->gather_ms = gather_ms;
    s->reduce_ms = reduce_ms;
    s->first_extra_ms = s->broadcast_ms + gather_ms + reduce_ms;
    s->wait_ms = wait_ms;
    s->steps++;
    s->sum_step_ms += s->step_ms;
    s->sum_broadcast_ms += s->broadcast_ms;
    s->sum_gather_ms += gather_ms;
    s->sum_reduce_ms += reduce_ms;
    s->sum_first_extra_ms += s->first_extra_ms;
    s->sum_wait_ms += wait_ms;
    for (int k = 0; k < d->n; k++) {
      s->replica_ms[k] = k < active ? d->reps[k].ms : 0;
      s->sum_replica_ms[k] += s->replica_ms[k];
    }
  }
  return MPT_OK;
}

mpt_status mpt_dp_step(mpt_dp *dp, const mpt_tensor *images, const mpt_tensor *labels,
                       float scale, uint64_t seed, float *loss, int64_t *correct) {
  return dp_run(dp, images, labels, 1, scale, seed, loss, correct);
}

mpt_status mpt_dp_forward(mpt_dp *dp, const mpt_tensor *images, const mpt_tensor *labels,
                          float *loss, int64_t *correct) {
  return dp_run(dp, images, labels, 0, 1.0f, 0, loss, correct);
}
