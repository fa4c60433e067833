/* Device binding (comm.h "device binding"; docs/faults.md F11, F12): which device a rank uses, and
 * the check, across ranks, that no two ranks of one host use one device.
 *
 * The rule is one device per rank, by local rank (the rank among the processes of the host, as
 * MPI_COMM_TYPE_SHARED gives it; torchrun's LOCAL_RANK, Horovod's local_rank): local rank r
 * uses device r of the devices visible to it. A local rank at or beyond the visible count is an
 * error that names both numbers, never a modulo (a modulo puts two ranks on one GPU, which NCCL
 * does not support: it hangs or fails deep inside init). Launcher variables (SLURM_LOCALID,
 * OMPI_COMM_WORLD_LOCAL_RANK) are not read here: a stale SLURM_LOCALID inherited by every rank
 * of an mpirun job would put them all on device 0.
 *
 * The pure parts (pick, claim, check) take plain values so that tests drive them with fake
 * device lists; the collective parts gather one fixed-size claim per rank over an MPI comm with
 * host buffers (one all-gather of bytes, with the comm's deadline) and run the same check on
 * every rank, so every rank fails together with the same words instead of some ranks waiting
 * for a partner that already gave up.
 *
 * Physical identity (comm.h "device binding"): with real CUDA devices each claim carries the
 * UUIDs (or PCI bus ids) of the rank's visible devices, and mpt_device_assign gives each local
 * rank of a host, in order, the first device of its own list not taken by a lower one; the
 * duplicate check compares identities, so per-rank CUDA_VISIBLE_DEVICES (every rank seeing one
 * "cuda:0") binds, and two ranks on one physical GPU are caught whatever their ordinals.
 *
 * Runs on the caller's thread. No state. */
#include "config.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_impl.h"
#ifdef MPT_HAVE_CUDA
#include "core/cuda/cuda.h"
#endif

/* The most offenders a message lists by name (the rest are counted). */
enum { MAX_NAMED = 4 };

static const char *type_name(int type) { return type == MPT_DEVICE_CUDA ? "cuda" : "cpu"; }

mpt_status mpt_device_pick(int local_rank, int local_size, int visible_count, int *index) {
  if (!index) return MPT_FAIL(MPT_EINVAL, "device pick: NULL output");
  *index = -1;
  if (local_rank < 0 || local_size < 1 || local_rank >= local_size || visible_count < 0)
    return MPT_FAIL(MPT_EINVAL,
                    "device pick: local rank %d of %d local ranks with %d visible devices is out "
                    "of range",
                    local_rank, local_size, visible_count);
  if (local_rank >= visible_count)
    return MPT_FAIL(MPT_EINVAL,
                    "local rank %d (of %d on this host) has no device: %d visible device%s (one "
                    "device per rank by local rank, never a modulo: run at most %d rank%s per "
                    "host, or make more devices visible)",
                    local_rank, local_size, visible_count, visible_count == 1 ? "" : "s",
                    visible_count, visible_count == 1 ? "" : "s");
  *index = local_rank;
  return MPT_OK;
}

/* 64-bit FNV-1a (Fowler, Noll, Vo). */
static uint64_t fnv1a64(const char *s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (; *s; s++) {
    h ^= (unsigned char)*s;
    h *= 0x100000001b3ULL;
  }
  return h;
}

void mpt_device_claim_fill(mpt_device_claim *claim, int rank, int local_rank, int local_size,
                           mpt_device_type type, int index, int visible_count,
                           const char *host) {
  if (!claim) return;
  memset(claim, 0, sizeof *claim); /* no stray padding bytes in the gathered record */
  claim->rank = rank;
  claim->local_rank = local_rank;
  claim->local_size = local_size;
  claim->index = index;
  claim->visible_count = visible_count;
  claim->type = (int32_t)type;
  if (!host) host = "";
  claim->host_hash = fnv1a64(host);
  snprintf(claim->host, sizeof claim->host, "%s", host);
}

void mpt_device_claim_set_ids(mpt_device_claim *claim,
                              const uint8_t (*ids)[MPT_DEVICE_UID_NBYTES], int n) {
  if (!claim || n < 0 || (n > 0 && !ids)) return;
  claim->visible_count = n;
  claim->nids = n < MPT_DEVICE_LIST_MAX ? n : MPT_DEVICE_LIST_MAX;
  memset(claim->visible_ids, 0, sizeof claim->visible_ids);
  for (int k = 0; k < claim->nids; k++)
    memcpy(claim->visible_ids[k], ids[k], MPT_DEVICE_UID_NBYTES);
}

