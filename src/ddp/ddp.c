/* The DDP engine: bucket plan, grad-ready hooks, all-reduce of each bucket on the comm stream
 * while backward goes on, finalize, no_sync, unused parameters, buffer synchronisation.
 *
 * Threads: the training thread calls every function here; the tape calls the hook on that
 * thread. The comm stream's worker thread runs the all-reduces and the two timestamp host
 * functions around each (they write only bucket_start_ms/bucket_end_ms[b] of their bucket,
 * which the training thread reads after waiting on the bucket's completion event).
 *
 * Statistics (ddp_stats.c). With a CPU compute stream finalize's wait blocks the host, so the
 * host stamps are complete when it returns and the pass is counted there. With a device compute
 * stream finalize only ENQUEUES the wait: nothing is read then. If the comm stream is a device
 * stream too (NCCL), each bucket is timed by two CUDA events on the comm stream (no host
 * functions in its way) and the pass by events on the compute stream; otherwise (a CPU comm
 * worker feeding a GPU) by the host stamps. Either way the pass is left pending and counted
 * once its events have completed: at the next pass, or when the stats are read
 * (mpt_ddp_get_stats), each waiting with the deadline.
 *
 * Invariants within a synchronised pass: buckets are launched in index order (next_bucket only
 * grows); a bucket is launched once, when all its parameters are ready; at finalize every
 * bucket has been launched or the pass fails before launching the rest (so a failing rank
 * issues a prefix of the collectives and the others end at their deadline or by abort); a
 * failing finalize first waits for the buckets it did launch, so no collective touches the
 * gradient buffer after it returns. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddp/ddp_stats.h"
#include "ddp/ddp_impl.h"
#include "ddp/grad_comm.h"
#include "ddp/reducer.h"

mpt_ddp_config mpt_ddp_config_default(void) {
  mpt_ddp_config c;
  c.bucket_cap_mb = 25.0;
  c.first_bucket_cap_mb = 1.0;
  c.overlap = 1;
  c.find_unused_parameters = 0;
  c.buffers = MPT_DDP_BUFFERS_BROADCAST;
  c.timeout_ms = 300000.0;
  c.grad_comm = MPT_DDP_GRAD_FP32;
  c.zero = 0;
  c.prefetch = 1;
  c.unit_buckets = 0;
  c.allreduce = MPT_DDP_ALLREDUCE_NATIVE;
  return c;
}

mpt_status mpt_ddp_buffer_mode_parse(const char *text, mpt_ddp_buffer_mode *mode) {
  if (!text || !mode) return MPT_FAIL(MPT_EINVAL, "NULL argument");
  if (strcmp(text, "broadcast") == 0)
    *mode = MPT_DDP_BUFFERS_BROADCAST;
  else if (strcmp(text, "average") == 0)
    *mode = MPT_DDP_BUFFERS_AVERAGE;
  else if (strcmp(text, "none") == 0)
    *mode = MPT_DDP_BUFFERS_NONE;
  else
    return MPT_FAIL(MPT_EINVAL, "unknown buffer mode '%s' (broadcast, average or none)", text);
  return MPT_OK;
}

/* ---- bucket plan ---- */

/* Walk parameters in reverse registration order and add each to the open bucket, which closes
 * once its size reaches its cap: first_bucket_cap_mb for the first bucket, bucket_cap_mb for
 * the rest (PyTorch's compute_bucket_assignment_by_size). A bucket therefore exceeds its cap by
 * at most its last parameter; a parameter of another dtype closes the open bucket first.
 * Buckets are contiguous because parameters are. */
static mpt_status plan_buckets(mpt_ddp *d) {
  int n = d->nparams;
  d->buckets = calloc((size_t)(n ? n : 1), sizeof *d->buckets);
  d->param_bucket = calloc((size_t)(n ? n : 1), sizeof *d->param_bucket);
  if (!d->buckets || !d->param_bucket) return MPT_FAIL(MPT_ENOMEM, "cannot plan buckets");
  double cap = d->cfg.first_bucket_cap_mb * 1048576.0;
  int b = 0, open = 0;
  mpt_dtype dtype = MPT_F32;
  double bytes = 0;
  /* One bucket per unit (ddp.h "unit_buckets"): the caps are not used; a bucket closes where
   * the next parameter (walking down) starts another unit. unit_of[p] is p's unit. */
  int *unit_of = NULL;
  if (d->cfg.unit_buckets && n > 0) {
    const int *first = NULL;
    const int nu = mpt_model_units(d->model, &first);
    if (nu < 1 || !first || !(unit_of = malloc(sizeof(int) * (size_t)n)))
      return MPT_FAIL(MPT_ENOMEM, "cannot plan buckets by unit");
    for (int u = 0, p = 0; p < n; p++) {
      while (u + 1 < nu && first[u + 1] <= p) u++;
      unit_of[p] = u;
    }
  }
  for (int p = n - 1; p >= 0; p--) {
    const mpt_param_info *info = mpt_model_param_info(d->model, p);
    double size = (double)info->count * (double)mpt_dtype_size(info->dtype);
    if (unit_of && open && unit_of[p] != unit_of[p + 1]) { /* another unit: another bucket */
      b++;
      open = 0;
    }
    if (open && info->dtype != dtype) { /* never mix dtypes in one bucket */
      b++;
      open = 0;
      cap = d->cfg.bucket_cap_mb * 1048576.0;
    }
    if (!open) {
      d->buckets[b].first_param = p;
      d->buckets[b].count = 0;
      bytes = 0;
      dtype = info->dtype;
      open = 1;
    }
    d->buckets[b].last_param = p;
    d->buckets[b].offset = info->offset;
    d->buckets[b].count += info->count;
    d->param_bucket[p] = b;
    bytes += size;
    if (!unit_of && bytes >= cap && p > 0) { /* reached the cap: close (PyTorch's rule) */
      b++;
      open = 0;
      cap = d->cfg.bucket_cap_mb * 1048576.0;
    }
  }
  d->nbuckets = n ? b + 1 : 0;
  free(unit_of);
  return MPT_OK;
}

