/* The public comm API: config, lifetime, properties, the comm backend registry, and the public
 * collective wrappers (argument checks, count 0, sequence numbers, dispatch to the backend
 * table), plus the synchronous wrappers for setup code.
 *
 * Invariants: a comm's rank, sizes, launcher and agreed config never change after init. The
 * sequence counter only grows. `failed` goes from 0 to an error once and stays (first failure
 * wins). Process-wide: the count of live comms (mpt_comm_finalize refuses while any is alive).
 * Wrappers run on the caller's thread; the backend's work runs on the stream's thread. */
#include "config.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/comm_impl.h"

static atomic_int live_comms;
static atomic_int abandoned_comms; /* freed after a blocking-mode timeout: MPI is stuck */

const char *mpt_reduce_op_name(mpt_reduce_op op) {
  switch (op) {
    case MPT_REDUCE_SUM:
      return "sum";
    case MPT_REDUCE_AVG:
      return "avg";
    case MPT_REDUCE_MIN:
      return "min";
    case MPT_REDUCE_MAX:
      return "max";
  }
  return "unknown";
}

const char *mpt_launcher_name(mpt_launcher launcher) {
  switch (launcher) {
    case MPT_LAUNCHER_PLAIN:
      return "plain process";
    case MPT_LAUNCHER_MPIRUN:
      return "mpirun";
    case MPT_LAUNCHER_SRUN:
      return "srun";
  }
  return "unknown";
}

const char *mpt_comm_backend_name(mpt_comm_backend backend) {
  switch (backend) {
    case MPT_COMM_BACKEND_MPI:
      return "mpi";
    case MPT_COMM_BACKEND_NCCL:
      return "nccl";
  }
  return "unknown";
}

mpt_comm_config mpt_comm_config_default(void) {
  mpt_comm_config c;
  memset(&c, 0, sizeof c);
  c.backend = MPT_COMM_BACKEND_MPI;
  c.timeout_ms = 300000.0;
  c.check_collectives = 0;
  c.confirm_collectives = 1;
  c.blocking = 1;
  c.max_chunk_count = INT_MAX / 2;
  c.configure_log = 1;
  c.log_level = MPT_LOG_INFO;
  c.flight_recorder = MPT_COMM_FLIGHT_DEFAULT;
  return c;
}

/* The registry: the only place that knows which comm backends exist. MPI on a CUDA device is
 * the MPI table with staging (comm_stage.c); a device type the backend cannot use is refused by
 * config_check. */
static const mpt__comm_backend *backend_get(mpt_comm_backend kind, mpt_device device) {
  switch (kind) {
    case MPT_COMM_BACKEND_MPI:
      if (device.type == MPT_DEVICE_CPU) return &mpt__comm_mpi_backend;
#ifdef MPT_HAVE_CUDA
      if (device.type == MPT_DEVICE_CUDA) return &mpt__comm_mpi_staged_backend;
#endif
      return NULL;
    case MPT_COMM_BACKEND_NCCL:
#ifdef MPT_HAVE_NCCL
      if (device.type == MPT_DEVICE_CUDA) return &mpt__comm_nccl_backend;
#endif
      return NULL;
  }
  return NULL;
}

/* ---- failure state ----------------------------------------------------------------------- */

void mpt__comm_set_failed(mpt_comm *comm, mpt_status status) {
  pthread_mutex_lock(&comm->mutex);
  if (atomic_load(&comm->failed) == MPT_OK) {
    snprintf(comm->failed_detail, sizeof comm->failed_detail, "%s", mpt_last_error());
    atomic_store(&comm->failed, status);
  }
  pthread_mutex_unlock(&comm->mutex);
}

mpt_status mpt__comm_check_usable(mpt_comm *comm) {
  mpt_status st = (mpt_status)atomic_load(&comm->failed);
  if (st == MPT_OK) return MPT_OK;
  char detail[1024];
  pthread_mutex_lock(&comm->mutex);
  snprintf(detail, sizeof detail, "%s", comm->failed_detail);
  pthread_mutex_unlock(&comm->mutex);
  return mpt_error_set(st, "the communicator is unusable since an earlier collective failed: %s",
                       detail);
}

mpt_status mpt_comm_error(const mpt_comm *comm) {
  return comm ? (mpt_status)atomic_load(&((mpt_comm *)comm)->failed) : MPT_OK;
}

/* ---- lifetime ---------------------------------------------------------------------------- */

