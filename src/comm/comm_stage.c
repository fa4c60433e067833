/* The MPI comm backend for buffers on a CUDA device (config.device = cuda:N, comm.h "Devices"):
 * each collective is staged through pinned host memory around the plain MPI backend
 * (comm_mpi.c), so that any MPI (CUDA-aware or not) can carry it and several ranks can share
 * one GPU. Built in CUDA builds only (src/comm/local.mk).
 *
 * One collective = three items on a CPU worker stream, in order:
 *   1. stage_in (host function): copy the device input into a pinned host buffer on a private
 *      non-blocking CUDA stream of the device (mpt_op_memcpy), then wait for it with the comm's
 *      deadline. All-reduce: send -> buffer; broadcast: the root's buffer; all-gather: this
 *      rank's block, into its place in a world-sized buffer.
 *   2. the MPI backend's collective on the host buffer, in place (its own deadlines, checked
 *      mode, agreement and AVG division apply unchanged);
 *   3. stage_out (host function): copy the result back into the device output (all-reduce:
 *      recv; broadcast: non-roots; all-gather: the whole receive buffer), wait, and return the
 *      buffer and the record to their free lists.
 * Host functions of a worker stream run on its own thread, which may call CUDA (unlike a CUDA
 * stream's host functions). Producers on a CUDA stream order themselves before the collective
 * with an event on their stream and mpt_stream_wait_event on the comm stream (the CPU worker
 * then waits for the CUDA event with its deadline); consumers wait on an event recorded on the
 * comm stream. Collectives on a CUDA stream are refused (MPT_EINVAL): MPI would then run on the
 * CUDA driver's callback thread, where CUDA calls are not allowed.
 *
 * Memory: records and pinned buffers come from per-comm free lists (a buffer is reused for any
 * collective that fits in it), so once the sizes repeat (DDP buckets) nothing is allocated.
 * A record whose stage_out never runs (its stream failed first) keeps its buffer until
 * mpt_comm_free, which frees them unless the comm failed: then MPI may still write into a
 * buffer (a timed-out collective cannot be cancelled) and they are leaked on purpose.
 * Barriers and empty collectives (checked mode) go to the MPI backend unchanged.
 *
 * The allocator's contract (cuda_alloc.c): a block freed while work queued on a stream may
 * still use it is reused only after a fence. The copies of a staged collective are issued by
 * the worker LATER, so no CUDA stream shows them when the caller frees a buffer right after
 * enqueueing; the state is therefore registered with the device's allocator as a host source:
 * each record gets a sequence number at enqueue and is busy until its stage_out finished, and
 * a fence's ticket (the last number enqueued) is done once no record up to it is busy.
 *
 * Threads: enqueue on the caller's thread; stage_in / stage_out on the stream's worker thread;
 * the free lists under one mutex. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_impl.h"
#include "core/cuda/cuda.h"
#include "mpitrain/ops.h"

typedef struct stage_buf {
  void *host; /* pinned */
  size_t nbytes;
  struct stage_buf *next_free;
  struct stage_buf *next_all;
} stage_buf;

typedef struct stage_op {
  mpt_comm *comm;
  stage_buf *buf;
  uint64_t seq; /* enqueue order (the allocator's tickets) */
  int busy;     /* from enqueue until stage_out finished */
  const void *in_src; /* device; NULL: no copy in */
  size_t in_off, in_nbytes;
  void *out_dst; /* device; NULL: no copy out */
  size_t out_nbytes;
  struct stage_op *next_free;
  struct stage_op *next_all;
} stage_op;

typedef struct stage_state {
  mpt_stream *copy; /* non-blocking CUDA stream of config.device: the staging copies */
  pthread_mutex_t mutex;
  stage_buf *buf_free, *buf_all;
  stage_op *op_free, *op_all;
  uint64_t enqueued; /* records enqueued so far */
  int registered;    /* a host source of the device's allocator */
} stage_state;

/* ---- free lists ---- */

/* A pinned buffer of at least nbytes: the first free one that fits, else a new one (rounded up
 * to 64 KiB so that nearby sizes share buffers). */
static mpt_status buf_get(stage_state *s, size_t nbytes, stage_buf **out) {
  *out = NULL;
  pthread_mutex_lock(&s->mutex);
  for (stage_buf **p = &s->buf_free; *p; p = &(*p)->next_free) {
    if ((*p)->nbytes >= nbytes) {
      *out = *p;
      *p = (*p)->next_free;
      break;
    }
  }
  pthread_mutex_unlock(&s->mutex);
  if (*out) return MPT_OK;
  stage_buf *b = calloc(1, sizeof *b);
  if (!b) return MPT_FAIL(MPT_ENOMEM, "cannot allocate a staging buffer record");
  b->nbytes = (nbytes + 65535) & ~(size_t)65535;
  mpt_status st = mpt__cuda_host_alloc(b->nbytes, &b->host);
  if (st != MPT_OK) {
    free(b);
    return st;
  }
  pthread_mutex_lock(&s->mutex);
  b->next_all = s->buf_all;
  s->buf_all = b;
  pthread_mutex_unlock(&s->mutex);
  *out = b;
  return MPT_OK;
}