static int uid_known(const uint8_t *u) {
  for (int i = 0; i < MPT_DEVICE_UID_NBYTES; i++)
    if (u[i]) return 1;
  return 0;
}

/* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" (nvidia-smi's spelling), or "PCI 0000:65:00". */
static const char *uid_str(const uint8_t *u, char *buf, size_t nbytes) {
  if (memcmp(u, "pci", 3) == 0) {
    const unsigned dom = (unsigned)u[3] | (unsigned)u[4] << 8 | (unsigned)u[5] << 16 |
                         (unsigned)u[6] << 24;
    snprintf(buf, nbytes, "PCI %04x:%02x:%02x", dom, u[7], u[8]);
    return buf;
  }
  size_t used = 0;
  used += (size_t)snprintf(buf, nbytes, "GPU-");
  for (int i = 0; i < MPT_DEVICE_UID_NBYTES && used < nbytes; i++)
    used += (size_t)snprintf(buf + used, nbytes - used, "%s%02x",
                             i == 4 || i == 6 || i == 8 || i == 10 ? "-" : "", u[i]);
  return buf;
}

static int same_host(const mpt_device_claim *a, const mpt_device_claim *b) {
  return a->host_hash == b->host_hash &&
         strncmp(a->host, b->host, sizeof a->host) == 0;
}

/* Appends to buf at *used (never past nbytes; text is cut when it does not fit). */
static void append(char *buf, size_t nbytes, size_t *used, const char *fmt, ...)
    MPT_PRINTF(4, 5);
static void append(char *buf, size_t nbytes, size_t *used, const char *fmt, ...) {
  if (*used >= nbytes) return;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf + *used, nbytes - *used, fmt, ap);
  va_end(ap);
  if (n > 0) *used += (size_t)n;
  if (*used > nbytes) *used = nbytes;
}

/* Host names as stored (truncated, always NUL-terminated by claim_fill; terminated here too in
 * case a claim came from elsewhere). */
static const char *host_of(const mpt_device_claim *c, char *buf, size_t nbytes) {
  snprintf(buf, nbytes, "%.*s", (int)sizeof c->host, c->host);
  return buf;
}

/* Local ranks first, then ranks: the order in which the ranks of a host choose. */
static int before(const mpt_device_claim *a, const mpt_device_claim *b) {
  return a->local_rank != b->local_rank ? a->local_rank < b->local_rank : a->rank < b->rank;
}

mpt_status mpt_device_assign(mpt_device_claim *claims, int n) {
  if (n < 0 || (n > 0 && !claims))
    return MPT_FAIL(MPT_EINVAL, "device assign: %d claims at %p", n, (void *)claims);
  unsigned char *decided = calloc((size_t)n + 1, 1);
  if (!decided) return MPT_FAIL(MPT_ENOMEM, "cannot allocate the device assignment");
  for (int i = 0; i < n; i++) {
    claims[i].index = -1;
    memset(claims[i].uid, 0, sizeof claims[i].uid);
  }
  /* Each claim in turn, by (local rank, rank): the claims decided before it are final. */
  for (int round = 0; round < n; round++) {
    int next = -1;
    for (int i = 0; i < n; i++)
      if (!decided[i] && (next < 0 || before(&claims[i], &claims[next]))) next = i;
    mpt_device_claim *c = &claims[next];
    decided[next] = 1;
    if (c->nids <= 0) { /* no identities: by ordinal, as mpt_device_pick */
      if (c->local_rank >= 0 && c->local_rank < c->visible_count) c->index = c->local_rank;
      continue;
    }
    for (int k = 0; k < c->nids && c->index < 0; k++) {
      int taken = 0;
      for (int j = 0; j < n && !taken; j++)
        taken = j != next && decided[j] && claims[j].index >= 0 && same_host(&claims[j], c) &&
                memcmp(claims[j].uid, c->visible_ids[k], MPT_DEVICE_UID_NBYTES) == 0;
      if (!taken) {
        c->index = k;
        memcpy(c->uid, c->visible_ids[k], MPT_DEVICE_UID_NBYTES);
      }
    }
  }
  free(decided);
  return MPT_OK;
}

