/* The NCCL comm backend (comm.h "Devices"), part 2: the collectives and the waits. Part 1
 * (errors, failure checks, watchdog, bootstrap, lifetime) is comm_nccl.c.
 *
 * A collective is one NCCL call on the caller's CUDA stream of the comm's device (the comm's own
 * stream when none is given), polled to completion of its enqueue (non-blocking communicator),
 * then tracked: a CUDA event is recorded after it in the ring (comm_nccl_impl.h). Checked mode
 * first all-gathers the signatures over MPI on the caller's thread.
 *
 * Host buffers. NCCL moves device memory only, but setup code hands small host buffers to every
 * comm (the DDP engine's model and batch checks all-gather a few ints): when a send or receive
 * buffer is not device memory (cudaPointerGetAttributes), the collective is staged through a
 * device scratch buffer of the comm through a pinned bounce buffer (host copy into the bounce,
 * copy in, the NCCL call on the scratch, copy out into the bounce, all on the stream, none of
 * them waiting for the device) and the call BLOCKS until the result is in the host buffer,
 * waiting WITHOUT the lock, with the comm's deadline and its failure checks (host_stage.c): a
 * pageable copy out would block under the lock until the collective ends, so neither the
 * deadline nor the watchdog could act. Meant for control messages of a few bytes; bulk data
 * should live on the device.
 *
 * Threads: the caller's; every NCCL call under s->mutex; one host collective at a time under
 * s->host_mutex (taken before s->mutex), which owns the scratch and the bounce buffer. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_nccl_impl.h"
#include "core/cuda/cuda.h"
#include "core/cuda/kernels.h"

enum { SIG_LEN = 5 };


static ncclDataType_t nccl_dtype(mpt_dtype d) {
  return d == MPT_F32    ? ncclFloat32
         : d == MPT_I32  ? ncclInt32
         : d == MPT_BF16 ? ncclBfloat16
                         : ncclUint8;
}

static ncclRedOp_t nccl_op(int op) {
  switch (op) {
    case MPT_REDUCE_AVG:
      return ncclAvg;
    case MPT_REDUCE_MIN:
      return ncclMin;
    case MPT_REDUCE_MAX:
      return ncclMax;
    default:
      return ncclSum;
  }
}

/* Checked mode: every rank's signature, all-gathered over MPI on the caller's thread with the
 * collective's deadline. A mismatch is returned on every rank with the same words. */
static mpt_status check_signature(mpt__nccl_state *s, const mpt__coll *c, double deadline_ms) {
  mpt_comm *comm = s->comm;
  int64_t mine[SIG_LEN] = {c->kind, c->count, c->dtype, c->arg, (int64_t)c->seq};
  int64_t *all = malloc(sizeof(int64_t) * SIG_LEN * (size_t)comm->world_size);
  if (!all) return MPT_FAIL(MPT_ENOMEM, "cannot allocate the signature table of checked mode");
  MPI_Request req;
  int done = 0;
  int rc = MPI_Iallgather(mine, SIG_LEN, MPI_INT64_T, all, SIG_LEN, MPI_INT64_T, comm->mpi_comm,
                          &req);
  if (rc == MPI_SUCCESS) rc = mpt__mpi_wait_until(&req, deadline_ms, &done);
  mpt_status st = MPT_OK;
  char a[160], b[160];
  if (rc != MPI_SUCCESS) {
    st = MPT_MPI_FAIL(rc, comm->rank, "MPI_Iallgather of the signature of %s (checked mode)",
                      mpt__coll_describe(c, a, sizeof a));
  } else if (!done) {
    st = mpt__coll_timeout_error(comm, c, "checked mode: the signature exchange before ");
  } else {
    for (int q = 1; q < comm->world_size && st == MPT_OK; q++) {
      const int64_t *x = all, *y = all + (size_t)q * SIG_LEN;
      if (memcmp(x, y, sizeof(int64_t) * SIG_LEN) == 0) continue;
      mpt__coll cx = {(mpt__coll_kind)x[0], (uint64_t)x[4], NULL, NULL, x[1], (mpt_dtype)x[2],
                      (int)x[3], -1, {0}};
      mpt__coll cy = {(mpt__coll_kind)y[0], (uint64_t)y[4], NULL, NULL, y[1], (mpt_dtype)y[2],
                      (int)y[3], -1, {0}};
      st = MPT_FAIL(MPT_EMISMATCH, "collectives disagree across ranks (checked mode, NCCL): rank "
                    "0 issues %s, rank %d issues %s", mpt__coll_describe(&cx, a, sizeof a), q,
                    mpt__coll_describe(&cy, b, sizeof b));
    }
  }
  free(all);
  return st;
}