/* ---- model signature check (F05) ---- */

static uint32_t hash_str(const char *s) {
  uint32_t h = 2166136261u; /* FNV-1a */
  for (; *s; s++) h = (h ^ (uint8_t)*s) * 16777619u;
  return h;
}

enum { SIG_FIELDS = 3 + MPT_MAX_DIMS }; /* dtype, ndim, name hash, shape */

static mpt_status verify_models(mpt_ddp *d) {
  int world = mpt_comm_world_size(d->comm), rank = mpt_comm_rank(d->comm);
  mpt_status st = MPT_OK;
  int32_t mine[2] = {d->nparams, mpt_model_num_buffers(d->model)};
  int32_t *counts = malloc(sizeof(int32_t) * 2 * (size_t)world);
  int32_t *sigs = NULL, *local = NULL;
  if (!counts) return MPT_FAIL(MPT_ENOMEM, "cannot allocate the model check");
  MPT_CHECK(mpt_comm_allgather_sync(d->comm, mine, counts, 2, MPT_I32), done);
  for (int r = 1; r < world; r++) {
    if (counts[2 * r] != counts[0] || counts[2 * r + 1] != counts[1]) {
      st = MPT_FAIL(MPT_EMISMATCH,
                    "ranks hold different models: rank %d has %d parameters and %d buffers, "
                    "rank 0 has %d and %d",
                    r, counts[2 * r], counts[2 * r + 1], counts[0], counts[1]);
      goto done;
    }
  }
  int total = d->nparams + mpt_model_num_buffers(d->model);
  if (total == 0) goto done;
  size_t len = (size_t)total * SIG_FIELDS;
  local = calloc(len, sizeof *local);
  sigs = calloc(len * (size_t)world, sizeof *sigs);
  if (!local || !sigs) {
    st = MPT_FAIL(MPT_ENOMEM, "cannot allocate the model check");
    goto done;
  }
  for (int i = 0; i < total; i++) {
    const mpt_param_info *info = i < d->nparams ? mpt_model_param_info(d->model, i)
                                                : mpt_model_buffer_info(d->model, i - d->nparams);
    int32_t *s = local + (size_t)i * SIG_FIELDS;
    s[0] = (int32_t)info->dtype;
    s[1] = info->ndim;
    s[2] = (int32_t)hash_str(info->name);
    for (int k = 0; k < info->ndim; k++) s[3 + k] = (int32_t)info->shape[k];
  }
  MPT_CHECK(mpt_comm_allgather_sync(d->comm, local, sigs, (int64_t)len, MPT_I32), done);
  for (int r = 1; r < world; r++) {
    for (int i = 0; i < total; i++) {
      const int32_t *a = sigs + (size_t)i * SIG_FIELDS;
      const int32_t *b = sigs + ((size_t)r * len) + (size_t)i * SIG_FIELDS;
      if (memcmp(a, b, SIG_FIELDS * sizeof *a) == 0) continue;
      const mpt_param_info *info = i < d->nparams
                                       ? mpt_model_param_info(d->model, i)
                                       : mpt_model_buffer_info(d->model, i - d->nparams);
      int64_t sa[MPT_MAX_DIMS], sb[MPT_MAX_DIMS];
      for (int k = 0; k < MPT_MAX_DIMS; k++) sa[k] = a[3 + k], sb[k] = b[3 + k];
      char ba[96], bb[96];
      const char *what = a[0] != b[0]   ? "dtype"
                         : a[1] != b[1] ? "rank (number of dimensions)"
                         : a[2] != b[2] ? "name"
                                        : "shape";
      st = MPT_FAIL(MPT_EMISMATCH,
                    "ranks hold different models: %s %d ('%s' on rank %d) differs in %s: "
                    "rank 0 has %s %s, rank %d has %s %s",
                    i < d->nparams ? "parameter" : "buffer",
                    i < d->nparams ? i : i - d->nparams, info->name, rank, what,
                    mpt_dtype_name((mpt_dtype)a[0]), mpt_shape_str(a[1], sa, ba, sizeof ba), r,
                    mpt_dtype_name((mpt_dtype)b[0]), mpt_shape_str(b[1], sb, bb, sizeof bb));
      goto done;
    }
  }
done:
  free(local);
  free(sigs);
  free(counts);
  return st;
}

/* ---- lifetime ---- */

/* The comm stream waits for the work enqueued so far on the compute stream (the model's
 * initialisation, the last step's BatchNorm updates and optimizer): a broadcast or all-reduce
 * of the model on the comm stream must not read or overwrite it before that work is done. */
static mpt_status order_after_compute(mpt_ddp *d) {
  if (!d->compute || !d->order_event) return MPT_OK;
  MPT_RETURN_IF(mpt_event_record(d->order_event, d->compute));
  return mpt_stream_wait_event(d->comm_stream, d->order_event, d->cfg.timeout_ms);
}

