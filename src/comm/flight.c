/* The flight recorder (comm.h "Flight recorder", docs/hangs.md): each comm keeps its last N
 * collectives in a ring of preallocated entries (sequence number, op, dtype, count, the caller's
 * tag: global step and purpose; times enqueued / started / finished; state), and writes them on
 * demand to a text file a person or `mpitrain hang-report` reads.
 *
 * Invariants: entry k of the ring holds collective seq with seq % N == k, or is empty (seq_plus1
 * 0). The issuing thread fills an entry at enqueue (dispatch in comm.c) and publishes it by the
 * release store of seq_plus1; the thread that runs the collective marks start and end with
 * relaxed atomic stores, only while the entry still holds its seq. No lock anywhere: the cost
 * on the hot path is one entry's stores per collective (measured in docs/hangs.md).
 *
 * The dump is async-signal-safe (a fatal-signal handler calls it): open / write / close / mkdir
 * only, text formatted here by hand, no allocation, no lock, nothing from stdio. It is written
 * line by line, so a rank killed mid-write leaves every line before the cut; the last line
 * ("end N") says the file is whole. A dump taken while collectives run may see an entry being
 * refilled: the reader checks seq before and after copying it and skips a changed one.
 *
 * Runs on: enqueue on the issuing thread, start / end on the comm stream's thread, the dump on
 * any thread or in a signal handler. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm_impl.h"

struct mpt__flight_entry {
  atomic_uint_fast64_t seq_plus1; /* 0: empty; else the collective's seq + 1 */
  int32_t kind, dtype, arg;
  int64_t count;
  int64_t step;
  char purpose[MPT_COMM_PURPOSE_MAX];
  double enqueued_ms;
  _Atomic double started_ms, finished_ms; /* 0: not yet */
  atomic_int state;                       /* mpt__flight_state */
};

mpt_status mpt__flight_init(mpt_comm *comm) {
  comm->flight_cap = comm->config.flight_recorder;
  comm->tag_step = -1;
  if (comm->flight_cap <= 0) return MPT_OK;
  comm->flight = calloc((size_t)comm->flight_cap, sizeof *comm->flight);
  if (!comm->flight)
    return MPT_FAIL(MPT_ENOMEM, "cannot allocate the flight recorder (%lld entries)",
                    (long long)comm->flight_cap);
  return MPT_OK;
}

void mpt__flight_free(mpt_comm *comm) {
  free(comm->flight);
  comm->flight = NULL;
  free(comm->peers);
  comm->peers = NULL;
}

void mpt__flight_enqueue(mpt_comm *comm, const mpt__coll *c) {
  if (!comm->flight) return;
  mpt__flight_entry *e = &comm->flight[c->seq % (uint64_t)comm->flight_cap];
  atomic_store_explicit(&e->seq_plus1, 0, memory_order_relaxed);
  e->kind = (int32_t)c->kind;
  e->dtype = (int32_t)c->dtype;
  e->arg = c->arg;
  e->count = c->count;
  e->step = c->step;
  memcpy(e->purpose, c->purpose, sizeof e->purpose);
  e->enqueued_ms = mpt_time_ms();
  atomic_store_explicit(&e->started_ms, 0.0, memory_order_relaxed);
  atomic_store_explicit(&e->finished_ms, 0.0, memory_order_relaxed);
  atomic_store_explicit(&e->state, MPT__FLIGHT_QUEUED, memory_order_relaxed);
  atomic_store_explicit(&e->seq_plus1, c->seq + 1, memory_order_release);
}

/* The entry of `seq` while it still holds it, else NULL. */
static mpt__flight_entry *entry_of(const mpt_comm *comm, uint64_t seq) {
  if (!comm->flight) return NULL;
  mpt__flight_entry *e = &comm->flight[seq % (uint64_t)comm->flight_cap];
  return atomic_load_explicit(&e->seq_plus1, memory_order_acquire) == seq + 1 ? e : NULL;
}

void mpt__flight_started(const mpt_comm *comm, uint64_t seq) {
  mpt__flight_entry *e = entry_of(comm, seq);
  if (!e) return;
  atomic_store_explicit(&e->started_ms, mpt_time_ms(), memory_order_relaxed);
  atomic_store_explicit(&e->state, MPT__FLIGHT_RUNNING, memory_order_relaxed);
}