/* 1 when p is device (or managed) memory; host memory (pageable, pinned, registered) is 0. */
static int on_device(const void *p) {
  struct cudaPointerAttributes a;
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError(); /* older drivers: an unregistered host pointer is an error */
    return 0;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

/* The sharded collectives (comm.h) as one NCCL group of one rooted call per shard: ncclReduce
 * into the owner's shard (reduce-scatter; in place when recv is the owner's shard of send) or
 * ncclBroadcast of the owner's shard (all-gather of shards), so shards of unequal length need no
 * padding (ncclReduceScatter / ncclAllGather take equal blocks). Device buffers only. */
static ncclResult_t sharded_locked(mpt__nccl_state *s, const mpt__coll *c, const void *send,
                                   void *recv, cudaStream_t cs) {
  const int world = s->comm->world_size, me = s->comm->rank;
  const size_t es = mpt_dtype_size(c->dtype);
  ncclResult_t r = ncclGroupStart();
  for (int q = 0; q < world && r == ncclSuccess; q++) {
    int64_t off, n;
    mpt_comm_shard(c->count, world, q, &off, &n);
    if (n == 0) continue;
    char *at = (char *)send + (size_t)off * es;
    if (c->kind == MPT__COLL_ALLGATHER_SHARDS)
      r = ncclBroadcast(at, at, (size_t)n, nccl_dtype(c->dtype), q, s->nc, cs);
    else
      r = ncclReduce(at, q == me ? recv : NULL, (size_t)n, nccl_dtype(c->dtype), nccl_op(c->arg),
                     q, s->nc, cs);
  }
  ncclResult_t e = ncclGroupEnd();
  return r != ncclSuccess ? r : e;
}

/* Locked: the outcome of NCCL call(s) that returned `r`, polled until enqueued; on failure the
 * communicator is aborted (the comm failed) and the detail recorded. */
static mpt_status settle_locked(mpt__nccl_state *s, const mpt__coll *c, ncclResult_t r,
                                double deadline_ms) {
  mpt_comm *comm = s->comm;
  int expired = 0;
  r = mpt__nccl_settle(s->nc, r, deadline_ms, &expired);
  char what[160];
  mpt__coll_describe(c, what, sizeof what);
  if (expired)
    return mpt__nccl_fail_locked(s, MPT_FAIL(MPT_ETIMEOUT, "enqueueing %s did not complete "
                                 "within %g s on rank %d (NCCL on cuda:%d: connecting to a "
                                 "peer?); the NCCL communicator was aborted", what,
                                 comm->config.timeout_ms / 1000.0, comm->rank, s->dev));
  if (r != ncclSuccess) return mpt__nccl_fail_locked(s, MPT_NCCL_ERROR(s, r, "%s", what));
  return MPT_OK;
}

/* The bfloat16 reduction rounded once (comm.h "bfloat16"), as comm_mpi.c's run_bf16_reduce:
 * in rounds of at most BF16_PIECE elements per rank, one NCCL group of ncclSend / ncclRecv
 * sends each shard's owner (mpt_comm_shard) its piece of `send` in bfloat16 and receives the
 * W pieces of this rank's shard into a stream-ordered temporary (cudaMallocAsync, W x piece
 * elements), then k_bf16_sum_pieces widens them, adds them in float32 in rank order, divides
 * by W for AVG and rounds once into `out` (this rank's shard: in place when out is its shard
 * of send). Bytes on the wire: (W-1)/W of the buffer per rank, a ring reduce-scatter's. */
enum { BF16_PIECE = 1 << 19 };

static mpt_status bf16_reduce_locked(mpt__nccl_state *s, const mpt__coll *c, const void *sendv,
                                     void *outv, cudaStream_t cs, double deadline_ms) {
  const int world = s->comm->world_size, me = s->comm->rank;
  const uint16_t *send = sendv;
  uint16_t *out = outv;
  int64_t my_off, my_n, longest, s_off, s_n;
  mpt_comm_shard(c->count, world, me, &my_off, &my_n);
  mpt_comm_shard(c->count, world, 0, &s_off, &longest);
  int64_t piece = BF16_PIECE / world > 0 ? BF16_PIECE / world : 1;
  if (piece > longest) piece = longest > 0 ? longest : 1;
  uint16_t *got = NULL;
  cudaError_t e = cudaMallocAsync((void **)&got, sizeof(uint16_t) * (size_t)world *
                                  (size_t)piece, cs);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return MPT_FAIL(MPT_ENOMEM, "the bfloat16 reduction's %lld-element temporary on cuda:%d: %s",
                    (long long)world * (long long)piece, s->dev, cudaGetErrorString(e));
  }
  mpt_status st = MPT_OK;
  const int avg = c->arg == MPT_REDUCE_AVG;
  for (int64_t off = 0; off < longest && st == MPT_OK; off += piece) {
    const int64_t m = my_n - off < piece ? (my_n - off > 0 ? my_n - off : 0) : piece;
    ncclResult_t r = ncclGroupStart();
    for (int q = 0; q < world && r == ncclSuccess; q++) {
      mpt_comm_shard(c->count, world, q, &s_off, &s_n);
      const int64_t k = s_n - off < piece ? (s_n - off > 0 ? s_n - off : 0) : piece;
      if (k > 0) r = ncclSend(send + s_off + off, (size_t)k, ncclBfloat16, q, s->nc, cs);
      if (r == ncclSuccess && m > 0)
        r = ncclRecv(got + (size_t)q * (size_t)piece, (size_t)m, ncclBfloat16, q, s->nc, cs);
    }
    const ncclResult_t g = ncclGroupEnd();
    st = settle_locked(s, c, r != ncclSuccess ? r : g, deadline_ms);
    if (st == MPT_OK && m > 0 &&
        (e = mpt__cuk_bf16_sum_pieces(cs, got, world, piece, m, avg, out + off)) != cudaSuccess) {
      (void)cudaGetLastError();
      st = MPT_FAIL(MPT_EDEVICE, "the bfloat16 reduction's sum on cuda:%d: %s", s->dev,
                    cudaGetErrorString(e));
    }
  }
  if ((e = cudaFreeAsync(got, cs)) != cudaSuccess) {
    (void)cudaGetLastError();
    if (st == MPT_OK)
      st = MPT_FAIL(MPT_EDEVICE, "freeing the bfloat16 reduction's temporary on cuda:%d: %s",
                    s->dev, cudaGetErrorString(e));
  }
  return st;
}