static mpt_status config_check(const mpt_comm_config *c) {
  if (!(c->timeout_ms > 0) || !isfinite(c->timeout_ms))
    return MPT_FAIL(MPT_EINVAL, "comm timeout_ms must be a positive number of milliseconds, not %g",
                    c->timeout_ms);
  if (c->max_chunk_count < 1 || c->max_chunk_count > INT_MAX / 2)
    return MPT_FAIL(MPT_EINVAL, "comm max_chunk_count must be in [1, %d], not %lld", INT_MAX / 2,
                    (long long)c->max_chunk_count);
  if (c->flight_recorder < 0 || c->flight_recorder > MPT_COMM_FLIGHT_MAX)
    return MPT_FAIL(MPT_EINVAL, "comm flight_recorder must be in [0, %d] entries, not %lld",
                    MPT_COMM_FLIGHT_MAX, (long long)c->flight_recorder);
  if (c->log_level < MPT_LOG_ERROR || c->log_level > MPT_LOG_DEBUG)
    return MPT_FAIL(MPT_EINVAL, "comm log_level %d is not a log level", (int)c->log_level);
  if (c->device.type != MPT_DEVICE_CPU && c->device.type != MPT_DEVICE_CUDA)
    return MPT_FAIL(MPT_EINVAL, "comm device type %d is not a device type", (int)c->device.type);
#ifndef MPT_HAVE_NCCL
  if (c->backend == MPT_COMM_BACKEND_NCCL)
    return MPT_FAIL(MPT_ENOTSUP, "the nccl comm backend is not available in this build (configure "
                    "found no CUDA with NCCL); use the mpi backend");
#endif
  if (c->backend == MPT_COMM_BACKEND_NCCL && c->device.type != MPT_DEVICE_CUDA)
    return MPT_FAIL(MPT_EINVAL, "the nccl comm backend needs a CUDA device (config.device "
                    "cuda:N, this rank's GPU), not the CPU");
  return MPT_OK;
}

mpt_status mpt_comm_init(mpt_comm **out, const mpt_comm_config *config) {
  if (!out) return MPT_FAIL(MPT_EINVAL, "NULL comm output pointer");
  *out = NULL;
  mpt_comm_config cfg = config ? *config : mpt_comm_config_default();
  MPT_RETURN_IF(config_check(&cfg));
  const mpt__comm_backend *backend = backend_get(cfg.backend, cfg.device);
  if (!backend) {
    char dev[32];
    return MPT_FAIL(MPT_ENOTSUP, "the %s comm backend on %s is not available in this build",
                    mpt_comm_backend_name(cfg.backend),
                    mpt_device_str(cfg.device, dev, sizeof dev));
  }

  mpt_status st = MPT_OK;
  mpt_comm *c = calloc(1, sizeof *c);
  if (!c) return MPT_FAIL(MPT_ENOMEM, "cannot allocate a comm");
  pthread_mutex_init(&c->mutex, NULL);
  pthread_mutex_init(&c->sync_mutex, NULL);
  atomic_init(&c->failed, MPT_OK);
  atomic_init(&c->next_seq, 0);
  c->progress_index = -1;
  c->backend = backend;

  MPT_CHECK(mpt__comm_bootstrap(c, &cfg), fail_boot);
  if (c->config.configure_log)
    mpt_log_configure(c->rank, c->world_size, c->config.log_level, 0);
  if (c->launch_notes[0])
    mpt_log(MPT_LOG_DEBUG, "launched by %s; %s", mpt_launcher_name(c->launcher), c->launch_notes);
  const mpt_device sdev = backend->stream_on_device ? c->config.device : mpt_device_cpu();
  MPT_CHECK(mpt_stream_init(&c->stream, sdev, MPT_STREAM_WORKER), fail_stream);
  MPT_CHECK(mpt_event_init(&c->sync_event, sdev), fail_event);
  MPT_CHECK(mpt__flight_init(c), fail_flight);
  MPT_CHECK(backend->init(c), fail_backend);
  mpt_log(MPT_LOG_DEBUG, "comm: rank %d of %d, local rank %d of %d on %s, launched by %s, "
          "backend %s, timeout %g s, progress %s, checked mode %s, agreement %s",
          c->rank, c->world_size, c->local_rank, c->local_size, c->hostname,
          mpt_launcher_name(c->launcher), backend->name, c->config.timeout_ms / 1000.0,
          c->config.blocking ? "blocking" : "polling",
          c->config.check_collectives ? "on" : "off",
          c->config.confirm_collectives ? "on" : "off");
  atomic_fetch_add(&live_comms, 1);
  *out = c;
  return MPT_OK;

fail_backend:
  mpt__flight_free(c);
fail_flight:
  mpt_event_free(c->sync_event);
fail_event:
  mpt_stream_free(c->stream);
fail_stream:
  MPI_Comm_free(&c->mpi_comm);
fail_boot:
  free(c->peers);
  pthread_mutex_destroy(&c->sync_mutex);
  pthread_mutex_destroy(&c->mutex);
  free(c);
  return st;
}

