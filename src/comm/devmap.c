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
 * Runs on the caller's thread. No state. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_impl.h"

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

static mpt_status check_missing(const mpt_device_claim *claims, int n) {
  char msg[1024], host[72];
  size_t used = 0;
  int found = 0;
  for (int i = 0; i < n; i++) {
    const mpt_device_claim *c = &claims[i];
    if (c->index >= 0) continue;
    if (found == 0) append(msg, sizeof msg, &used, "no %s device for ", type_name(c->type));
    if (found < MAX_NAMED)
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
      if (a->index < 0 || a->index != b->index || a->type != b->type || !same_host(a, b))
        continue;
      if (found < MAX_NAMED)
        append(msg, sizeof msg, &used, "%sranks %d and %d both use %s:%d on host %s (local ranks "
               "%d and %d)", found ? "; " : "", (int)a->rank, (int)b->rank, type_name(a->type),
               (int)a->index, host_of(a, host, sizeof host), (int)a->local_rank,
               (int)b->local_rank);
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

/* Gathers every rank's claim (index may be -1) and checks them. */
static mpt_status gather_and_check(mpt_comm *comm, mpt_device_type type, int index,
                                   int visible_count) {
  if (!comm) return MPT_FAIL(MPT_EINVAL, "device check: NULL comm");
  if (comm->config.device.type != MPT_DEVICE_CPU || comm->backend != &mpt__comm_mpi_backend)
    return MPT_FAIL(MPT_EINVAL, "device check: needs a comm on host memory (the MPI backend "
                    "with device cpu), created before the device comm");
  mpt_device_claim mine;
  mpt_device_claim_fill(&mine, comm->rank, comm->local_rank, comm->local_size, type, index,
                        visible_count, comm->hostname);
  mpt_device_claim *all = calloc((size_t)comm->world_size, sizeof *all);
  if (!all) return MPT_FAIL(MPT_ENOMEM, "cannot allocate %d device claims", comm->world_size);
  mpt_status st = mpt_comm_allgather_sync(comm, &mine, all, (int64_t)sizeof mine, MPT_U8);
  if (st == MPT_OK) st = mpt_device_claims_check(all, comm->world_size);
  free(all);
  return st;
}

mpt_status mpt_comm_check_devices(mpt_comm *comm, mpt_device device) {
  return gather_and_check(comm, device.type, device.index, -1);
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
  int index = -1;
  /* A failed pick is not returned yet: this rank still takes part in the gather (with no
   * device), so that every rank learns of it and fails with the same words. */
  (void)mpt_device_pick(comm->local_rank, comm->local_size, visible, &index);
  MPT_RETURN_IF(gather_and_check(comm, type, index, visible));
  mpt_device d = {type, index};
  if (real) MPT_RETURN_IF(mpt_device_set_current(d));
  *device = d;
  return MPT_OK;
}