/* The lowest rank of c's host that holds one of c's visible devices (-1: none). */
static int holder_of(const mpt_device_claim *claims, int n, const mpt_device_claim *c,
                     char *dev, size_t nbytes) {
  for (int k = 0; k < c->nids; k++)
    for (int j = 0; j < n; j++)
      if (&claims[j] != c && claims[j].index >= 0 && same_host(&claims[j], c) &&
          memcmp(claims[j].uid, c->visible_ids[k], MPT_DEVICE_UID_NBYTES) == 0) {
        uid_str(c->visible_ids[k], dev, nbytes);
        return (int)claims[j].rank;
      }
  return -1;
}

static mpt_status check_missing(const mpt_device_claim *claims, int n) {
  char msg[1024], host[72];
  size_t used = 0;
  int found = 0;
  for (int i = 0; i < n; i++) {
    const mpt_device_claim *c = &claims[i];
    if (c->index >= 0) continue;
    if (found == 0) append(msg, sizeof msg, &used, "no %s device for ", type_name(c->type));
    char dev[64];
    const int holder = c->nids == 1 ? holder_of(claims, n, c, dev, sizeof dev) : -1;
    if (found < MAX_NAMED && holder >= 0)
      append(msg, sizeof msg, &used, "%slocal rank %d (rank %d) on host %s: its only visible "
             "device %s is used by rank %d (the same physical GPU)", found ? "; " : "",
             (int)c->local_rank, (int)c->rank, host_of(c, host, sizeof host), dev, holder);
    else if (found < MAX_NAMED)
      append(msg, sizeof msg, &used,
             "%slocal rank %d (rank %d) on host %s: %d visible %s device%s for %d local ranks",
             found ? "; " : "", (int)c->local_rank, (int)c->rank, host_of(c, host, sizeof host),
             (int)c->visible_count, type_name(c->type), c->visible_count == 1 ? "" : "s",
             (int)c->local_size);
    found++;
  }
  if (found == 0) return MPT_OK;
  if (found > MAX_NAMED) append(msg, sizeof msg, &used, "; and %d more", found - MAX_NAMED);
  return MPT_FAIL(MPT_EINVAL,
                  "%s (one device per rank by local rank, never a modulo: run at most as many "
                  "ranks per host as it has visible devices, or make more devices visible)",
                  msg);
}

static mpt_status check_duplicates(const mpt_device_claim *claims, int n) {
  char msg[1024], host[72];
  size_t used = 0;
  int found = 0;
  for (int i = 0; i < n; i++) {
    for (int j = i + 1; j < n; j++) {
      const mpt_device_claim *a = &claims[i], *b = &claims[j];
      if (a->index < 0 || b->index < 0 || a->type != b->type || !same_host(a, b)) continue;
      const int by_uid = uid_known(a->uid) && uid_known(b->uid);
      if (by_uid ? memcmp(a->uid, b->uid, MPT_DEVICE_UID_NBYTES) != 0 : a->index != b->index)
        continue;
      char dev[64];
      if (by_uid)
        uid_str(a->uid, dev, sizeof dev);
      else
        snprintf(dev, sizeof dev, "%s:%d", type_name(a->type), (int)a->index);
      if (found < MAX_NAMED)
        append(msg, sizeof msg, &used, "%sranks %d and %d both use %s on host %s (local ranks "
               "%d and %d)", found ? "; " : "", (int)a->rank, (int)b->rank, dev,
               host_of(a, host, sizeof host), (int)a->local_rank, (int)b->local_rank);
      found++;
    }
  }
  if (found == 0) return MPT_OK;
  if (found > MAX_NAMED) append(msg, sizeof msg, &used, "; and %d more pairs", found - MAX_NAMED);
  return MPT_FAIL(MPT_EMISMATCH,
                  "%s: two ranks of one host cannot share a device (NCCL does not support it); "
                  "check CUDA_VISIBLE_DEVICES and --device, and that every rank of a host binds "
                  "by its local rank",
                  msg);
}

mpt_status mpt_device_claims_check(const mpt_device_claim *claims, int n) {
  if (n < 0 || (n > 0 && !claims))
    return MPT_FAIL(MPT_EINVAL, "device check: %d claims at %p", n, (const void *)claims);
  for (int i = 1; i < n; i++)
    if (claims[i].type != claims[0].type)
      return MPT_FAIL(MPT_EINVAL, "ranks disagree on the device type: rank %d binds to %s "
                      "devices, rank %d to %s devices", (int)claims[0].rank,
                      type_name(claims[0].type), (int)claims[i].rank, type_name(claims[i].type));
  MPT_RETURN_IF(check_missing(claims, n));
  return check_duplicates(claims, n);
}