/* Blocking mode: waits for the comm's own stream with the waiter's deadline. Returns 1 when a
 * collective is stuck inside MPI past its deadline (the comm is then marked failed and
 * abandoned: nothing of it may be freed), 0 when the stream can be drained and joined. */
static int drain_blocking(mpt_comm *comm) {
  char saved[1024]; /* keep the caller's last error: mpt_comm_free reports nothing */
  snprintf(saved, sizeof saved, "%s", mpt_last_error());
  int recorded = mpt_event_record(comm->sync_event, comm->stream) == MPT_OK;
  int stuck = 0;
  for (;;) {
    if (recorded) mpt__comm_wait_deadline(comm, comm->sync_event, NULL, 0);
    /* Either the stream drained, or a deadline expired (the comm is failed now, so no new
     * collective can start). Stuck = still in flight past its own deadline. */
    pthread_mutex_lock(&comm->mutex);
    int busy = comm->inflight != NULL;
    if (busy && comm->inflight->start_ms + comm->config.timeout_ms <= mpt_time_ms())
      stuck = comm->abandoned = 1;
    pthread_mutex_unlock(&comm->mutex);
    if (!busy || stuck || !recorded) break;
    if (mpt_event_query(comm->sync_event)) { /* busy on a caller's stream: look again soon */
      struct timespec ts = {0, 1000000};
      nanosleep(&ts, NULL);
    }
  }
  mpt_error_set(MPT_OK, "%s", saved);
  return stuck;
}

void mpt_comm_free(mpt_comm *comm) {
  if (!comm) return;
  if (comm->config.blocking && drain_blocking(comm)) {
    /* The worker sits in a blocking MPI call that will never return (or returns into this
     * leaked comm and stops at the failure check): do not join it, free nothing it may touch. */
    char what[512];
    mpt_comm_describe_inflight(comm, what, sizeof what);
    mpt_log(MPT_LOG_DEBUG, "comm freed while %s: its worker thread and state are abandoned; MPI "
            "cannot be finalized cleanly, abort the job (mpt_comm_abort)", what);
    mpt_stream_abandon(comm->stream);
    atomic_fetch_add(&abandoned_comms, 1);
    atomic_fetch_sub(&live_comms, 1);
    return;
  }
  mpt_stream_free(comm->stream); /* runs what is queued; each collective ends by its deadline */
  comm->backend->free(comm);
  mpt_event_free(comm->sync_event);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm->mpi_comm != MPI_COMM_NULL) MPI_Comm_free(&comm->mpi_comm);
  pthread_mutex_destroy(&comm->sync_mutex);
  pthread_mutex_destroy(&comm->mutex);
  mpt__flight_free(comm);
  free(comm);
  atomic_fetch_sub(&live_comms, 1);
}

mpt_status mpt_comm_finalize(void) {
  int n = atomic_load(&live_comms);
  if (n > 0)
    return MPT_FAIL(MPT_ESTATE, "%d comm(s) still alive: mpt_comm_free them before finalizing", n);
  int stuck = atomic_load(&abandoned_comms);
  if (stuck > 0)
    return MPT_FAIL(MPT_ESTATE,
                    "%d comm(s) had a collective time out in blocking mode that is still inside "
                    "MPI: MPI cannot be finalized cleanly; end the job with mpt_comm_abort",
                    stuck);
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!mpt__comm_mpi_owned() || !initialized || finalized) return MPT_OK;
  mpt__progress_finalize();
  int rc = MPI_Finalize();
  if (rc != MPI_SUCCESS) return MPT_MPI_FAIL(rc, mpt_log_rank(), "MPI_Finalize");
  return MPT_OK;
}