/* Chooses how passes are timed and creates the events of TIMING_EVENTS. */
static mpt_status timing_init(mpt_ddp *d) {
  const int dev_compute = d->compute && mpt_stream_device(d->compute).type != MPT_DEVICE_CPU;
  const int dev_comm = mpt_stream_device(d->comm_stream).type != MPT_DEVICE_CPU;
  d->timing = !dev_compute ? TIMING_NOW : dev_comm ? TIMING_EVENTS : TIMING_LATE;
  if (d->timing != TIMING_EVENTS) return MPT_OK;
  const size_t nb = (size_t)(d->nbuckets ? d->nbuckets : 1);
  d->start_events = calloc(nb, sizeof *d->start_events);
  d->end_events = calloc(nb, sizeof *d->end_events);
  if (!d->start_events || !d->end_events)
    return MPT_FAIL(MPT_ENOMEM, "cannot allocate the DDP engine's timing events");
  const mpt_device cd = mpt_stream_device(d->comm_stream), pd = mpt_stream_device(d->compute);
  for (int b = 0; b < d->nbuckets; b++) {
    MPT_RETURN_IF(mpt_event_init(&d->start_events[b], cd));
    MPT_RETURN_IF(mpt_event_init(&d->end_events[b], cd));
  }
  MPT_RETURN_IF(mpt_event_init(&d->pass_start, pd));
  MPT_RETURN_IF(mpt_event_init(&d->backward_end, pd));
  return mpt_event_init(&d->pass_done, pd);
}

static mpt_status hook_before_forward(void *user, mpt_tape *tape);
static mpt_status hook_before_backward(void *user, mpt_tape *tape);
static void grad_ready_hook(void *user, int param_index);
static mpt_status hook_after_backward(void *user, mpt_tape *tape, mpt_status status);
static mpt_status hook_before_zero_grad(void *user);
static mpt_status hook_before_consume(void *user);