/* Locked: a bfloat16 all-reduce or reduce-scatter rounded once: the reduction above into this
 * rank's shard (of recv for the reduce-scatter, at its place in recv for the all-reduce), then
 * for the all-reduce the all-gather of the shards in recv. */
static mpt_status bf16_locked(mpt__nccl_state *s, const mpt__coll *c, const void *send,
                              void *recv, cudaStream_t cs, double deadline_ms) {
  int64_t off, n;
  mpt_comm_shard(c->count, s->comm->world_size, s->comm->rank, &off, &n);
  if (c->kind == MPT__COLL_REDUCE_SCATTER)
    return bf16_reduce_locked(s, c, send, recv, cs, deadline_ms);
  MPT_RETURN_IF(bf16_reduce_locked(s, c, send, (uint16_t *)recv + off, cs, deadline_ms));
  mpt__coll g = *c;
  g.kind = MPT__COLL_ALLGATHER_SHARDS;
  return settle_locked(s, c, sharded_locked(s, &g, recv, recv, cs), deadline_ms);
}

/* Locked: the NCCL call of `c` on the given buffers, polled until enqueued. On failure the
 * communicator is aborted (the comm failed) and the detail recorded. */
static mpt_status call_locked(mpt__nccl_state *s, const mpt__coll *c, const void *send,
                              void *recv, cudaStream_t cs, double deadline_ms) {
  const size_t n = (size_t)c->count;
  ncclResult_t r;
  if (c->dtype == MPT_BF16 &&
      (c->kind == MPT__COLL_ALLREDUCE || c->kind == MPT__COLL_REDUCE_SCATTER))
    return bf16_locked(s, c, send, recv, cs, deadline_ms);
  switch (c->kind) {
    case MPT__COLL_ALLREDUCE:
      r = ncclAllReduce(send, recv, n, nccl_dtype(c->dtype), nccl_op(c->arg), s->nc, cs);
      break;
    case MPT__COLL_BROADCAST:
      r = ncclBroadcast(send, recv, n, nccl_dtype(c->dtype), c->arg, s->nc, cs);
      break;
    case MPT__COLL_ALLGATHER:
      r = ncclAllGather(send, recv, n, nccl_dtype(c->dtype), s->nc, cs);
      break;
    case MPT__COLL_REDUCE_SCATTER:
    case MPT__COLL_ALLGATHER_SHARDS:
      r = sharded_locked(s, c, send, recv, cs);
      break;
    default:
      r = ncclAllReduce(s->one, s->one, 1, ncclFloat32, ncclSum, s->nc, cs);
  }
  return settle_locked(s, c, r, deadline_ms);
}