/* ---- collective ------------------------------------------------------------------------- */

/* Gathers every rank's claim (`mine`; its index may be -1), assigns devices by identity when
 * `assign` (mine->index then becomes this rank's), and checks them on every rank. */
static mpt_status gather_and_check(mpt_comm *comm, mpt_device_claim *mine, int assign) {
  if (comm->config.device.type != MPT_DEVICE_CPU || comm->backend != &mpt__comm_mpi_backend)
    return MPT_FAIL(MPT_EINVAL, "device check: needs a comm on host memory (the MPI backend "
                    "with device cpu), created before the device comm");
  mpt_device_claim *all = calloc((size_t)comm->world_size, sizeof *all);
  if (!all) return MPT_FAIL(MPT_ENOMEM, "cannot allocate %d device claims", comm->world_size);
  mpt_status st = mpt_comm_allgather_sync(comm, mine, all, (int64_t)sizeof *mine, MPT_U8);
  if (st == MPT_OK && assign) st = mpt_device_assign(all, comm->world_size);
  if (st == MPT_OK) {
    *mine = all[comm->rank];
    st = mpt_device_claims_check(all, comm->world_size);
  }
  free(all);
  return st;
}

/* The identities of the real CUDA devices visible to this process (0: none known). */
static int real_ids(uint8_t (*ids)[MPT_DEVICE_UID_NBYTES], int max) {
  int n = 0;
#ifdef MPT_HAVE_CUDA
  const int count = mpt_device_count(MPT_DEVICE_CUDA);
  for (int k = 0; k < count && k < max; k++, n++)
    if (mpt__cuda_device_uid(k, ids[k]) != MPT_OK) return 0; /* by ordinal, then */
#else
  (void)ids;
  (void)max;
#endif
  return n;
}

mpt_status mpt_comm_check_devices(mpt_comm *comm, mpt_device device) {
  if (!comm) return MPT_FAIL(MPT_EINVAL, "device check: NULL comm");
  mpt_device_claim mine;
  mpt_device_claim_fill(&mine, comm->rank, comm->local_rank, comm->local_size, device.type,
                        device.index, -1, comm->hostname);
#ifdef MPT_HAVE_CUDA
  /* A real device is compared by identity (per-rank CUDA_VISIBLE_DEVICES make ordinals
   * meaningless across ranks); a fake one (tests) by index. */
  if (device.type == MPT_DEVICE_CUDA && device.index >= 0 &&
      device.index < mpt_device_count(MPT_DEVICE_CUDA) &&
      mpt__cuda_device_uid(device.index, mine.uid) != MPT_OK)
    memset(mine.uid, 0, sizeof mine.uid);
#endif
  return gather_and_check(comm, &mine, 0);
}

mpt_status mpt_comm_bind_device(mpt_comm *comm, mpt_device_type type, int visible_count,
                                mpt_device *device) {
  if (!comm || !device) return MPT_FAIL(MPT_EINVAL, "bind_device: NULL comm or device");
  *device = mpt_device_cpu();
  if (type == MPT_DEVICE_CPU) return MPT_OK; /* CPU "devices" share the host: nothing to bind */
  if (type != MPT_DEVICE_CUDA)
    return MPT_FAIL(MPT_EINVAL, "bind_device: unknown device type %d", (int)type);
  const int real = visible_count < 0;
  const int visible = real ? mpt_device_count(type) : visible_count;
  mpt_device_claim mine;
  mpt_device_claim_fill(&mine, comm->rank, comm->local_rank, comm->local_size, type, -1,
                        visible, comm->hostname);
  if (real) {
    uint8_t ids[MPT_DEVICE_LIST_MAX][MPT_DEVICE_UID_NBYTES];
    const int nids = real_ids(ids, MPT_DEVICE_LIST_MAX);
    if (nids > 0) mpt_device_claim_set_ids(&mine, (const uint8_t(*)[MPT_DEVICE_UID_NBYTES])ids,
                                           nids);
    mine.visible_count = visible;
  }
  /* A rank left without a device still takes part in the gather, so that every rank learns of
   * it and fails with the same words. */
  MPT_RETURN_IF(gather_and_check(comm, &mine, 1));
  mpt_device d = {type, (int)mine.index};
  if (real) MPT_RETURN_IF(mpt_device_set_current(d));
  *device = d;
  return MPT_OK;
}