mpt_status mpt_ddp_init(mpt_ddp **ddp, mpt_model *model, mpt_comm *comm, mpt_stream *compute,
                        const mpt_ddp_config *config) {
  mpt_status st = MPT_OK;
  if (!ddp || !model || !comm) return MPT_FAIL(MPT_EINVAL, "NULL argument to mpt_ddp_init");
  *ddp = NULL;
  mpt_ddp_config cfg = config ? *config : mpt_ddp_config_default();
  if (!(cfg.bucket_cap_mb > 0) || !(cfg.first_bucket_cap_mb > 0) || !(cfg.timeout_ms > 0))
    return MPT_FAIL(MPT_EINVAL, "bucket caps and the timeout must be positive (got %g, %g, %g)",
                    cfg.bucket_cap_mb, cfg.first_bucket_cap_mb, cfg.timeout_ms);
  if (cfg.grad_comm != MPT_DDP_GRAD_FP32 && cfg.grad_comm != MPT_DDP_GRAD_BF16)
    return MPT_FAIL(MPT_EINVAL, "unknown gradient communication %d", (int)cfg.grad_comm);
  if (cfg.grad_comm == MPT_DDP_GRAD_BF16 &&
      (mpt_model_device(model).type != MPT_DEVICE_CPU ||
       mpt_stream_device(mpt_comm_stream(comm)).type != MPT_DEVICE_CPU))
    return MPT_FAIL(MPT_ENOTSUP, "bf16 gradient communication needs the gradients in host memory "
                    "and the mpi comm backend on cpu (this model or comm is on a device)");
  if (cfg.zero < 0 || cfg.zero > 3)
    return MPT_FAIL(MPT_EINVAL, "ZeRO stage %d is not supported (0: off, 1: sharded optimizer "
                    "state, 2: and sharded gradients, 3: and sharded parameters)", cfg.zero);
  if (cfg.zero && mpt_model_device(model).type != MPT_DEVICE_CPU)
    return MPT_FAIL(MPT_ENOTSUP, "ZeRO-%d needs the model in host memory (cpu) for now",
                    cfg.zero);
  const int host = mpt_model_device(model).type == MPT_DEVICE_CPU &&
                   mpt_stream_device(mpt_comm_stream(comm)).type == MPT_DEVICE_CPU;
  if (cfg.allreduce != MPT_DDP_ALLREDUCE_NATIVE && cfg.allreduce != MPT_DDP_ALLREDUCE_RS_AG)
    return MPT_FAIL(MPT_EINVAL, "unknown all-reduce algorithm %d", (int)cfg.allreduce);
  if (cfg.allreduce == MPT_DDP_ALLREDUCE_RS_AG && !host)
    return MPT_FAIL(MPT_ENOTSUP, "the rs-ag all-reduce needs the gradients in host memory and "
                    "the mpi comm backend on cpu (this model or comm is on a device)");
  if (cfg.buffers != MPT_DDP_BUFFERS_BROADCAST && cfg.buffers != MPT_DDP_BUFFERS_AVERAGE &&
      cfg.buffers != MPT_DDP_BUFFERS_NONE)
    return MPT_FAIL(MPT_EINVAL, "buffer mode %d is not broadcast, average or none",
                    (int)cfg.buffers);
  /* Refused before any collective, so a rank that wraps twice fails alone and at once. */
  if (mpt_model_num_params(model) > 0 && !mpt_model_params(model))
    return MPT_FAIL(MPT_ESTATE, "mpt_ddp_init: the model is not finalised (mpt_model_finalize)");
  if (mpt_model_get_hooks(model))
    return MPT_FAIL(MPT_ESTATE, "mpt_ddp_init: the model is already wrapped (one DDP wrapper "
                    "per model; free the first one)");
  mpt_ddp *d = calloc(1, sizeof *d);
  if (!d) return MPT_FAIL(MPT_ENOMEM, "cannot allocate the DDP engine");
  d->model = model;
  d->comm = comm;
  d->compute = compute;
  d->comm_stream = mpt_comm_stream(comm);
  d->cfg = cfg;
  d->sync = 1;
  d->nparams = mpt_model_num_params(model);
  d->params = mpt_model_params(model);
  d->grads = mpt_model_grads(model);
  if (cfg.zero == 3) d->cfg.unit_buckets = 1; /* ZeRO-3 gathers and reduces unit by unit */
  d->cfg.unit_buckets = d->cfg.unit_buckets != 0;
  d->rsag = !cfg.zero && mpt_comm_world_size(comm) > 1 &&
            cfg.allreduce == MPT_DDP_ALLREDUCE_RS_AG;
  MPT_CHECK(plan_buckets(d), fail);
  size_t nb = (size_t)(d->nbuckets ? d->nbuckets : 1);
  d->bucket_params = calloc(nb, sizeof *d->bucket_params);
  d->bucket_pending = calloc(nb, sizeof *d->bucket_pending);
  d->param_ready = calloc((size_t)(d->nparams ? d->nparams : 1), 1);
  d->args = calloc(nb, sizeof *d->args);
  d->ready_events = calloc(nb, sizeof *d->ready_events);
  d->bucket_start_ms = calloc(nb, sizeof(double));
  d->bucket_end_ms = calloc(nb, sizeof(double));
  if (!d->bucket_params || !d->bucket_pending || !d->param_ready || !d->args ||
      !d->ready_events || !d->bucket_start_ms || !d->bucket_end_ms) {
    st = MPT_FAIL(MPT_ENOMEM, "cannot allocate the DDP engine");
    goto fail;
  }
  if (cfg.grad_comm == MPT_DDP_GRAD_BF16) {
    int64_t n = mpt_model_param_count(model);
    if (!(d->wire = malloc(sizeof(uint16_t) * (size_t)(n ? n : 1)))) {
      st = MPT_FAIL(MPT_ENOMEM, "cannot allocate the bf16 gradient buffers (%" PRId64 " elements)",
                    n);
      goto fail;
    }
  }
  if (cfg.zero) MPT_CHECK(mpt__ddp_zero_init(d), fail);
  if (cfg.zero == 3) MPT_CHECK(mpt__ddp_z3_init(d), fail);
  d->reducer = mpt__ddp_reducer_choose(d);
  mpt_device dev = mpt_model_device(model);
  for (int b = 0; b < d->nbuckets; b++) {
    d->args[b] = (bucket_arg){d, b};
    d->bucket_params[b] = d->buckets[b].first_param - d->buckets[b].last_param + 1;
    MPT_CHECK(mpt_event_init(&d->ready_events[b], dev), fail);
  }
  MPT_CHECK(mpt_event_init(&d->done_event, mpt_stream_device(d->comm_stream)), fail);
  MPT_CHECK(timing_init(d), fail);
  if (d->compute) MPT_CHECK(mpt_event_init(&d->order_event, mpt_stream_device(d->compute)), fail);
  MPT_CHECK(verify_models(d), fail);
  /* A model whose initialisation was deferred (nn.h): ZeRO-3 initialises it unit by unit,
   * keeping its shard (below); otherwise it is initialised whole here. */
  const int by_unit = d->z3 && mpt_model_init_pending(model);
  if (d->z3) { /* every rank's model deferred, or none: else the collectives would not pair */
    int32_t mine = by_unit, lo = 0, hi = 0;
    MPT_CHECK(mpt_comm_allreduce_sync(comm, &mine, &lo, 1, MPT_I32, MPT_REDUCE_MIN), fail);
    MPT_CHECK(mpt_comm_allreduce_sync(comm, &mine, &hi, 1, MPT_I32, MPT_REDUCE_MAX), fail);
    if (lo != hi) {
      st = MPT_FAIL(MPT_EMISMATCH, "ranks hold different models: the initialisation of rank "
                    "%d's is %s, another rank's %s (build every rank's model alike)",
                    mpt_comm_rank(comm), by_unit ? "deferred" : "done",
                    by_unit ? "done" : "deferred");
      goto fail;
    }
  }
  for (int u = 0; !by_unit && mpt_model_init_pending(model) && u < mpt_model_units(model, NULL);
       u++)
    MPT_CHECK(mpt_model_init_unit(model, u), fail);
  /* Start bit-identical: rank 0's parameters and buffers everywhere. */
  if (by_unit) {
    MPT_CHECK(mpt__ddp_z3_init_by_unit(d), fail);
    MPT_CHECK(mpt_comm_broadcast_sync(comm, mpt_model_buffers(model),
                                      mpt_model_buffer_count(model), MPT_F32, 0),
              fail);
  } else if (mpt_comm_world_size(comm) > 1) {
    MPT_CHECK(order_after_compute(d), fail);
    MPT_CHECK(mpt_comm_broadcast_sync(comm, mpt_model_params(model),
                                      mpt_model_param_count(model), MPT_F32, 0),
              fail);
    MPT_CHECK(mpt_comm_broadcast_sync(comm, mpt_model_buffers(model),
                                      mpt_model_buffer_count(model), MPT_F32, 0),
              fail);
  }
  d->generation = mpt_model_generation(model);
  const mpt_model_hooks hooks = {.user = d,
                                 .before_forward = hook_before_forward,
                                 .before_backward = hook_before_backward,
                                 .grad_ready = grad_ready_hook,
                                 .after_backward = hook_after_backward,
                                 .before_zero_grad = hook_before_zero_grad,
                                 .before_consume = hook_before_consume,
                                 .zero_grads = cfg.zero >= 2 ? mpt__ddp_zero_grads : NULL,
                                 .param_needed = d->z3 ? mpt__ddp_z3_param_needed : NULL};
  MPT_CHECK(mpt_model_set_hooks(model, &hooks), fail);
  *ddp = d;
  return MPT_OK;
fail:
  mpt_ddp_free(d);
  return st;
}