/* Locked: records the ring event after `c` on cs and returns its slot. */
static mpt_status track_locked(mpt__nccl_state *s, const mpt__coll *c, cudaStream_t cs,
                               mpt__nccl_tracked **slot) {
  mpt__nccl_tracked *t = &s->ring[s->next];
  s->next = (s->next + 1) % MPT__NCCL_RING_SLOTS;
  t->coll = *c;
  t->enqueue_ms = mpt_time_ms();
  cudaError_t e = cudaEventRecord(t->done, cs);
  t->live = e == cudaSuccess;
  *slot = t;
  if (e == cudaSuccess) return MPT_OK;
  (void)cudaGetLastError();
  char what[160];
  return MPT_FAIL(MPT_EDEVICE, "cudaEventRecord after %s failed on rank %d (cuda:%d): %s",
                  mpt__coll_describe(c, what, sizeof what), s->comm->rank, s->dev,
                  cudaGetErrorString(e));
}

#define CUDA_OR_FAIL(call, what)                                                            \
  do {                                                                                      \
    cudaError_t e_ = (call);                                                                \
    if (e_ != cudaSuccess) {                                                                \
      (void)cudaGetLastError();                                                             \
      return MPT_FAIL(MPT_EDEVICE, "%s for a collective on host buffers failed on rank %d " \
                      "(cuda:%d): %s", (what), s->comm->rank, s->dev,                       \
                      cudaGetErrorString(e_));                                              \
    }                                                                                       \
  } while (0)

/* One collective on host buffers (host_stage.c runs the steps). */
typedef struct host_stage {
  mpt__nccl_state *s;
  const mpt__coll *c;
  cudaStream_t cs;
  double deadline_ms;
  size_t n, total, in_off;
  int send_dev, recv_dev; /* the send / receive buffer is device memory (mixed calls) */
} host_stage;

/* Locked: grows the device scratch and the pinned bounce buffer to `total` bytes. Nothing is in
 * flight on either: every use waited (the host path is serialised by s->host_mutex). */
static mpt_status host_buffers_locked(mpt__nccl_state *s, size_t total) {
  if (total <= s->scratch_nbytes && total <= s->bounce_nbytes) return MPT_OK;
  mpt_device_free(s->comm->config.device, s->scratch);
  mpt__cuda_host_free(s->bounce);
  s->scratch = s->bounce = NULL;
  s->scratch_nbytes = s->bounce_nbytes = 0;
  MPT_RETURN_IF(mpt_device_alloc(s->comm->config.device, total, &s->scratch));
  s->scratch_nbytes = total;
  MPT_RETURN_IF(mpt__cuda_host_alloc(total, &s->bounce));
  s->bounce_nbytes = total;
  return MPT_OK;
}

/* Locked: host send buffer -> pinned bounce -> device scratch, the collective on the scratch,
 * scratch -> bounce, then the ring's event and s->host_done. Every copy is pinned-to-device,
 * so nothing here waits for the device. */