void mpt_comm_abort(const mpt_comm *comm, int code) {
  (void)comm; /* every rank of the job ends, whichever communicator is named */
  fflush(stdout);
  fflush(stderr);
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
  exit(code);
}

/* ---- properties -------------------------------------------------------------------------- */

int mpt_comm_rank(const mpt_comm *comm) { return comm->rank; }
int mpt_comm_world_size(const mpt_comm *comm) { return comm->world_size; }
int mpt_comm_local_rank(const mpt_comm *comm) { return comm->local_rank; }
int mpt_comm_local_size(const mpt_comm *comm) { return comm->local_size; }
const char *mpt_comm_hostname(const mpt_comm *comm) { return comm->hostname; }
mpt_launcher mpt_comm_launcher(const mpt_comm *comm) { return comm->launcher; }
mpt_comm_backend mpt_comm_backend_kind(const mpt_comm *comm) { return comm->config.backend; }
int mpt_comm_checked(const mpt_comm *comm) { return comm->config.check_collectives; }
int mpt_comm_blocking(const mpt_comm *comm) { return comm->config.blocking; }
double mpt_comm_timeout_ms(const mpt_comm *comm) { return comm->config.timeout_ms; }
mpt_stream *mpt_comm_stream(mpt_comm *comm) { return comm->stream; }
uint64_t mpt_comm_sequence(const mpt_comm *comm) {
  return atomic_load(&((mpt_comm *)comm)->next_seq);
}

/* ---- collectives ------------------------------------------------------------------------- */

/* 1 if [a, a+na) and [b, b+nb) share a byte. */
static int overlap(const void *a, size_t na, const void *b, size_t nb) {
  const char *pa = a, *pb = b;
  return na && nb && pa < pb + nb && pb < pa + na;
}

static mpt_status check_common(mpt_comm *comm, int64_t count, mpt_dtype dtype, const char *what) {
  if (!comm) return MPT_FAIL(MPT_EINVAL, "%s: NULL comm", what);
  if (count < 0) return MPT_FAIL(MPT_EINVAL, "%s: negative count %lld", what, (long long)count);
  if (dtype != MPT_F32 && dtype != MPT_I32 && dtype != MPT_U8 && dtype != MPT_BF16)
    return MPT_FAIL(MPT_EINVAL, "%s: unsupported dtype %d (float32, int32, uint8 or bfloat16)",
                    what, (int)dtype);
  if ((uint64_t)count > SIZE_MAX / 8 / (uint64_t)(comm->world_size > 0 ? comm->world_size : 1))
    return MPT_FAIL(MPT_EINVAL, "%s: count %lld is too large", what, (long long)count);
  return mpt__comm_check_usable(comm);
}

/* Assigns the sequence number and hands the collective to the backend (count 0: nothing,
 * except in checked mode where it still takes part in the signature check). */
static mpt_status dispatch(mpt_comm *comm, mpt_stream *stream, mpt__coll *coll) {
  if (coll->count == 0 && coll->kind != MPT__COLL_BARRIER && !comm->config.check_collectives)
    return MPT_OK;
  if (!stream) stream = comm->stream;
  coll->seq = atomic_fetch_add(&comm->next_seq, 1);
  coll->step = comm->tag_step;
  memcpy(coll->purpose, comm->tag_purpose, sizeof coll->purpose);
  mpt__flight_enqueue(comm, coll);
  switch (coll->kind) {
    case MPT__COLL_ALLREDUCE:
      return comm->backend->allreduce(comm, stream, coll);
    case MPT__COLL_BROADCAST:
      return comm->backend->broadcast(comm, stream, coll);
    case MPT__COLL_ALLGATHER:
      return comm->backend->allgather(comm, stream, coll);
    case MPT__COLL_BARRIER:
      return comm->backend->barrier(comm, stream, coll);
    case MPT__COLL_REDUCE_SCATTER:
      return comm->backend->reduce_scatter(comm, stream, coll);
    case MPT__COLL_ALLGATHER_SHARDS:
      return comm->backend->allgather_shards(comm, stream, coll);
  }
  return MPT_FAIL(MPT_EINVAL, "unknown collective kind %d", (int)coll->kind);
}

/* The reductions a dtype allows: avg needs float32 or bfloat16; bfloat16 only sum and avg;
 * uint8 has no arithmetic here except through all-reduce (as before). */