void mpt_ddp_free(mpt_ddp *d) {
  if (!d) return;
  const mpt_model_hooks *h = mpt_model_get_hooks(d->model);
  if (h && h->user == d) mpt_model_set_hooks(d->model, NULL);
  if (d->prepared && d->comm_stream) mpt_stream_synchronize(d->comm_stream, d->cfg.timeout_ms);
  for (int b = 0; d->ready_events && b < d->nbuckets; b++) mpt_event_free(d->ready_events[b]);
  mpt_event_free(d->done_event);
  mpt_event_free(d->order_event);
  for (int b = 0; d->start_events && b < d->nbuckets; b++) mpt_event_free(d->start_events[b]);
  for (int b = 0; d->end_events && b < d->nbuckets; b++) mpt_event_free(d->end_events[b]);
  free(d->start_events);
  free(d->end_events);
  mpt_event_free(d->pass_start);
  mpt_event_free(d->backward_end);
  mpt_event_free(d->pass_done);
  free(d->ready_events);
  free(d->args);
  free(d->param_ready);
  free(d->bucket_pending);
  free(d->bucket_params);
  free(d->param_bucket);
  free(d->buckets);
  free(d->bucket_start_ms);
  free(d->bucket_end_ms);
  free(d->wire);
  free(d->shard);
  free(d->bucket_shard);
  mpt__ddp_z3_free(d);
  free(d->gathered);
  free(d->param_unit);
  free(d->unit_first);
  free(d);
}

int mpt_ddp_num_buckets(const mpt_ddp *d) { return d->nbuckets; }

const mpt_ddp_bucket_info *mpt_ddp_bucket(const mpt_ddp *d, int index) {
  return index >= 0 && index < d->nbuckets ? &d->buckets[index] : NULL;
}

int mpt_ddp_param_bucket(const mpt_ddp *d, int param) {
  return param >= 0 && param < d->nparams ? d->param_bucket[param] : -1;
}

void mpt_ddp_set_sync(mpt_ddp *d, int sync) { d->sync = sync != 0; }

void mpt_ddp_set_trace(mpt_ddp *d, mpt_trace *trace) { d->trace = trace; }

/* ---- buffers, uneven inputs ---- */

mpt_status mpt_ddp_sync_buffers(mpt_ddp *d) {
  int64_t count = mpt_model_buffer_count(d->model);
  if (count == 0 || mpt_comm_world_size(d->comm) == 1) return MPT_OK;
  float *buf = mpt_model_buffers(d->model);
  if (d->cfg.buffers != MPT_DDP_BUFFERS_NONE) MPT_RETURN_IF(order_after_compute(d));
  switch (d->cfg.buffers) {
    case MPT_DDP_BUFFERS_BROADCAST:
      return mpt_comm_broadcast_sync(d->comm, buf, count, MPT_F32, 0);
    case MPT_DDP_BUFFERS_AVERAGE:
      return mpt_comm_allreduce_sync(d->comm, buf, buf, count, MPT_F32, MPT_REDUCE_AVG);
    case MPT_DDP_BUFFERS_NONE:
      break;
  }
  return MPT_OK;
}

mpt_status mpt_ddp_check_batches(mpt_ddp *d, int64_t local_batches) {
  if (!d) return MPT_FAIL(MPT_EINVAL, "mpt_ddp_check_batches: NULL DDP engine");
  int world = mpt_comm_world_size(d->comm);
  if (local_batches < 0 || local_batches > INT32_MAX)
    return MPT_FAIL(MPT_EINVAL, "batch count %" PRId64 " out of range", local_batches);
  int32_t mine = (int32_t)local_batches;
  int32_t *all = malloc(sizeof(int32_t) * (size_t)world);
  if (!all) return MPT_FAIL(MPT_ENOMEM, "cannot allocate the batch check");
  mpt_status st = mpt_comm_allgather_sync(d->comm, &mine, all, 1, MPT_I32);
  if (st == MPT_OK) {
    int32_t most = all[0];
    for (int r = 1; r < world; r++)
      if (all[r] > most) most = all[r];
    char ranks[512] = "";
    size_t used = 0;
    int short_ranks = 0;
    for (int r = 0; r < world; r++) {
      if (all[r] == most) continue;
      if (used < sizeof ranks)
        used += (size_t)snprintf(ranks + used, sizeof ranks - used, "%s%d (%d batches)",
                                 short_ranks ? ", " : "", r, all[r]);
      short_ranks++;
    }
    if (short_ranks)
      st = MPT_FAIL(MPT_EMISMATCH,
                    "uneven inputs: ranks %s would run out before the others (%d batches); "
                    "use the DistributedSampler (equal shards), or drop_last (mpitrain: "
                    "--drop-last)",
                    ranks, most);
  }
  free(all);
  return st;
}