static mpt_status host_enqueue(void *ctx) {
  host_stage *h = ctx;
  mpt__nccl_state *s = h->s;
  const mpt__coll *c = h->c;
  if (s->aborted) return mpt__comm_check_usable(s->comm);
  (void)cudaSetDevice(s->dev);
  MPT_RETURN_IF(host_buffers_locked(s, h->total));
  char *d = s->scratch, *b = s->bounce;
  if (c->kind != MPT__COLL_BROADCAST || s->comm->rank == c->arg) {
    if (h->send_dev) {
      CUDA_OR_FAIL(cudaMemcpyAsync(d + h->in_off, c->sendbuf, h->n, cudaMemcpyDeviceToDevice,
                                   h->cs), "copy in");
    } else {
      memcpy(b + h->in_off, c->sendbuf, h->n);
      CUDA_OR_FAIL(cudaMemcpyAsync(d + h->in_off, b + h->in_off, h->n, cudaMemcpyHostToDevice,
                                   h->cs), "copy in");
    }
  }
  MPT_RETURN_IF(call_locked(s, c, d + h->in_off, d, h->cs, h->deadline_ms));
  if (h->recv_dev)
    CUDA_OR_FAIL(cudaMemcpyAsync(c->recvbuf, d, h->total, cudaMemcpyDeviceToDevice, h->cs),
                 "copy out");
  else
    CUDA_OR_FAIL(cudaMemcpyAsync(b, d, h->total, cudaMemcpyDeviceToHost, h->cs), "copy out");
  mpt__nccl_tracked *t;
  MPT_RETURN_IF(track_locked(s, c, h->cs, &t));
  CUDA_OR_FAIL(cudaEventRecord(s->host_done, h->cs), "recording the completion event");
  return MPT_OK;
}

static int host_query(void *ctx, mpt_status *err) {
  host_stage *h = ctx;
  mpt__nccl_state *s = h->s;
  const cudaError_t e = cudaEventQuery(s->host_done);
  if (e == cudaSuccess) return 1;
  if (e == cudaErrorNotReady) {
    mpt__cuda_clear_not_ready(); /* before the next launch check */
    return 0;
  }
  (void)cudaGetLastError();
  char what[160];
  *err = MPT_FAIL(MPT_EDEVICE, "%s on host buffers failed on rank %d (cuda:%d): %s",
                  mpt__coll_describe(h->c, what, sizeof what), s->comm->rank, s->dev,
                  cudaGetErrorString(e));
  return -1;
}

static mpt_status host_check(void *ctx) {
  host_stage *h = ctx;
  return mpt__nccl_check_locked(h->s, h->s->comm->config.timeout_ms);
}

static mpt_status host_expire(void *ctx) {
  host_stage *h = ctx;
  mpt__nccl_state *s = h->s;
  char what[160];
  return mpt__nccl_fail_locked(s, MPT_FAIL(MPT_ETIMEOUT, "%s on host buffers did not complete "
                               "within %g s on rank %d (NCCL on cuda:%d): a rank did not reach "
                               "it, or died; the NCCL communicator was aborted",
                               mpt__coll_describe(h->c, what, sizeof what),
                               s->comm->config.timeout_ms / 1000.0, s->comm->rank, s->dev));
}

static void host_copy_out(void *ctx) {
  host_stage *h = ctx;
  if (!h->recv_dev) memcpy(h->c->recvbuf, h->s->bounce, h->total);
}

/* `c` on host buffers, staged through the device scratch and the pinned bounce buffer; returns
 * once the result is in the host buffer, at the deadline, or on failure. Not locked: takes
 * s->host_mutex (one host collective at a time) and s->mutex only for the enqueue and the
 * checks, never across the wait (host_stage.c). */
static mpt_status host_collective(mpt__nccl_state *s, const mpt__coll *c, cudaStream_t cs,
                                  double deadline_ms, int send_dev, int recv_dev) {
  mpt_comm *comm = s->comm;
  const size_t n = (size_t)c->count * mpt_dtype_size(c->dtype);
  const int gather = c->kind == MPT__COLL_ALLGATHER;
  host_stage h = {s, c, cs, deadline_ms, n, gather ? n * (size_t)comm->world_size : n,
                  gather ? n * (size_t)comm->rank : 0, send_dev, recv_dev};
  const mpt__host_stage_ops ops = {&h, host_enqueue, host_query, host_check, host_expire,
                                   host_copy_out};
  pthread_mutex_lock(&s->host_mutex);
  const mpt_status st = mpt__host_stage_run(&s->mutex, &ops, deadline_ms);
  pthread_mutex_unlock(&s->host_mutex);
  return st;
}

