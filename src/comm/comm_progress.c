/* Progress records: who held up a collective that timed out (the "culprit", as PyTorch's flight
 * recorder and Horovod's stall inspector name it).
 *
 * A waiter that times out knows only that its collective did not complete; the rank that never
 * arrived cannot be asked, since it does not respond. So every rank publishes, for each comm,
 * the number of collectives it has started and completed (sequence number of the last + 1) in
 * an MPI-3 shared-memory window (MPI_Win_allocate_shared over the ranks of its host), where the
 * others read them with plain loads, without any help from the publisher: a rank stopped by
 * SIGSTOP, stuck in a computation or dead still has its last values there. On expiry the waiter
 * classifies every rank of its host against the collective's sequence number S: "waiting in it"
 * (started > S, completed <= S, process running), "done with it" (completed S, running: its part
 * of the algorithm ended before a peer stopped) or "holding it up" (never started S, or its
 * process is stopped or gone: /proc/PID/stat and kill(PID, 0), valid on one host).
 *
 * Across hosts. Shared memory reaches only the ranks of one host, and passive-target RMA over a
 * network needs the target's progress in Open MPI 4.1 (a stopped rank gives none), so the report
 * covers the reporter's own host and counts the ranks of other hosts as not visible. Every rank
 * that times out prints its host's view, so the culprit is named by whichever host it shares
 * with a waiter; a culprit alone on its host shows up as the one rank no report places "waiting
 * in it".
 *
 * One window per process, made by the first mpt_comm_init (collective over MPI_COMM_WORLD, so
 * every rank creates its comms in the same order and comm k uses column k of the records, up to
 * MAX_COMMS comms; later ones publish nothing). Freed by mpt_comm_finalize before MPI_Finalize
 * (MPI_Win_free is collective, so never from mpt_comm_free, which must not wait for peers).
 * Stores and loads are C11 atomics (lock-free 64-bit, address-free on the targets we build for)
 * inside a passive-target epoch opened once (MPI_Win_lock_all), the "unified" memory model of
 * MPI-3 shared windows. If the window cannot be made (no shared-memory support), the comm works
 * as before and reports say so. Any thread. */
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include "comm/comm_impl.h"

enum { MAX_COMMS = 64 }; /* 1 KiB per rank */

typedef struct slot {
  _Atomic uint64_t started[MAX_COMMS];   /* per comm: last started sequence number + 1 */
  _Atomic uint64_t completed[MAX_COMMS]; /* per comm: last completed sequence number + 1 */
  _Atomic int64_t pid;
} slot;

static struct {
  int ready;     /* the window exists (set once by the first bootstrap) */
  int tried;     /* the first bootstrap tried to make it */
  int have_win;  /* win exists (to be freed by mpt__progress_finalize) */
  char why[256]; /* why there is none */
  MPI_Win win;
  int nlocal, me;
  slot **slots;     /* [nlocal] this host's ranks' records */
  int *world_rank;  /* [nlocal] */
  int ncomms;       /* comms created so far (column of the next one) */
  char host[256];
} g;