static stage_op *op_get(stage_state *s) {
  pthread_mutex_lock(&s->mutex);
  stage_op *o = s->op_free;
  if (o) {
    s->op_free = o->next_free;
  } else if ((o = calloc(1, sizeof *o))) {
    o->next_all = s->op_all;
    s->op_all = o;
  }
  pthread_mutex_unlock(&s->mutex);
  return o;
}

/* Returns the record and its buffer to the free lists. */
static void op_release(stage_state *s, stage_op *o) {
  pthread_mutex_lock(&s->mutex);
  if (o->buf) {
    o->buf->next_free = s->buf_free;
    s->buf_free = o->buf;
    o->buf = NULL;
  }
  o->busy = 0;
  o->next_free = s->op_free;
  s->op_free = o;
  pthread_mutex_unlock(&s->mutex);
}

/* ---- the allocator's host source ---- */

static uint64_t source_ticket(void *ctx) {
  stage_state *s = ctx;
  pthread_mutex_lock(&s->mutex);
  const uint64_t t = s->enqueued;
  pthread_mutex_unlock(&s->mutex);
  return t;
}

static int source_done(void *ctx, uint64_t ticket) {
  stage_state *s = ctx;
  int done = 1;
  pthread_mutex_lock(&s->mutex);
  for (stage_op *o = s->op_all; o && done; o = o->next_all) done = !(o->busy && o->seq <= ticket);
  pthread_mutex_unlock(&s->mutex);
  return done;
}

/* ---- the host functions (worker thread) ---- */

static mpt_status stage_in(void *arg) {
  stage_op *o = arg;
  mpt_comm *comm = o->comm;
  stage_state *s = comm->stage_state;
  if (!o->in_src) return MPT_OK;
  MPT_RETURN_IF(mpt_op_memcpy(s->copy, mpt_device_cpu(), (char *)o->buf->host + o->in_off,
                              comm->config.device, o->in_src, o->in_nbytes));
  return mpt_stream_synchronize(s->copy, comm->config.timeout_ms);
}

static mpt_status stage_out(void *arg) {
  stage_op *o = arg;
  mpt_comm *comm = o->comm;
  stage_state *s = comm->stage_state;
  mpt_status st = MPT_OK;
  if (o->out_dst) {
    st = mpt_op_memcpy(s->copy, comm->config.device, o->out_dst, mpt_device_cpu(), o->buf->host,
                       o->out_nbytes);
    if (st == MPT_OK) st = mpt_stream_synchronize(s->copy, comm->config.timeout_ms);
  }
  if (st == MPT_OK) op_release(s, o); /* a failed copy may still be running: keep the buffer */
  return st;
}

/* ---- enqueue ---- */

/* The MPI backend's slot for a collective kind. */
static mpt_status mpi_enqueue(mpt_comm *comm, mpt_stream *stream, const mpt__coll *c) {
  const mpt__comm_backend *m = &mpt__comm_mpi_backend;
  switch (c->kind) {
    case MPT__COLL_ALLREDUCE:
      return m->allreduce(comm, stream, c);
    case MPT__COLL_BROADCAST:
      return m->broadcast(comm, stream, c);
    case MPT__COLL_ALLGATHER:
      return m->allgather(comm, stream, c);
    case MPT__COLL_BARRIER:
      return m->barrier(comm, stream, c);
    case MPT__COLL_REDUCE_SCATTER:
    case MPT__COLL_ALLGATHER_SHARDS:
      break; /* no slot in this table: the wrapper refuses them (MPT_ENOTSUP) */
  }
  return MPT_FAIL(MPT_EINVAL, "unknown collective kind %d", (int)c->kind);
}