/* ---- backward hooks and bucket launches ---- */

static mpt_status stamp_start(void *arg) {
  bucket_arg *a = arg;
  a->ddp->bucket_start_ms[a->bucket] = mpt_time_ms();
  return MPT_OK;
}

static mpt_status stamp_end(void *arg) {
  bucket_arg *a = arg;
  mpt_ddp *d = a->ddp;
  d->bucket_end_ms[a->bucket] = mpt_time_ms();
  if (d->trace)
    mpt_trace_add(d->trace, "allreduce", 1, d->bucket_start_ms[a->bucket],
                  d->bucket_end_ms[a->bucket] - d->bucket_start_ms[a->bucket], a->bucket);
  return MPT_OK;
}

/* Compute stream -> event -> comm stream waits -> all-reduce (average) of the bucket's slice. */
static mpt_status launch_bucket(mpt_ddp *d, int b) {
  char purpose[MPT_COMM_PURPOSE_MAX];
  snprintf(purpose, sizeof purpose, "grad bucket %d", b % 1000000); /* the flight recorder's tag */
  MPT_RETURN_IF(mpt_comm_set_purpose(d->comm, purpose));
  if (d->compute) { /* a NULL compute stream is the CPU inline: everything before has run */
    MPT_RETURN_IF(mpt_event_record(d->ready_events[b], d->compute));
    MPT_RETURN_IF(mpt_stream_wait_event(d->comm_stream, d->ready_events[b], d->cfg.timeout_ms));
  }
  if (d->timing == TIMING_EVENTS)
    MPT_RETURN_IF(mpt_event_record(d->start_events[b], d->comm_stream));
  else
    MPT_RETURN_IF(mpt_stream_launch_host(d->comm_stream, stamp_start, &d->args[b]));
  d->sent_bytes += d->reducer->bytes(d, b);
  MPT_RETURN_IF(d->reducer->launch(d, b));
  if (d->z3) MPT_RETURN_IF(mpt__ddp_z3_release(d, b)); /* its parameters' last use is done */
  if (d->timing == TIMING_EVENTS) return mpt_event_record(d->end_events[b], d->comm_stream);
  return mpt_stream_launch_host(d->comm_stream, stamp_end, &d->args[b]);
}

static void launch_ready_buckets(mpt_ddp *d) {
  while (d->hook_error == MPT_OK && d->next_bucket < d->nbuckets &&
         d->bucket_pending[d->next_bucket] == 0) {
    d->hook_error = launch_bucket(d, d->next_bucket);
    d->next_bucket++;
  }
}

static void mark_ready(mpt_ddp *d, int param) {
  if (d->param_ready[param]) return;
  d->param_ready[param] = 1;
  d->bucket_pending[d->param_bucket[param]]--;
  if (d->cfg.overlap) launch_ready_buckets(d);
}

static void grad_ready_hook(void *user, int param_index) {
  mpt_ddp *d = user;
  if (d->prepared && param_index >= 0 && param_index < d->nparams) mark_ready(d, param_index);
}

/* Counts the pending pass, once its timings exist (waits for them, with the deadline): bucket
 * times from the events or host stamps, relative to the pass's start. */
static mpt_status collect_stats(mpt_ddp *d) {
  if (!d->stats_pending) return MPT_OK;
  d->stats_pending = 0;
  double *s = d->bucket_start_ms, *e = d->bucket_end_ms, bwd = 0, done = 0;
  if (d->timing == TIMING_EVENTS) {
    MPT_RETURN_IF(mpt_event_synchronize(d->pass_done, d->cfg.timeout_ms));
    for (int b = 0; b < d->nbuckets; b++) {
      MPT_RETURN_IF(mpt_event_elapsed_ms(d->pass_start, d->start_events[b], &s[b]));
      MPT_RETURN_IF(mpt_event_elapsed_ms(d->pass_start, d->end_events[b], &e[b]));
      if (d->trace)
        mpt_trace_add(d->trace, "allreduce", 1, d->prepare_ms + s[b], e[b] - s[b], b);
    }
    if (d->pass_backward)
      MPT_RETURN_IF(mpt_event_elapsed_ms(d->pass_start, d->backward_end, &bwd));
    MPT_RETURN_IF(mpt_event_elapsed_ms(d->pass_start, d->pass_done, &done));
  } else { /* the host stamps, written on the comm worker before done_event completes */
    MPT_RETURN_IF(mpt_event_synchronize(d->done_event, d->cfg.timeout_ms));
    if (d->pass_backward) bwd = d->backward_end_ms - d->prepare_ms;
    done = d->timing == TIMING_NOW ? d->done_ms - d->prepare_ms : bwd; /* LATE: last bucket */
    for (int b = 0; b < d->nbuckets; b++) {
      s[b] -= d->prepare_ms;
      e[b] -= d->prepare_ms;
      if (d->timing == TIMING_LATE && e[b] > done) done = e[b];
    }
  }
  return mpt__ddp_stats_add(&d->stats, d->nbuckets, s, e, bwd, done);
}

/* The start of a pass: the pending one counted, the clocks started. */
static mpt_status pass_begin(mpt_ddp *d) {
  MPT_RETURN_IF(collect_stats(d));
  d->prepare_ms = mpt_time_ms();
  if (d->timing == TIMING_EVENTS) return mpt_event_record(d->pass_start, d->compute);
  return MPT_OK;
}