static mpt_status reduce_dtype_check(mpt_dtype dtype, mpt_reduce_op op, const char *what) {
  if (op == MPT_REDUCE_AVG && dtype != MPT_F32 && dtype != MPT_BF16)
    return MPT_FAIL(MPT_EINVAL, "%s: avg needs float32 or bfloat16, not %s", what,
                    mpt_dtype_name(dtype));
  if (dtype == MPT_BF16 && op != MPT_REDUCE_SUM && op != MPT_REDUCE_AVG)
    return MPT_FAIL(MPT_EINVAL, "%s: bfloat16 takes sum or avg, not %s", what,
                    mpt_reduce_op_name(op));
  return MPT_OK;
}

/* A sharded collective on a backend without it. */
static mpt_status sharded_supported(mpt_comm *comm, mpt__coll_kind kind, const char *what) {
  const mpt__comm_backend *b = comm->backend;
  if ((kind == MPT__COLL_REDUCE_SCATTER ? b->reduce_scatter : b->allgather_shards) == NULL) {
    char dev[32];
    return MPT_FAIL(MPT_ENOTSUP, "%s is not available on the %s comm backend with buffers on %s",
                    what, b->name, mpt_device_str(comm->config.device, dev, sizeof dev));
  }
  return MPT_OK;
}

void mpt_comm_shard(int64_t count, int world_size, int rank, int64_t *offset,
                    int64_t *shard_count) {
  *offset = *shard_count = 0;
  if (world_size <= 0 || rank < 0 || rank >= world_size || count < 0) return;
  int64_t s = count / world_size + (count % world_size != 0);
  int64_t lo = s * rank < count ? s * rank : count;
  int64_t hi = lo + s < count ? lo + s : count;
  *offset = lo;
  *shard_count = hi - lo;
}

static mpt_status reduce_scatter_prep(mpt_comm *comm, const void *sendbuf, void *recvbuf,
                                      int64_t count, mpt_dtype dtype, mpt_reduce_op op,
                                      mpt__coll *coll) {
  const char *what = "reduce-scatter";
  MPT_RETURN_IF(check_common(comm, count, dtype, what));
  if (op != MPT_REDUCE_SUM && op != MPT_REDUCE_AVG)
    return MPT_FAIL(MPT_EINVAL, "%s: the reduction must be sum or avg, not %s (%d)", what,
                    mpt_reduce_op_name(op), (int)op);
  if (dtype == MPT_U8)
    return MPT_FAIL(MPT_EINVAL, "%s: uint8 cannot be summed", what);
  MPT_RETURN_IF(reduce_dtype_check(dtype, op, what));
  MPT_RETURN_IF(sharded_supported(comm, MPT__COLL_REDUCE_SCATTER, what));
  int64_t off, mine;
  mpt_comm_shard(count, comm->world_size, comm->rank, &off, &mine);
  if (count > 0 && (!sendbuf || (mine > 0 && !recvbuf)))
    return MPT_FAIL(MPT_EINVAL, "%s: NULL buffer with count %lld", what, (long long)count);
  size_t es = mpt_dtype_size(dtype);
  const char *in_place = (const char *)sendbuf + (size_t)off * es;
  if (mine > 0 && (const char *)recvbuf != in_place &&
      overlap(sendbuf, (size_t)count * es, recvbuf, (size_t)mine * es))
    return MPT_FAIL(MPT_EINVAL, "%s: the receive buffer overlaps the send buffer without being "
                    "this rank's shard (sendbuf + %lld elements for in place)", what,
                    (long long)off);
  *coll = (mpt__coll){MPT__COLL_REDUCE_SCATTER, 0, sendbuf, recvbuf, count, dtype, (int)op, -1, {0}};
  return MPT_OK;
}

static mpt_status allgather_shards_prep(mpt_comm *comm, void *buf, int64_t count,
                                        mpt_dtype dtype, mpt__coll *coll) {
  const char *what = "all-gather of shards";
  MPT_RETURN_IF(check_common(comm, count, dtype, what));
  MPT_RETURN_IF(sharded_supported(comm, MPT__COLL_ALLGATHER_SHARDS, what));
  if (count > 0 && !buf)
    return MPT_FAIL(MPT_EINVAL, "%s: NULL buffer with count %lld", what, (long long)count);
  *coll = (mpt__coll){MPT__COLL_ALLGATHER_SHARDS, 0, buf, buf, count, dtype, 0, -1, {0}};
  return MPT_OK;
}

/* Argument checks of each collective; on success *coll describes it (sequence number not yet
 * taken). */