void mpt__flight_finished(const mpt_comm *comm, uint64_t seq, mpt_status status) {
  mpt__flight_entry *e = entry_of(comm, seq);
  if (!e) return;
  atomic_store_explicit(&e->finished_ms, mpt_time_ms(), memory_order_relaxed);
  atomic_store_explicit(&e->state, status == MPT_OK ? MPT__FLIGHT_DONE : MPT__FLIGHT_FAILED,
                        memory_order_relaxed);
}

/* ---- the peers' hosts and pids (gathered at init, for the reports) ------------------------ */

mpt_status mpt__flight_gather_peers(mpt_comm *c, double deadline_ms) {
  mpt__flight_peer mine;
  memset(&mine, 0, sizeof mine);
  mine.pid = (int32_t)getpid();
  size_t n = strlen(c->hostname);
  if (n >= sizeof mine.host) n = sizeof mine.host - 1;
  memcpy(mine.host, c->hostname, n);
  c->peers = calloc((size_t)c->world_size, sizeof *c->peers);
  if (!c->peers) return MPT_FAIL(MPT_ENOMEM, "cannot allocate the table of ranks' hosts");
  MPI_Request req;
  int done = 0;
  int rc = MPI_Iallgather(&mine, (int)sizeof mine, MPI_BYTE, c->peers, (int)sizeof mine,
                          MPI_BYTE, c->mpi_comm, &req);
  if (rc == MPI_SUCCESS) rc = mpt__mpi_wait_until(&req, deadline_ms, &done);
  if (rc != MPI_SUCCESS)
    return MPT_MPI_FAIL(rc, c->rank, "MPI_Iallgather of the ranks' hosts (bootstrap)");
  if (!done)
    return MPT_FAIL(MPT_ETIMEOUT, "bootstrap: the exchange of the ranks' hosts did not complete "
                    "within %g s on rank %d", c->config.timeout_ms / 1000.0, c->rank);
  for (int r = 0; r < c->world_size; r++) c->peers[r].host[sizeof c->peers[r].host - 1] = '\0';
  return MPT_OK;
}

/* ---- tags --------------------------------------------------------------------------------- */

mpt_status mpt_comm_set_purpose(mpt_comm *comm, const char *purpose) {
  if (!comm) return MPT_FAIL(MPT_EINVAL, "mpt_comm_set_purpose: NULL comm");
  size_t n = 0;
  if (purpose)
    for (; purpose[n] && n + 1 < sizeof comm->tag_purpose; n++) {
      const char ch = purpose[n];
      comm->tag_purpose[n] = ch >= ' ' && ch <= '~' ? ch : '_'; /* one line in the dump */
    }
  memset(comm->tag_purpose + n, 0, sizeof comm->tag_purpose - n);
  return MPT_OK;
}

void mpt_comm_set_step(mpt_comm *comm, int64_t step) {
  if (comm) comm->tag_step = step < 0 ? -1 : step;
}

const char *mpt_comm_rank_host(const mpt_comm *comm, int rank) {
  if (!comm || !comm->peers || rank < 0 || rank >= comm->world_size) return "";
  return comm->peers[rank].host;
}

int64_t mpt_comm_flight_capacity(const mpt_comm *comm) {
  return comm && comm->flight ? comm->flight_cap : 0;
}

/* ---- the dump ------------------------------------------------------------------------------ */

/* A line being built without stdio. */
typedef struct line {
  char buf[512];
  size_t n;
} line;

static void put_s(line *l, const char *s) {
  while (s && *s && l->n + 1 < sizeof l->buf) l->buf[l->n++] = *s++;
}

static void put_u(line *l, uint64_t v) {
  char tmp[24];
  int k = 0;
  do {
    tmp[k++] = (char)('0' + v % 10);
    v /= 10;
  } while (v && k < (int)sizeof tmp);
  while (k > 0 && l->n + 1 < sizeof l->buf) l->buf[l->n++] = tmp[--k];
}

static void put_i(line *l, int64_t v) {
  if (v < 0) {
    put_s(l, "-");
    put_u(l, (uint64_t)(-(v + 1)) + 1);
  } else {
    put_u(l, (uint64_t)v);
  }
}

/* Milliseconds with 3 decimals (microseconds). */
static void put_ms(line *l, double ms) {
  if (!(ms >= 0) || ms > 9e15) ms = 0;
  const uint64_t us = (uint64_t)(ms * 1000.0 + 0.5);
  put_u(l, us / 1000);
  put_s(l, ".");
  const uint64_t frac = us % 1000;
  if (frac < 100) put_s(l, "0");
  if (frac < 10) put_s(l, "0");
  put_u(l, frac);
}