/* After the compute stream's wait for the last bucket: counts the pass now (the host waited:
 * every stamp is written) or leaves it pending until its timings exist. */
static mpt_status pass_end(mpt_ddp *d, int backward) {
  d->pass_backward = backward;
  if (d->timing == TIMING_EVENTS) MPT_RETURN_IF(mpt_event_record(d->pass_done, d->compute));
  d->done_ms = mpt_time_ms();
  d->stats_pending = 1;
  return d->timing == TIMING_NOW ? collect_stats(d) : MPT_OK;
}

static mpt_status prepare_backward(mpt_ddp *d, mpt_tape *tape) {
  MPT_RETURN_IF(pass_begin(d));
  if (!d->sync) {
    d->prepared = 0;
    return MPT_OK;
  }
  memset(d->param_ready, 0, (size_t)d->nparams);
  for (int b = 0; b < d->nbuckets; b++) {
    d->bucket_pending[b] = d->bucket_params[b];
    d->bucket_start_ms[b] = d->bucket_end_ms[b] = 0;
  }
  d->next_bucket = 0;
  d->hook_error = MPT_OK;
  d->prepared = 1;
  if (d->cfg.find_unused_parameters)
    for (int p = d->nparams - 1; p >= 0; p--)
      if (mpt_tape_param_uses(tape, p) == 0) mark_ready(d, p);
  return d->hook_error;
}

/* Names the parameters that got no gradient (F04). */
static mpt_status unused_error(mpt_ddp *d) {
  char names[768] = "";
  size_t used = 0;
  int n = 0;
  for (int p = 0; p < d->nparams; p++) {
    if (d->param_ready[p]) continue;
    if (used < sizeof names - 1)
      used += (size_t)snprintf(names + used, sizeof names - used, "%s%s", n ? ", " : "",
                               mpt_model_param_info(d->model, p)->name);
    n++;
  }
  return MPT_FAIL(MPT_EUNUSED,
                  "%d parameter%s received no gradient in this backward pass: %s. The forward "
                  "did not use them; set mpt_ddp_config.find_unused_parameters (mpitrain: "
                  "--find-unused-parameters) to treat them as zero gradients, or remove them "
                  "from the model",
                  n, n == 1 ? "" : "s", names);
}

/* Makes the compute stream wait for the last launched bucket. A CPU compute stream runs on this
 * thread, so the host waits, with the comm's deadline (a timeout names the collective, its
 * sequence number and the rank); a device stream waits on the device, without blocking. */
static mpt_status wait_done(mpt_ddp *d) {
  if (d->compute && mpt_stream_device(d->compute).type != MPT_DEVICE_CPU)
    return mpt_stream_wait_event(d->compute, d->done_event, d->cfg.timeout_ms);
  return mpt_comm_wait_event(d->comm, d->done_event);
}

/* On an error path of finalize: waits (deadline) for the buckets this pass already launched,
 * so that no collective still writes into the gradient buffer once finalize has returned (the
 * caller may free the model next). Keeps the detail of `status` when it is an error; returns
 * `status`, or the wait's error when `status` is MPT_OK. */
static mpt_status drain_launched(mpt_ddp *d, mpt_status status) {
  if (d->next_bucket == 0) return status;
  char detail[1024];
  snprintf(detail, sizeof detail, "%s", mpt_last_error());
  mpt_status st = mpt_event_record(d->done_event, d->comm_stream);
  if (st == MPT_OK) st = mpt_comm_wait_event(d->comm, d->done_event);
  if (status == MPT_OK) return st;
  return mpt_error_set(status, "%s", detail);
}

static mpt_status finalize(mpt_ddp *d) {
  /* The pass is synchronised if prepare_backward made it so (d->prepared), whatever
   * mpt_ddp_set_sync said since: its buckets may be in flight already. */
  if (!d->prepared) return MPT_OK;
  d->prepared = 0;
  d->backward_end_ms = mpt_time_ms();
  if (d->timing == TIMING_EVENTS)
    MPT_RETURN_IF(mpt_event_record(d->backward_end, d->compute));
  if (d->hook_error != MPT_OK) return drain_launched(d, d->hook_error);
  for (int p = 0; p < d->nparams; p++)
    if (!d->param_ready[p]) {
      drain_launched(d, MPT_OK);
      return unused_error(d);
    }
  launch_ready_buckets(d); /* with overlap off: all of them, now */
  if (d->hook_error != MPT_OK) return drain_launched(d, d->hook_error);
  MPT_RETURN_IF(mpt_event_record(d->done_event, d->comm_stream));
  /* The compute stream waits for the last bucket (on the CPU this blocks the caller). */
  MPT_RETURN_IF(wait_done(d));
  return pass_end(d, 1);
}

mpt_status mpt_ddp_allreduce_grads(mpt_ddp *d) {
  if (!d) return MPT_FAIL(MPT_EINVAL, "NULL DDP engine");
  if (d->prepared)
    return MPT_FAIL(MPT_ESTATE, "mpt_ddp_allreduce_grads during a backward pass");
  MPT_RETURN_IF(pass_begin(d));
  d->next_bucket = 0;
  d->hook_error = MPT_OK;
  for (int b = 0; b < d->nbuckets; b++) {
    d->bucket_start_ms[b] = d->bucket_end_ms[b] = 0;
    d->bucket_pending[b] = 0;
  }
  launch_ready_buckets(d); /* every bucket, in index order */
  if (d->hook_error != MPT_OK) return drain_launched(d, d->hook_error);
  MPT_RETURN_IF(mpt_event_record(d->done_event, d->comm_stream));
  MPT_RETURN_IF(wait_done(d));
  MPT_RETURN_IF(pass_end(d, 0));
  d->synced = 1;
  return MPT_OK;
}