mpt_status mpt__nccl_enqueue(mpt_comm *comm, mpt_stream *stream, const mpt__coll *c) {
  mpt__nccl_state *s = comm->backend_state;
  const mpt_device sd = mpt_stream_device(stream);
  cudaStream_t cs = (cudaStream_t)mpt__cuda_stream_handle(stream);
  if (!cs || sd.index != s->dev)
    return MPT_FAIL(MPT_EINVAL, "nccl collectives run on a CUDA stream of cuda:%d, not on a %s:%d "
                    "stream", s->dev, sd.type == MPT_DEVICE_CUDA ? "cuda" : "cpu", sd.index);
  MPT_RETURN_IF(mpt_stream_error(stream));
  const double deadline_ms = mpt_time_ms() + comm->config.timeout_ms;
  if (comm->config.check_collectives) MPT_RETURN_IF(check_signature(s, c, deadline_ms));
  if (c->count == 0 && c->kind != MPT__COLL_BARRIER) return MPT_OK; /* checked mode only */

  if (c->kind == MPT__COLL_REDUCE_SCATTER || c->kind == MPT__COLL_ALLGATHER_SHARDS) {
    int64_t off, mine;
    mpt_comm_shard(c->count, comm->world_size, comm->rank, &off, &mine);
    if (!on_device(c->sendbuf) || (mine > 0 && !on_device(c->recvbuf)))
      return MPT_FAIL(MPT_ENOTSUP, "the nccl comm backend runs reduce-scatter and all-gather of "
                      "shards on device buffers only");
  } else if (c->kind != MPT__COLL_BARRIER) {
    const int send_dev = on_device(c->sendbuf), recv_dev = on_device(c->recvbuf);
    if (!send_dev || !recv_dev) return host_collective(s, c, cs, deadline_ms, send_dev, recv_dev);
  }
  mpt_status st;
  pthread_mutex_lock(&s->mutex);
  if (s->aborted) {
    st = mpt__comm_check_usable(comm);
  } else {
    (void)cudaSetDevice(s->dev);
    mpt__nccl_tracked *t;
    st = call_locked(s, c, c->sendbuf, c->recvbuf, cs, deadline_ms);
    if (st == MPT_OK) st = track_locked(s, c, cs, &t);
  }
  pthread_mutex_unlock(&s->mutex);
  return st;
}

/* ---- waiting ----------------------------------------------------------------------------- */

mpt_status mpt__nccl_wait_event(mpt_comm *comm, mpt_event *event, const mpt__coll *c,
                                double grace_ms) {
  mpt__nccl_state *s = comm->backend_state;
  const double limit_ms = comm->config.timeout_ms + grace_ms;
  const double deadline_ms = mpt_time_ms() + limit_ms;
  int polls = 0;
  long sleep_ns = 2000;
  for (;;) {
    if (mpt_event_query(event)) return mpt_event_synchronize(event, 0);
    if (s) {
      pthread_mutex_lock(&s->mutex);
      mpt_status st = mpt__nccl_check_locked(s, limit_ms);
      pthread_mutex_unlock(&s->mutex);
      if (st != MPT_OK) return st;
    }
    if (mpt_time_ms() >= deadline_ms) {
      if (mpt_event_query(event)) return mpt_event_synchronize(event, 0);
      char what[160] = "the awaited event";
      if (c) mpt__coll_describe(c, what, sizeof what);
      mpt_status st = MPT_FAIL(MPT_ETIMEOUT, "%s did not complete within %g s on rank %d (NCCL "
                               "comm on cuda:%d)", what, comm->config.timeout_ms / 1000.0,
                               comm->rank, s ? s->dev : -1);
      if (!s) return st;
      pthread_mutex_lock(&s->mutex);
      st = mpt__nccl_fail_locked(s, st);
      pthread_mutex_unlock(&s->mutex);
      return st;
    }
    mpt__nccl_backoff(&polls, &sleep_ns);
  }
}