void mpt__progress_init(mpt_comm *c, MPI_Comm node) {
  c->progress_index = -1;
  if (!g.tried) {
    g.tried = 1;
    snprintf(g.host, sizeof g.host, "%s", c->hostname);
    MPI_Group node_group = MPI_GROUP_NULL, world_group = MPI_GROUP_NULL;
    slot *mine = NULL;
    int rc = MPI_Comm_size(node, &g.nlocal);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(node, &g.me);
    if (rc == MPI_SUCCESS)
      rc = MPI_Win_allocate_shared((MPI_Aint)sizeof(slot), 1, MPI_INFO_NULL, node, &mine, &g.win);
    if (rc != MPI_SUCCESS) {
      int len = 0;
      char text[MPI_MAX_ERROR_STRING] = "";
      MPI_Error_string(rc, text, &len);
      snprintf(g.why, sizeof g.why, "no shared-memory window for progress records: %s", text);
      return;
    }
    g.have_win = 1;
    MPI_Win_set_errhandler(g.win, MPI_ERRORS_RETURN); /* windows default to fatal errors */
    memset(mine, 0, sizeof *mine);
    atomic_store(&mine->pid, (int64_t)getpid());
    g.slots = calloc((size_t)g.nlocal, sizeof *g.slots);
    g.world_rank = calloc((size_t)g.nlocal, sizeof *g.world_rank);
    int *local = calloc((size_t)g.nlocal, sizeof *local);
    rc = g.slots && g.world_rank && local ? MPI_SUCCESS : MPI_ERR_NO_MEM;
    for (int q = 0; rc == MPI_SUCCESS && q < g.nlocal; q++) {
      MPI_Aint size;
      int disp;
      local[q] = q;
      rc = MPI_Win_shared_query(g.win, q, &size, &disp, &g.slots[q]);
    }
    if (rc == MPI_SUCCESS) rc = MPI_Comm_group(node, &node_group);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_group(MPI_COMM_WORLD, &world_group);
    if (rc == MPI_SUCCESS)
      rc = MPI_Group_translate_ranks(node_group, g.nlocal, local, world_group, g.world_rank);
    if (rc == MPI_SUCCESS) rc = MPI_Win_lock_all(MPI_MODE_NOCHECK, g.win);
    if (node_group != MPI_GROUP_NULL) MPI_Group_free(&node_group);
    if (world_group != MPI_GROUP_NULL) MPI_Group_free(&world_group);
    free(local);
    if (rc != MPI_SUCCESS) { /* the window stays (freeing it is collective) but is not used */
      snprintf(g.why, sizeof g.why, "the progress records could not be set up (MPI error %d)", rc);
      return;
    }
    g.ready = 1;
  }
  /* NCCL collectives run on a CUDA stream and never enter the in-flight list: such a comm
   * publishes nothing (its records would claim that no rank started anything). */
  if (g.ready && g.ncomms < MAX_COMMS && !c->backend->stream_on_device)
    c->progress_index = g.ncomms;
  g.ncomms++;
}

void mpt__progress_finalize(void) {
  if (!g.have_win) return;
  if (g.ready) MPI_Win_unlock_all(g.win);
  MPI_Win_free(&g.win);
  free(g.slots);
  free(g.world_rank);
  memset(&g, 0, sizeof g);
}

/* Raises *v to x (records only grow, whichever thread publishes). */
static void raise_to(_Atomic uint64_t *v, uint64_t x) {
  uint64_t old = atomic_load_explicit(v, memory_order_relaxed);
  while (old < x && !atomic_compare_exchange_weak_explicit(v, &old, x, memory_order_release,
                                                           memory_order_relaxed)) {
  }
}

void mpt__progress_started(const mpt_comm *c, uint64_t seq) {
  if (c->progress_index >= 0) raise_to(&g.slots[g.me]->started[c->progress_index], seq + 1);
}

void mpt__progress_completed(const mpt_comm *c, uint64_t seq) {
  if (c->progress_index >= 0) raise_to(&g.slots[g.me]->completed[c->progress_index], seq + 1);
}

/* The state of process `pid` of this host: "" running (or unknown), else a phrase. */
static const char *process_state(int64_t pid, char *buf, size_t nbytes) {
  buf[0] = '\0';
  if (pid <= 0) return buf;
  if (kill((pid_t)pid, 0) != 0 && errno == ESRCH) {
    snprintf(buf, nbytes, "process %lld has exited", (long long)pid);
    return buf;
  }
  char path[64], line[512];
  snprintf(path, sizeof path, "/proc/%lld/stat", (long long)pid);
  FILE *f = fopen(path, "r");
  if (!f) return buf;
  char *close_paren = NULL;
  if (fgets(line, sizeof line, f)) close_paren = strrchr(line, ')');
  fclose(f);
  if (!close_paren || close_paren[1] != ' ') return buf;
  switch (close_paren[2]) {
    case 'T':
      snprintf(buf, nbytes, "process %lld is stopped (SIGSTOP or job control)", (long long)pid);
      break;
    case 't':
      snprintf(buf, nbytes, "process %lld is stopped by a debugger", (long long)pid);
      break;
    case 'Z':
    case 'X':
      snprintf(buf, nbytes, "process %lld has exited", (long long)pid);
      break;
    default:
      break;
  }
  return buf;
}