static mpt_status allreduce_prep(mpt_comm *comm, const void *sendbuf, void *recvbuf,
                                 int64_t count, mpt_dtype dtype, mpt_reduce_op op,
                                 mpt__coll *coll) {
  MPT_RETURN_IF(check_common(comm, count, dtype, "all-reduce"));
  if (op != MPT_REDUCE_SUM && op != MPT_REDUCE_AVG && op != MPT_REDUCE_MIN &&
      op != MPT_REDUCE_MAX)
    return MPT_FAIL(MPT_EINVAL, "all-reduce: unknown reduction %d", (int)op);
  MPT_RETURN_IF(reduce_dtype_check(dtype, op, "all-reduce"));
  if (count > 0 && (!sendbuf || !recvbuf))
    return MPT_FAIL(MPT_EINVAL, "all-reduce: NULL buffer with count %lld", (long long)count);
  size_t nbytes = (size_t)count * mpt_dtype_size(dtype);
  if (sendbuf != recvbuf && overlap(sendbuf, nbytes, recvbuf, nbytes))
    return MPT_FAIL(MPT_EINVAL, "all-reduce: send and receive buffers overlap without being equal "
                    "(pass the same pointer for in place)");
  *coll = (mpt__coll){MPT__COLL_ALLREDUCE, 0, sendbuf, recvbuf, count, dtype, (int)op, -1, {0}};
  return MPT_OK;
}

static mpt_status broadcast_prep(mpt_comm *comm, void *buf, int64_t count, mpt_dtype dtype,
                                 int root, mpt__coll *coll) {
  MPT_RETURN_IF(check_common(comm, count, dtype, "broadcast"));
  if (root < 0 || root >= comm->world_size)
    return MPT_FAIL(MPT_EINVAL, "broadcast: root %d is not a rank of a world of %d", root,
                    comm->world_size);
  if (count > 0 && !buf)
    return MPT_FAIL(MPT_EINVAL, "broadcast: NULL buffer with count %lld", (long long)count);
  *coll = (mpt__coll){MPT__COLL_BROADCAST, 0, buf, buf, count, dtype, root, -1, {0}};
  return MPT_OK;
}

static mpt_status allgather_prep(mpt_comm *comm, const void *sendbuf, void *recvbuf,
                                 int64_t count, mpt_dtype dtype, mpt__coll *coll) {
  MPT_RETURN_IF(check_common(comm, count, dtype, "all-gather"));
  if (count > 0 && (!sendbuf || !recvbuf))
    return MPT_FAIL(MPT_EINVAL, "all-gather: NULL buffer with count %lld", (long long)count);
  size_t nbytes = (size_t)count * mpt_dtype_size(dtype);
  const char *mine = (const char *)recvbuf + (size_t)comm->rank * nbytes;
  if (count > 0 && (const char *)sendbuf != mine &&
      overlap(sendbuf, nbytes, recvbuf, nbytes * (size_t)comm->world_size))
    return MPT_FAIL(MPT_EINVAL, "all-gather: the send buffer overlaps the receive buffer "
                    "without being this rank's block (recvbuf + rank * count for in place)");
  *coll = (mpt__coll){MPT__COLL_ALLGATHER, 0, sendbuf, recvbuf, count, dtype, 0, -1, {0}};
  return MPT_OK;
}

static mpt_status barrier_prep(mpt_comm *comm, mpt__coll *coll) {
  if (!comm) return MPT_FAIL(MPT_EINVAL, "barrier: NULL comm");
  MPT_RETURN_IF(mpt__comm_check_usable(comm));
  *coll = (mpt__coll){MPT__COLL_BARRIER, 0, NULL, NULL, 0, MPT_U8, 0, -1, {0}};
  return MPT_OK;
}

mpt_status mpt_comm_allreduce(mpt_comm *comm, mpt_stream *stream, const void *sendbuf,
                              void *recvbuf, int64_t count, mpt_dtype dtype, mpt_reduce_op op) {
  mpt__coll coll;
  MPT_RETURN_IF(allreduce_prep(comm, sendbuf, recvbuf, count, dtype, op, &coll));
  return dispatch(comm, stream, &coll);
}

mpt_status mpt_comm_broadcast(mpt_comm *comm, mpt_stream *stream, void *buf, int64_t count,
                              mpt_dtype dtype, int root) {
  mpt__coll coll;
  MPT_RETURN_IF(broadcast_prep(comm, buf, count, dtype, root, &coll));
  return dispatch(comm, stream, &coll);
}