mpt_ddp_stats mpt_ddp_get_stats(mpt_ddp *d) {
  if (collect_stats(d) != MPT_OK) /* the pass's timings never came: not counted */
    mpt_log(MPT_LOG_WARN, "DDP statistics of the last pass dropped: %s", mpt_last_error());
  return d->stats;
}

void mpt_ddp_reset_stats(mpt_ddp *d) {
  d->stats_pending = 0; /* a pending pass belongs to before the reset */
  memset(&d->stats, 0, sizeof d->stats);
}

/* ---- the hooks on the model (installed by mpt_ddp_init) ---- */

/* After a backward failed on this rank, its collectives no longer match the other ranks': a
 * further pass would pair this rank's all-reduces with the others' of another step. */
static mpt_status refuse_if_failed(const mpt_ddp *d) {
  if (d->failed == MPT_OK) return MPT_OK;
  return MPT_FAIL(MPT_ESTATE, "DDP: a backward failed earlier on rank %d (%s: %s); this rank's "
                  "collectives no longer line up with the other ranks': end the job "
                  "(mpt_comm_abort), or free the DDP and wrap the model again on every rank",
                  mpt_comm_rank(d->comm), mpt_status_name(d->failed), d->failed_detail);
}

/* Before a training forward: refuse misuse, then synchronise the buffers (collective). */
static mpt_status hook_before_forward(void *user, mpt_tape *tape) {
  mpt_ddp *d = user;
  (void)tape;
  MPT_RETURN_IF(refuse_if_failed(d));
  if (d->forward_open)
    return MPT_FAIL(MPT_ESTATE, "DDP: a second training forward before the backward of the "
                    "first (each forward needs its backward; for several micro-batches per step "
                    "use mpt_ddp_set_sync(ddp, 0) and run forward + backward for each)");
  if (mpt_model_generation(d->model) != d->generation || mpt_model_params(d->model) != d->params ||
      mpt_model_grads(d->model) != d->grads || mpt_model_num_params(d->model) != d->nparams)
    return MPT_FAIL(MPT_ESTATE, "DDP: the model was changed after mpt_ddp_init on rank %d "
                    "(parameters re-initialised or the forward function replaced): replicas "
                    "would no longer match; finish the model (and load its weights) before "
                    "wrapping it", mpt_comm_rank(d->comm));
  MPT_RETURN_IF(mpt_ddp_sync_buffers(d));
  d->forward_open = 1;
  return MPT_OK;
}

static mpt_status hook_before_backward(void *user, mpt_tape *tape) {
  mpt_ddp *d = user;
  MPT_RETURN_IF(refuse_if_failed(d));
  if (!d->forward_open)
    return MPT_FAIL(MPT_ESTATE, "DDP: backward without a training forward through "
                    "mpt_model_forward (or a second backward for one forward): the pass was "
                    "not seen by DDP");
  d->forward_open = 0;
  d->in_backward = 1;
  d->bwd_unit = -1;
  return prepare_backward(d, tape);
}

/* After backward: launch what is left, wait (deadline) for every bucket, check for unused
 * parameters. When backward failed, wait for the buckets already launched and keep its error. */
static mpt_status hook_after_backward(void *user, mpt_tape *tape, mpt_status status) {
  mpt_ddp *d = user;
  (void)tape;
  d->synced = 0;
  d->in_backward = 0;
  if (status == MPT_OK) {
    const int syncing = d->prepared;
    status = finalize(d);
    if (status == MPT_OK) {
      d->synced = syncing;
      return MPT_OK;
    }
  } else if (d->prepared) {
    d->prepared = 0;
    status = drain_launched(d, status);
  }
  d->failed = status;
  snprintf(d->failed_detail, sizeof d->failed_detail, "%s", mpt_last_error());
  return status;
}

static mpt_status hook_before_zero_grad(void *user) {
  mpt_ddp *d = user;
  if (d->synced && mpt_model_grads_state(d->model) == MPT_GRADS_READY)
    return MPT_FAIL(MPT_ESTATE, "DDP: zero_grad over averaged gradients that no optimizer step "
                    "used (call mpt_optimizer_step_model after backward; to skip a step on "
                    "purpose, say so with mpt_model_consume_grads)");
  d->synced = 0;
  d->forward_open = 0; /* a new step: a forward whose backward never came is forgotten */
  return MPT_OK;
}

/* Before an optimizer step (or a deliberate skip) uses the gradients: they must be averaged. */
static mpt_status hook_before_consume(void *user) {
  mpt_ddp *d = user;
  if (d->synced) return MPT_OK;
  return MPT_FAIL(MPT_ESTATE, "DDP: an optimizer step on gradients that were not averaged over "
                  "the ranks on rank %d (the last backward ran under no_sync, i.e. "
                  "mpt_ddp_set_sync(ddp, 0); or DataParallel's gradients were not all-reduced "
                  "with mpt_ddp_allreduce_grads): the replicas would diverge",
                  mpt_comm_rank(d->comm));
}