static mpt_status staged_enqueue(mpt_comm *comm, mpt_stream *stream, const mpt__coll *coll) {
  if (mpt_stream_device(stream).type != MPT_DEVICE_CPU)
    return MPT_FAIL(MPT_EINVAL, "the mpi comm backend with device buffers runs collectives on CPU "
                    "worker streams only (the comm's own stream), not on a %s stream",
                    mpt_stream_device(stream).type == MPT_DEVICE_CUDA ? "cuda" : "foreign");
  if (coll->kind == MPT__COLL_BARRIER || coll->count == 0) return mpi_enqueue(comm, stream, coll);
  stage_state *s = comm->stage_state;
  const size_t n = (size_t)coll->count * mpt_dtype_size(coll->dtype);
  const size_t world = (size_t)comm->world_size;
  stage_op *o = op_get(s);
  if (!o) return MPT_FAIL(MPT_ENOMEM, "cannot allocate a staging record");
  pthread_mutex_lock(&s->mutex);
  o->seq = ++s->enqueued;
  o->busy = 1;
  pthread_mutex_unlock(&s->mutex);
  o->comm = comm;
  o->in_src = NULL;
  o->out_dst = NULL;
  o->in_off = 0;
  o->in_nbytes = o->out_nbytes = n;
  mpt__coll host = *coll;
  size_t need = n;
  switch (coll->kind) {
    case MPT__COLL_ALLREDUCE: /* in place on the host: the result lands in recv */
      o->in_src = coll->sendbuf;
      o->out_dst = coll->recvbuf;
      break;
    case MPT__COLL_BROADCAST:
      if (comm->rank == coll->arg)
        o->in_src = coll->sendbuf;
      else
        o->out_dst = coll->recvbuf;
      break;
    default: /* all-gather, in place: this rank's block at its place */
      need = n * world;
      o->in_src = coll->sendbuf;
      o->in_off = (size_t)comm->rank * n;
      o->out_dst = coll->recvbuf;
      o->out_nbytes = need;
      break;
  }
  mpt_status st = buf_get(s, need, &o->buf);
  if (st != MPT_OK) {
    op_release(s, o);
    return st;
  }
  char *h = o->buf->host;
  host.recvbuf = h;
  host.sendbuf = coll->kind == MPT__COLL_ALLGATHER ? h + o->in_off : h;
  st = mpt_stream_launch_host(stream, stage_in, o);
  if (st != MPT_OK) {
    op_release(s, o);
    return st;
  }
  /* From here the worker may be using the record: on a later failure it stays allocated (freed
   * with the comm). The stream failing makes the worker skip the items still queued. */
  MPT_RETURN_IF(mpi_enqueue(comm, stream, &host));
  return mpt_stream_launch_host(stream, stage_out, o);
}

/* ---- lifetime ---- */

static void stage_state_free(mpt_comm *comm) {
  stage_state *s = comm->stage_state;
  if (!s) return;
  if (s->registered) mpt__cuda_alloc_remove_host_source(comm->config.device.index, s);
  mpt_stream_free(s->copy);
  /* After a failure MPI may still write into a pinned buffer (a timed-out collective cannot be
   * cancelled): then the buffers are leaked on purpose. */
  const int failed = mpt_comm_error(comm) != MPT_OK;
  for (stage_buf *b = s->buf_all, *next; b; b = next) {
    next = b->next_all;
    if (!failed) {
      mpt__cuda_host_free(b->host);
      free(b);
    }
  }
  for (stage_op *o = s->op_all, *next; o; o = next) {
    next = o->next_all;
    free(o);
  }
  pthread_mutex_destroy(&s->mutex);
  free(s);
  comm->stage_state = NULL;
}

static mpt_status staged_init(mpt_comm *comm) {
  const mpt_device dev = comm->config.device;
  if (dev.type != MPT_DEVICE_CUDA)
    return MPT_FAIL(MPT_EINVAL, "staged mpi backend without a CUDA device");
  stage_state *s = calloc(1, sizeof *s);
  if (!s) return MPT_FAIL(MPT_ENOMEM, "cannot allocate the staging state");
  pthread_mutex_init(&s->mutex, NULL);
  comm->stage_state = s;
  mpt_status st = mpt_stream_init(&s->copy, dev, MPT_STREAM_WORKER);
  const mpt__cuda_host_source src = {s, source_ticket, source_done};
  if (st == MPT_OK) st = mpt__cuda_alloc_add_host_source(dev.index, &src);
  s->registered = st == MPT_OK;
  if (st == MPT_OK) st = mpt__comm_mpi_backend.init(comm);
  if (st != MPT_OK) stage_state_free(comm);
  return st;
}

static void staged_free(mpt_comm *comm) {
  stage_state_free(comm);
  mpt__comm_mpi_backend.free(comm);
}

const mpt__comm_backend mpt__comm_mpi_staged_backend = {
    .name = "mpi (device buffers staged through pinned host memory)",
    .init = staged_init,
    .free = staged_free,
    .allreduce = staged_enqueue,
    .broadcast = staged_enqueue,
    .allgather = staged_enqueue,
    .barrier = staged_enqueue,
    .stream_on_device = 0,
    .wait_event = NULL,
};