mpt_status mpt_comm_allgather(mpt_comm *comm, mpt_stream *stream, const void *sendbuf,
                              void *recvbuf, int64_t count, mpt_dtype dtype) {
  mpt__coll coll;
  MPT_RETURN_IF(allgather_prep(comm, sendbuf, recvbuf, count, dtype, &coll));
  return dispatch(comm, stream, &coll);
}

mpt_status mpt_comm_reduce_scatter(mpt_comm *comm, mpt_stream *stream, const void *sendbuf,
                                   void *recvbuf, int64_t count, mpt_dtype dtype,
                                   mpt_reduce_op op) {
  mpt__coll coll;
  MPT_RETURN_IF(reduce_scatter_prep(comm, sendbuf, recvbuf, count, dtype, op, &coll));
  return dispatch(comm, stream, &coll);
}

mpt_status mpt_comm_allgather_shards(mpt_comm *comm, mpt_stream *stream, void *buf,
                                     int64_t count, mpt_dtype dtype) {
  mpt__coll coll;
  MPT_RETURN_IF(allgather_shards_prep(comm, buf, count, dtype, &coll));
  return dispatch(comm, stream, &coll);
}

mpt_status mpt_comm_barrier(mpt_comm *comm, mpt_stream *stream) {
  mpt__coll coll;
  MPT_RETURN_IF(barrier_prep(comm, &coll));
  return dispatch(comm, stream, &coll);
}

/* ---- synchronous wrappers ---------------------------------------------------------------- */

/* Enqueues `coll` on the comm's own stream (prep status `st`), records the sync event and
 * waits with the waiter's deadline (comm_wait.c; in polling mode it backs up the worker's own
 * deadline, as mpt_comm_wait_event does). */
static mpt_status sync_run(mpt_comm *comm, mpt_status st, mpt__coll *coll) {
  if (st != MPT_OK) return st;
  pthread_mutex_lock(&comm->sync_mutex);
  st = dispatch(comm, NULL, coll);
  if (st == MPT_OK) st = mpt_event_record(comm->sync_event, comm->stream);
  if (st == MPT_OK) {
    double grace_ms = 0;
    if (!comm->config.blocking) {
      grace_ms = comm->config.timeout_ms / 10;
      if (grace_ms < 1000) grace_ms = 1000;
    }
    st = mpt__comm_wait_deadline(comm, comm->sync_event, coll, grace_ms);
  }
  pthread_mutex_unlock(&comm->sync_mutex);
  return st;
}

mpt_status mpt_comm_allreduce_sync(mpt_comm *comm, const void *sendbuf, void *recvbuf,
                                   int64_t count, mpt_dtype dtype, mpt_reduce_op op) {
  mpt__coll coll;
  return sync_run(comm, allreduce_prep(comm, sendbuf, recvbuf, count, dtype, op, &coll), &coll);
}

mpt_status mpt_comm_broadcast_sync(mpt_comm *comm, void *buf, int64_t count, mpt_dtype dtype,
                                   int root) {
  mpt__coll coll;
  return sync_run(comm, broadcast_prep(comm, buf, count, dtype, root, &coll), &coll);
}

mpt_status mpt_comm_allgather_sync(mpt_comm *comm, const void *sendbuf, void *recvbuf,
                                   int64_t count, mpt_dtype dtype) {
  mpt__coll coll;
  return sync_run(comm, allgather_prep(comm, sendbuf, recvbuf, count, dtype, &coll), &coll);
}

mpt_status mpt_comm_reduce_scatter_sync(mpt_comm *comm, const void *sendbuf, void *recvbuf,
                                        int64_t count, mpt_dtype dtype, mpt_reduce_op op) {
  mpt__coll coll;
  return sync_run(comm, reduce_scatter_prep(comm, sendbuf, recvbuf, count, dtype, op, &coll),
                  &coll);
}

mpt_status mpt_comm_allgather_shards_sync(mpt_comm *comm, void *buf, int64_t count,
                                          mpt_dtype dtype) {
  mpt__coll coll;
  return sync_run(comm, allgather_shards_prep(comm, buf, count, dtype, &coll), &coll);
}

mpt_status mpt_comm_barrier_sync(mpt_comm *comm) {
  mpt__coll coll;
  return sync_run(comm, barrier_prep(comm, &coll), &coll);
}