/* Appends printf-style text to buf (size nbytes, *used so far), never past its end. */
static void append(char *buf, size_t nbytes, size_t *used, const char *fmt, ...)
    MPT_PRINTF(4, 5);
static void append(char *buf, size_t nbytes, size_t *used, const char *fmt, ...) {
  if (*used >= nbytes) return;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf + *used, nbytes - *used, fmt, ap);
  va_end(ap);
  if (n > 0) *used = *used + (size_t)n < nbytes ? *used + (size_t)n : nbytes;
}

void mpt__progress_describe(const mpt_comm *c, uint64_t seq, char *buf, size_t nbytes) {
  size_t used = 0;
  buf[0] = '\0';
  if (c->progress_index < 0) {
    append(buf, nbytes, &used, " (%s)",
           g.why[0] ? g.why
                    : "no progress records for this comm: NCCL, or more comms than they hold");
    return;
  }
  const int k = c->progress_index;
  char waiting[512] = "", past[512] = "", holding[1536] = "";
  size_t nw = 0, np = 0, nh = 0;
  int count_w = 0, count_p = 0, count_h = 0;
  for (int q = 0; q < g.nlocal; q++) {
    const slot *s = g.slots[q];
    uint64_t st = atomic_load_explicit(&s->started[k], memory_order_acquire);
    uint64_t done = atomic_load_explicit(&s->completed[k], memory_order_acquire);
    char state[160];
    process_state(q == g.me ? 0 : atomic_load(&s->pid), state, sizeof state);
    if (st > seq && !state[0]) { /* running, and reached it: waiting in it, or past it */
      if (done <= seq)
        append(waiting, sizeof waiting, &nw, "%s%d", count_w++ ? ", " : "", g.world_rank[q]);
      else /* its part finished (e.g. it got the result before a peer stopped) */
        append(past, sizeof past, &np, "%s%d", count_p++ ? ", " : "", g.world_rank[q]);
      continue;
    }
    char last[96];
    if (st == 0)
      snprintf(last, sizeof last, "no collective started yet");
    else if (done == 0)
      snprintf(last, sizeof last, "last collective started #%llu, none completed",
               (unsigned long long)(st - 1));
    else
      snprintf(last, sizeof last, "last collective started #%llu, completed #%llu",
               (unsigned long long)(st - 1), (unsigned long long)(done - 1));
    const char *where = st <= seq ? "never started it" : done > seq ? "completed it" : "inside it";
    append(holding, sizeof holding, &nh, "%srank %d (%s; %s; %s)", count_h++ ? "; " : "",
           g.world_rank[q], where, state[0] ? state : "process running", last);
  }
  append(buf, nbytes, &used, "; on host %s (shared-memory progress records): ", g.host);
  if (count_h)
    append(buf, nbytes, &used, "holding it up: %s", holding);
  else
    append(buf, nbytes, &used, "no rank of this host holds it up");
  if (count_w)
    append(buf, nbytes, &used, "; waiting in it: %s %s", count_w > 1 ? "ranks" : "rank", waiting);
  if (count_p)
    append(buf, nbytes, &used, "; done with it: %s %s", count_p > 1 ? "ranks" : "rank", past);
  int others = c->world_size - g.nlocal, listed = 0;
  if (others > 0) {
    append(buf, nbytes, &used, "; not visible from this host (see their hosts' reports): rank%s ",
           others > 1 ? "s" : "");
    for (int r = 0; r < c->world_size && listed < 8; r++) {
      int local = 0;
      for (int q = 0; q < g.nlocal && !local; q++) local = g.world_rank[q] == r;
      if (!local) append(buf, nbytes, &used, "%s%d", listed++ ? ", " : "", r);
    }
    if (others > listed) append(buf, nbytes, &used, " and %d more", others - listed);
  }
}