/* Writes the line and a newline; 0 on success. */
static int flush_line(int fd, line *l) {
  if (l->n + 1 >= sizeof l->buf) l->n = sizeof l->buf - 2;
  l->buf[l->n++] = '\n';
  size_t off = 0;
  while (off < l->n) {
    ssize_t w = write(fd, l->buf + off, l->n - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    off += (size_t)w;
  }
  l->n = 0;
  return 0;
}

static const char *state_name(int s) {
  switch (s) {
    case MPT__FLIGHT_QUEUED:
      return "queued";
    case MPT__FLIGHT_RUNNING:
      return "running";
    case MPT__FLIGHT_DONE:
      return "done";
    case MPT__FLIGHT_FAILED:
      return "failed";
  }
  return "unknown";
}

/* The dtype's name without mpt_dtype_name (kept to a switch on constants: signal-safe). */
static const char *dtype_name(int d) {
  switch (d) {
    case MPT_F32:
      return "float32";
    case MPT_I32:
      return "int32";
    case MPT_U8:
      return "uint8";
    case MPT_BF16:
      return "bfloat16";
  }
  return "unknown";
}

static const char *op_name(int kind) {
  switch (kind) {
    case MPT__COLL_ALLREDUCE:
      return "all-reduce";
    case MPT__COLL_BROADCAST:
      return "broadcast";
    case MPT__COLL_ALLGATHER:
      return "all-gather";
    case MPT__COLL_BARRIER:
      return "barrier";
    case MPT__COLL_REDUCE_SCATTER:
      return "reduce-scatter";
    case MPT__COLL_ALLGATHER_SHARDS:
      return "all-gather-shards";
  }
  return "unknown";
}

/* The body of a dump into fd. 0 on success. */
static int dump_fd(const mpt_comm *comm, int fd, const char *reason) {
  line l = {.n = 0};
  struct timespec wall;
  clock_gettime(CLOCK_REALTIME, &wall);
  const uint64_t next = atomic_load(&((mpt_comm *)comm)->next_seq);
#define LINE(...)                               \
  do {                                          \
    __VA_ARGS__;                                \
    if (flush_line(fd, &l) != 0) return -1;     \
  } while (0)
  LINE(put_s(&l, "mpitrain-flight-recorder 1"));
  LINE(put_s(&l, "rank "); put_i(&l, comm->rank); put_s(&l, " of "); put_i(&l, comm->world_size));
  LINE(put_s(&l, "host "); put_s(&l, comm->hostname));
  LINE(put_s(&l, "pid "); put_i(&l, (int64_t)getpid()));
  LINE(put_s(&l, "reason "); put_s(&l, reason && reason[0] ? reason : "on request"));
  LINE(put_s(&l, "now_ms "); put_ms(&l, mpt_time_ms()));
  LINE(put_s(&l, "wall_s "); put_i(&l, (int64_t)wall.tv_sec));
  LINE(put_s(&l, "timeout_ms "); put_ms(&l, comm->config.timeout_ms));
  LINE(put_s(&l, "capacity "); put_i(&l, comm->flight ? comm->flight_cap : 0));
  LINE(put_s(&l, "next_seq "); put_u(&l, next));
  for (int r = 0; comm->peers && r < comm->world_size; r++)
    LINE(put_s(&l, "peer "); put_i(&l, r); put_s(&l, " pid "); put_i(&l, comm->peers[r].pid);
         put_s(&l, " host "); put_s(&l, comm->peers[r].host));
  int64_t written = 0;
  if (comm->flight) {
    const uint64_t cap = (uint64_t)comm->flight_cap;
    const uint64_t first = next > cap ? next - cap : 0;
    for (uint64_t seq = first; seq < next; seq++) {
      const mpt__flight_entry *e = &comm->flight[seq % cap];
      if (atomic_load_explicit(&((mpt__flight_entry *)e)->seq_plus1, memory_order_acquire) !=
          seq + 1)
        continue; /* never enqueued (count 0), or refilled since */
      mpt__flight_entry copy;
      memcpy(&copy, e, sizeof copy); /* then check it was not refilled meanwhile */
      if (atomic_load_explicit(&((mpt__flight_entry *)e)->seq_plus1, memory_order_acquire) !=
          seq + 1)
        continue;
      const int st = atomic_load_explicit(&copy.state, memory_order_relaxed);
      const double t1 = atomic_load_explicit(&copy.started_ms, memory_order_relaxed);
      const double t2 = atomic_load_explicit(&copy.finished_ms, memory_order_relaxed);
      char purpose[MPT_COMM_PURPOSE_MAX];
      memcpy(purpose, copy.purpose, sizeof purpose);
      purpose[sizeof purpose - 1] = '\0';
      LINE(put_s(&l, "c seq="); put_u(&l, seq); put_s(&l, " op="); put_s(&l, op_name(copy.kind));
           put_s(&l, " dtype="); put_s(&l, dtype_name(copy.dtype)); put_s(&l, " count=");
           put_i(&l, copy.count); put_s(&l, " arg="); put_i(&l, copy.arg); put_s(&l, " step=");
           put_i(&l, copy.step); put_s(&l, " state="); put_s(&l, state_name(st));
           put_s(&l, " enq="); put_ms(&l, copy.enqueued_ms); put_s(&l, " start=");
           put_ms(&l, t1); put_s(&l, " end="); put_ms(&l, t2); put_s(&l, " purpose=");
           put_s(&l, purpose[0] ? purpose : "-"));
      written++;
    }
  }
  LINE(put_s(&l, "end "); put_i(&l, written));
#undef LINE
  return 0;
}

/* "<dir>/flight-rank<R>.txt" into out (signal-safe); 0 when it fits. */
static int dump_path(const mpt_comm *comm, char *out, size_t n) {
  line l = {.n = 0};
  put_s(&l, comm->debug_dir);
  put_s(&l, "/flight-rank");
  put_i(&l, comm->rank);
  put_s(&l, ".txt");
  if (l.n + 1 >= sizeof l.buf || l.n + 1 > n) return -1;
  memcpy(out, l.buf, l.n);
  out[l.n] = '\0';
  return 0;
}

mpt_status mpt_comm_set_debug_dir(mpt_comm *comm, const char *dir) {
  if (!comm) return MPT_FAIL(MPT_EINVAL, "mpt_comm_set_debug_dir: NULL comm");
  if (!dir || !dir[0]) {
    comm->debug_dir[0] = '\0';
    return MPT_OK;
  }
  if (strlen(dir) + 32 >= sizeof comm->debug_dir)
    return MPT_FAIL(MPT_EINVAL, "debug folder '%s' is too long (at most %zu bytes)", dir,
                    sizeof comm->debug_dir - 32);
  memcpy(comm->debug_dir, dir, strlen(dir) + 1);
  return MPT_OK;
}

mpt_status mpt_comm_flight_path(const mpt_comm *comm, char *buf, size_t nbytes) {
  if (!comm || !buf || nbytes == 0)
    return MPT_FAIL(MPT_EINVAL, "mpt_comm_flight_path: NULL argument");
  buf[0] = '\0';
  if (!comm->debug_dir[0]) return MPT_FAIL(MPT_ESTATE, "no debug folder set for the dumps");
  if (dump_path(comm, buf, nbytes) != 0)
    return MPT_FAIL(MPT_EINVAL, "the dump's path does not fit %zu bytes", nbytes);
  return MPT_OK;
}

mpt_status mpt_comm_flight_dump(const mpt_comm *comm, const char *reason) {
  if (!comm) return MPT_EINVAL; /* no error text: this runs in signal handlers */
  if (!comm->debug_dir[0]) return MPT_ESTATE;
  char path[sizeof comm->debug_dir + 32], tmp[sizeof path + 8];
  if (dump_path(comm, path, sizeof path) != 0) return MPT_EINVAL;
  mkdir(comm->debug_dir, 0777); /* EEXIST is fine; any other failure shows at open */
  /* written beside, then renamed: a reader never sees a half-written file of a live rank;
   * a rank killed mid-write leaves the .tmp with every line written so far */
  memcpy(tmp, path, strlen(path));
  memcpy(tmp + strlen(path), ".tmp", 5);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return MPT_EIO;
  const int rc = dump_fd(comm, fd, reason);
  if (close(fd) != 0 || rc != 0) return MPT_EIO;
  return rename(tmp, path) == 0 ? MPT_OK : MPT_EIO;
}
