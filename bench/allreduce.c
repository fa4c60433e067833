/* mpt_allreduce_bench: all-reduce bandwidth through mpitrain's comm layer, printed in the format
 * of nccl-tests' all_reduce_perf, with raw MPI_Allreduce measured in the same run on the same
 * buffers so that every row carries the ratio mpitrain / raw. --coll reducescatter | allgather
 * measures those collectives instead (host buffers, MPI backend) against MPI_Reduce_scatter /
 * MPI_Allgather(v) with the same shard counts, busbw factor (n - 1) / n (bench/README.md).
 *
 *   mpirun -np 2 mpt_allreduce_bench -b 1K -e 64M -f 2 -n 20 -w 5 -c 1 --json out.json
 *
 * What is measured, per size (bytes = count * element size):
 *   - mpitrain out-of-place and in-place: `iters` calls of mpt_comm_allreduce enqueued on the
 *     comm's own stream, then one event record + mpt_comm_wait_event (what the DDP engine does
 *     with its buckets; -z 1 waits after every call instead);
 *   - raw out-of-place and in-place: `iters` calls of MPI_Allreduce on MPI_COMM_WORLD from the
 *     main thread (--raw iallreduce: MPI_Iallreduce + MPI_Wait, the comm layer's polling-mode
 *     path), on the same buffers; with --backend nccl, `iters` ncclAllReduce calls on the same
 *     device buffers through a bare NCCL communicator and stream (raw_nccl.c), then a stream
 *     synchronize.
 * The comm under test uses the comm layer's defaults (blocking progress, confirm_collectives on)
 * unless --progress polling or --confirm 0 say otherwise; its waits use mpt_comm_wait_event.
 * Each variant runs `warmup` untimed calls first; ranks start together (MPI_Barrier); a variant's
 * time is the mean over its iters on each rank, then the maximum over ranks. With -R R > 1 the
 * four variants are measured R times (raw first in odd rounds) and the median of the R figures
 * is kept (the machine may be shared). algbw = bytes / time, busbw = algbw * 2 (n - 1) / n (nccl-tests'
 * convention for all-reduce), ratio = busbw(mpitrain) / busbw(raw) = time(raw) / time(mpitrain).
 *
 * Correctness (-c 1, the default): before timing, every size runs once through each variant on
 * inputs whose exact result is representable (rank r holds h(i) + r + 1 with h(i) in [0, 64), so
 * sums, minima, maxima and averages are exact in float32 and int32) and counts the wrong
 * elements (summed over ranks: the #wrong column); the out-of-place result of the timed
 * iterations is checked again. Any wrong value makes the exit status 1. (For the tests of the
 * checker, MPT_BENCH_INJECT_WRONG=1 makes rank 0 corrupt one value of each out-of-place check.)
 *
 * Devices (--device cuda, cuda:N): the mpitrain variants run on device buffers through a comm
 * on that device (--backend nccl: NCCL, one GPU per rank; --backend mpi: staged through pinned
 * host memory, so several ranks may share a GPU with cuda:N); inputs are uploaded and results
 * downloaded outside the timed loops. The raw MPI variants stay on host buffers (MPI here is not
 * CUDA-aware), so the ratio compares a device collective with host MPI. Timings and the rank
 * table travel over a second comm on host memory.
 *
 * Ranks: rank 0 prints; every rank takes part in every collective. Errors print the rank and
 * the detail and abort the job (mpt_comm_abort). */
#include "config.h"

#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <mpi.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/allreduce_opts.h"
#include "bench/bench_util.h"
#ifdef MPT_HAVE_NCCL
#include "bench/raw_nccl.h"
#endif
#include "mpitrain/comm.h"
#include "mpitrain/core.h"
#include "mpitrain/ops.h"

enum {
  V_MPT_OOP = BENCH_MPT_OOP,
  V_MPT_IP = BENCH_MPT_IP,
  V_RAW_OOP = BENCH_RAW_OOP,
  V_RAW_IP = BENCH_RAW_IP,
  NVARIANT = BENCH_NVARIANT,
  MAX_REPEATS = BENCH_MAX_REPEATS
};

typedef struct bench {
  bench_opts o;
  mpt_comm *comm;
  mpt_comm *ctl;         /* host memory: timings, wrong counts, the rank table (== comm on cpu) */
  mpt_device dev;        /* where the mpitrain variants' buffers live */
  mpt_stream *io;        /* device: uploads and downloads */
  void *dsend, *drecv;   /* device copies of send / recv (NULL on cpu) */
  mpt_stream *cs;
  mpt_event *ev;
  int rank, world;
  void *send, *recv;
  MPI_Datatype mdt;
  MPI_Op mop;
  int *counts, *displs; /* [world]: the shards of the current size (reduce-scatter, all-gather) */
  int inject_wrong; /* MPT_BENCH_INJECT_WRONG=1: rank 0 corrupts one checked value (tests) */
#ifdef MPT_HAVE_NCCL
  bench_raw_nccl *nccl; /* --backend nccl: the raw baseline is ncclAllReduce on the device */
#endif
} bench;

/* ---- errors ------------------------------------------------------------------------------ */

static const mpt_comm *g_comm;

static void die(const char *fmt, ...) MPT_PRINTF(1, 2);
static void die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "mpt_allreduce_bench: rank %d: error: ", mpt_log_rank());
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  mpt_comm_abort(g_comm, 1);
}

#define BENCH_CHECK(call)                                                                 \
  do {                                                                                    \
    mpt_status bench__st = (call);                                                        \
    if (bench__st != MPT_OK)                                                              \
      die("%s: %s: %s", #call, mpt_status_message(bench__st), mpt_last_error());          \
  } while (0)

#define BENCH_MPI(call)                                                                   \
  do {                                                                                    \
    int bench__rc = (call);                                                               \
    if (bench__rc != MPI_SUCCESS) {                                                       \
      char bench__txt[MPI_MAX_ERROR_STRING];                                              \
      int bench__len = 0;                                                                 \
      MPI_Error_string(bench__rc, bench__txt, &bench__len);                               \
      die("%s: %s", #call, bench__txt);                                                   \
    }                                                                                     \
  } while (0)

/* ---- data (bench_fill / bench_count_wrong in bench_util.c) -------------------------------- */

/* Device runs: the host send / recv buffers (filled and checked there) to the device copies
 * and back. No-ops on the CPU. */
static void to_device(bench *b, int64_t count) {
  if (!b->dsend) return;
  size_t nbytes = (size_t)count * mpt_dtype_size(b->o.dtype);
  BENCH_CHECK(mpt_op_memcpy(b->io, b->dev, b->dsend, mpt_device_cpu(), b->send, nbytes));
  BENCH_CHECK(mpt_op_memcpy(b->io, b->dev, b->drecv, mpt_device_cpu(), b->recv, nbytes));
  BENCH_CHECK(mpt_stream_synchronize(b->io, -1.0));
}

static void from_device(bench *b, int64_t count) {
  if (!b->dsend) return;
  size_t nbytes = (size_t)count * mpt_dtype_size(b->o.dtype);
  BENCH_CHECK(mpt_op_memcpy(b->io, mpt_device_cpu(), b->recv, b->dev, b->drecv, nbytes));
  BENCH_CHECK(mpt_stream_synchronize(b->io, -1.0));
}

static int is_mpt(int v) { return v == V_MPT_OOP || v == V_MPT_IP; }

/* Whether variant v runs on the device buffers: the mpitrain variants, and raw NCCL. */
static int on_device(const bench *b, int v) {
#ifdef MPT_HAVE_NCCL
  if (b->nccl) return 1;
#else
  (void)b;
#endif
  return is_mpt(v);
}

/* ---- the variants ------------------------------------------------------------------------ */

/* The shards of `count` elements (mpt_comm_shard), into b->counts / b->displs; returns the
 * largest (the equal block of the out-of-place all-gather). */
static int64_t shards(bench *b, int64_t count) {
  int64_t off, n, most = 0;
  for (int q = 0; q < b->world; q++) {
    mpt_comm_shard(count, b->world, q, &off, &n);
    b->counts[q] = (int)n;
    b->displs[q] = (int)off;
    if (n > most) most = n;
  }
  return most;
}

/* One call of the collective under test, enqueued on the comm stream (host buffers for
 * reduce-scatter and all-gather). */
static mpt_status mpt_call(bench *b, const void *send, void *recv, int in_place, int64_t count) {
  const size_t es = mpt_dtype_size(b->o.dtype);
  switch (b->o.coll) {
    case BENCH_COLL_REDUCESCATTER: /* in place: recv holds the input, the shard lands in it */
      return mpt_comm_reduce_scatter(b->comm, b->cs, in_place ? recv : send,
                                     in_place ? (char *)recv + (size_t)b->displs[b->rank] * es
                                              : recv,
                                     count, b->o.dtype, b->o.op);
    case BENCH_COLL_ALLGATHER:
      if (in_place) return mpt_comm_allgather_shards(b->comm, b->cs, recv, count, b->o.dtype);
      return mpt_comm_allgather(b->comm, b->cs, send, recv, shards(b, count), b->o.dtype);
    case BENCH_COLL_RSAG: { /* this rank's shard of the sum lands at its offset in recv */
      shards(b, count);
      mpt_status st = mpt_comm_reduce_scatter(b->comm, b->cs, in_place ? recv : send,
                                              (char *)recv + (size_t)b->displs[b->rank] * es,
                                              count, b->o.dtype, b->o.op);
      if (st != MPT_OK) return st;
      return mpt_comm_allgather_shards(b->comm, b->cs, recv, count, b->o.dtype);
    }
    case BENCH_COLL_ALLREDUCE:
      break;
  }
  return mpt_comm_allreduce(b->comm, b->cs, send, recv, count, b->o.dtype, b->o.op);
}

static void run_mpt(bench *b, int in_place, int64_t count, int iters) {
  void *recv = b->drecv ? b->drecv : b->recv;
  const void *send = in_place ? recv : b->dsend ? b->dsend : b->send;
  for (int it = 0; it < iters; it++) {
    BENCH_CHECK(mpt_call(b, send, recv, in_place, count));
    if (b->o.blocking) {
      BENCH_CHECK(mpt_event_record(b->ev, b->cs));
      BENCH_CHECK(mpt_comm_wait_event(b->comm, b->ev)); /* with the comm's deadline */
    }
  }
  BENCH_CHECK(mpt_event_record(b->ev, b->cs));
  BENCH_CHECK(mpt_comm_wait_event(b->comm, b->ev));
}

static void run_raw(bench *b, int in_place, int64_t count, int iters) {
#ifdef MPT_HAVE_NCCL
  if (b->nccl) {
    char err[256];
    if (bench_raw_nccl_run(b->nccl, in_place ? b->drecv : b->dsend, b->drecv, count, b->o.dtype,
                           b->o.op, iters, err, sizeof err) != 0)
      die("raw NCCL: %s", err);
    return;
  }
#endif
  const void *send = in_place ? MPI_IN_PLACE : b->send;
  if (b->o.coll != BENCH_COLL_ALLREDUCE && b->o.coll != BENCH_COLL_RSAG) {
    int blk = (int)shards(b, count);
    for (int it = 0; it < iters; it++) {
      if (b->o.coll == BENCH_COLL_REDUCESCATTER)
        BENCH_MPI(MPI_Reduce_scatter(send, b->recv, b->counts, b->mdt, b->mop, MPI_COMM_WORLD));
      else if (in_place)
        BENCH_MPI(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, b->recv, b->counts,
                                 b->displs, b->mdt, MPI_COMM_WORLD));
      else
        BENCH_MPI(MPI_Allgather(b->send, blk, b->mdt, b->recv, blk, b->mdt, MPI_COMM_WORLD));
    }
    return;
  }
  for (int it = 0; it < iters; it++) {
    if (b->o.raw_nonblocking) {
      MPI_Request req;
      BENCH_MPI(MPI_Iallreduce(send, b->recv, (int)count, b->mdt, b->mop, MPI_COMM_WORLD, &req));
      BENCH_MPI(MPI_Wait(&req, MPI_STATUS_IGNORE));
    } else {
      BENCH_MPI(MPI_Allreduce(send, b->recv, (int)count, b->mdt, b->mop, MPI_COMM_WORLD));
    }
  }
}

static void run_variant(bench *b, int v, int64_t count, int iters) {
  if (v == V_MPT_OOP || v == V_MPT_IP)
    run_mpt(b, v == V_MPT_IP, count, iters);
  else
    run_raw(b, v == V_RAW_IP, count, iters);
}

/* The op the raw side runs (MPI has no average; NCCL has) and its expected results. */
static mpt_reduce_op raw_op(const bench *b) {
#ifdef MPT_HAVE_NCCL
  if (b->nccl) return b->o.op;
#endif
  return b->o.op == MPT_REDUCE_AVG ? MPT_REDUCE_SUM : b->o.op;
}

/* Wrong elements of variant v's result in b->recv (host). Reduce-scatter: this rank's shard, at
 * its offset (mpitrain in place) or at the start (out of place, and raw MPI in place); all-gather:
 * every rank's equal block (out of place) or shard (in place) holds that rank's inputs. */
static int64_t count_result(bench *b, int v, int64_t count) {
  const size_t es = mpt_dtype_size(b->o.dtype);
  const int in_place = v == V_MPT_IP || v == V_RAW_IP;
  mpt_reduce_op op = v >= V_RAW_OOP ? raw_op(b) : b->o.op;
  const char *recv = b->recv;
  int64_t wrong = 0, blk = shards(b, count);
  switch (b->o.coll) {
    case BENCH_COLL_REDUCESCATTER: {
      const int64_t off = b->displs[b->rank], n = b->counts[b->rank];
      const char *at = v == V_MPT_IP ? recv + (size_t)off * es : recv;
      return bench_count_wrong_range(at, b->o.dtype, off, n, b->world, op);
    }
    case BENCH_COLL_ALLGATHER:
      for (int q = 0; q < b->world; q++) {
        const int64_t first = in_place ? b->displs[q] : 0, n = in_place ? b->counts[q] : blk;
        const int64_t at = in_place ? b->displs[q] : (int64_t)q * blk;
        wrong += bench_count_wrong_copy(recv + (size_t)at * es, b->o.dtype, first, n, q);
      }
      return wrong;
    case BENCH_COLL_ALLREDUCE:
    case BENCH_COLL_RSAG:
      break;
  }
  return bench_count_wrong(b->recv, b->o.dtype, count, b->world, op);
}

/* Fresh inputs of variant v (and a poisoned output). */
static void fill_inputs(bench *b, int v, int64_t count) {
  const size_t es = mpt_dtype_size(b->o.dtype);
  const int in_place = v == V_MPT_IP || v == V_RAW_IP;
  if (b->o.coll == BENCH_COLL_ALLGATHER) {
    int64_t blk = shards(b, count), off = b->displs[b->rank];
    memset(b->recv, 0xff, (size_t)(blk * b->world) * es);
    if (in_place)
      bench_fill_range((char *)b->recv + (size_t)off * es, b->o.dtype, off, b->counts[b->rank],
                       b->rank);
    else
      bench_fill(b->send, b->o.dtype, blk, b->rank);
    return;
  }
  if (in_place) {
    bench_fill(b->recv, b->o.dtype, count, b->rank);
  } else {
    bench_fill(b->send, b->o.dtype, count, b->rank);
    memset(b->recv, 0xff, (size_t)count * es); /* NaN / -1: never an expected value */
  }
}

/* One correctness pass of variant v: fresh inputs, a poisoned output, one call. */
static int64_t check_variant(bench *b, int v, int64_t count) {
  fill_inputs(b, v, count);
  if (on_device(b, v)) to_device(b, count);
  run_variant(b, v, count, 1);
  if (on_device(b, v)) from_device(b, count);
  if (b->inject_wrong && v == V_MPT_OOP && b->rank == 0) { /* tests of the checker itself */
    if (b->o.dtype == MPT_F32) ((float *)b->recv)[0] += 1.0f;
    else if (b->o.dtype == MPT_BF16) ((uint16_t *)b->recv)[0] ^= 0x10;
    else ((int32_t *)b->recv)[0] += 1;
  }
  return count_result(b, v, count);
}

/* Times variant v (mean over iters on this rank, in microseconds). Out-of-place mpitrain also
 * checks the result of the timed calls when checking is on. */
static double time_variant(bench *b, int v, int64_t count, int64_t *wrong) {
  int in_place = v == V_MPT_IP || v == V_RAW_IP;
  fill_inputs(b, v, count); /* in place: keep values bounded */
  if (on_device(b, v)) to_device(b, count);
  if (b->o.warmup > 0) run_variant(b, v, count, b->o.warmup);
  if (in_place) fill_inputs(b, v, count);
  if (on_device(b, v) && in_place) to_device(b, count);
  BENCH_MPI(MPI_Barrier(MPI_COMM_WORLD));
  double t0 = mpt_time_ms();
  run_variant(b, v, count, b->o.iters);
  double us = (mpt_time_ms() - t0) * 1e3 / b->o.iters;
  if (b->o.check && v == V_MPT_OOP) from_device(b, count);
  if (b->o.check && v == V_MPT_OOP) *wrong += count_result(b, v, count);
  return us;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static void measure(bench *b, bench_row *r) {
  int64_t count = r->count, wrong[NVARIANT] = {0, 0, 0, 0};
  if (b->o.check)
    for (int v = 0; v < NVARIANT; v++) wrong[v] += check_variant(b, v, count);
  fill_inputs(b, V_MPT_OOP, count);
  double t[MAX_REPEATS][NVARIANT];
  for (int rep = 0; rep < b->o.repeats; rep++) {
    float mine[NVARIANT];
    for (int k = 0; k < NVARIANT; k++) { /* odd rounds time the raw side first */
      int v = rep % 2 ? (k + 2) % NVARIANT : k;
      mine[v] = (float)time_variant(b, v, count, &wrong[v]);
    }
    BENCH_CHECK(mpt_comm_allreduce_sync(b->ctl, mine, mine, NVARIANT, MPT_F32, MPT_REDUCE_MAX));
    for (int v = 0; v < NVARIANT; v++) t[rep][v] = mine[v];
  }
  for (int v = 0; v < NVARIANT; v++) {
    double col[MAX_REPEATS];
    for (int rep = 0; rep < b->o.repeats; rep++) col[rep] = t[rep][v];
    qsort(col, (size_t)b->o.repeats, sizeof(double), cmp_double);
    int R = b->o.repeats;
    r->time_us[v] = R % 2 ? col[R / 2] : 0.5 * (col[R / 2 - 1] + col[R / 2]);
  }
  int32_t w[NVARIANT];
  for (int v = 0; v < NVARIANT; v++) w[v] = (int32_t)(wrong[v] > (1 << 26) ? 1 << 26 : wrong[v]);
  BENCH_CHECK(mpt_comm_allreduce_sync(b->ctl, w, w, NVARIANT, MPT_I32, MPT_REDUCE_SUM));
  for (int v = 0; v < NVARIANT; v++) r->wrong[v] = w[v];
}

/* ---- main -------------------------------------------------------------------------------- */

/* The raw side's bfloat16 sum: the same kernel as the comm layer's MPI_Op (core's vectorised
 * mpt_bf16_add_array: widen, add in float32, round to nearest even), so the ratio measures the
 * layer, not the arithmetic. */
static void raw_bf16_sum(void *in, void *inout, int *len, MPI_Datatype *type) {
  (void)type;
  mpt_bf16_add_array(in, inout, *len);
}

/* The rank's own idea of its rank before MPI is up (for messages of usage errors). */
static int launcher_rank(void) {
  const char *vars[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
    if (getenv(vars[i])) return atoi(getenv(vars[i]));
  return 0;
}

int main(int argc, char **argv) {
  bench b;
  memset(&b, 0, sizeof b);
  char msg[512] = "";
  int pr = bench_allreduce_parse(argc, argv, &b.o, msg, sizeof msg);
  int quiet = launcher_rank() != 0;
  if (pr != 0) {
    if (!quiet) {
      if (pr > 0) fputs(bench_allreduce_usage, stdout);
      else fprintf(stderr, "mpt_allreduce_bench: %s\n", msg);
    }
    return pr > 0 ? 0 : 2;
  }
#ifndef MPT_HAVE_NCCL
  if (b.o.backend == MPT_COMM_BACKEND_NCCL) {
    if (!quiet)
      fprintf(stderr, "mpt_allreduce_bench: --backend nccl: this build of mpitrain has no NCCL "
                      "(configure found no CUDA with NCCL; install them and configure "
                      "--with-cuda), use --backend mpi\n");
    return 2;
  }
#endif

  mpt_comm_config cc = mpt_comm_config_default();
  if (b.o.confirm >= 0) cc.confirm_collectives = b.o.confirm;
  if (b.o.progress >= 0) cc.blocking = b.o.progress;
  if (b.o.flight >= 0) cc.flight_recorder = b.o.flight;
  mpt_status st = MPT_OK;
  if (strcmp(b.o.device, "cpu") != 0) { /* a host comm first: binding, timings, rank table */
    st = mpt_comm_init(&b.ctl, &cc);
    if (st == MPT_OK) {
      g_comm = b.ctl;
      if (strcmp(b.o.device, "cuda") == 0)
        st = mpt_comm_bind_device(b.ctl, MPT_DEVICE_CUDA, -1, &b.dev);
      else if ((st = mpt_device_parse(b.o.device, &b.dev)) == MPT_OK &&
               b.o.backend == MPT_COMM_BACKEND_NCCL)
        st = mpt_comm_check_devices(b.ctl, b.dev);
      if (st == MPT_OK) st = mpt_device_set_current(b.dev);
      if (st != MPT_OK) die("--device %s: %s: %s", b.o.device, mpt_status_message(st),
                            mpt_last_error());
    }
  }
  cc.backend = b.o.backend;
  cc.device = b.ctl ? b.dev : mpt_device_cpu();
  if (st == MPT_OK) st = mpt_comm_init(&b.comm, &cc);
  if (st != MPT_OK) {
    fprintf(stderr, "mpt_allreduce_bench: rank %d: cannot create the %s comm: %s: %s\n",
            launcher_rank(), mpt_comm_backend_name(b.o.backend), mpt_status_message(st),
            mpt_last_error());
    mpt_comm_abort(NULL, 1);
  }
  if (!b.ctl) b.ctl = b.comm;
  g_comm = b.ctl;
  b.rank = mpt_comm_rank(b.comm);
  b.world = mpt_comm_world_size(b.comm);
  b.cs = mpt_comm_stream(b.comm);
  char why[512];
  if (b.rank == 0 && b.o.json[0] && bench_json_probe(b.o.json, why, sizeof why) != 0)
    die("--json: cannot write '%s': %s", b.o.json, why); /* before measuring (faults.md F47) */
  b.inject_wrong = getenv("MPT_BENCH_INJECT_WRONG") && atoi(getenv("MPT_BENCH_INJECT_WRONG"));
  b.mdt = b.o.dtype == MPT_F32 ? MPI_FLOAT : b.o.dtype == MPT_BF16 ? MPI_UINT16_T : MPI_INT32_T;
  b.mop = b.o.op == MPT_REDUCE_MIN ? MPI_MIN : b.o.op == MPT_REDUCE_MAX ? MPI_MAX : MPI_SUM;
  if (b.o.dtype == MPT_BF16) BENCH_MPI(MPI_Op_create(raw_bf16_sum, 1, &b.mop));
  b.counts = calloc(2 * (size_t)b.world, sizeof(int));
  if (!b.counts) die("out of memory");
  b.displs = b.counts + b.world;
  BENCH_CHECK(mpt_event_init(&b.ev, mpt_stream_device(b.cs)));
  /* + world elements: the equal blocks of the out-of-place all-gather round the size up */
  size_t maxbytes = (size_t)b.o.maxbytes + (size_t)b.world * mpt_dtype_size(b.o.dtype);
  BENCH_CHECK(mpt_device_alloc(mpt_device_cpu(), maxbytes, &b.send));
  BENCH_CHECK(mpt_device_alloc(mpt_device_cpu(), maxbytes, &b.recv));
  memset(b.send, 0, maxbytes); /* touch the pages before timing */
  memset(b.recv, 0, maxbytes);
  if (b.ctl != b.comm) {
    BENCH_CHECK(mpt_stream_init(&b.io, b.dev, MPT_STREAM_WORKER));
    BENCH_CHECK(mpt_device_alloc(b.dev, maxbytes, &b.dsend));
    BENCH_CHECK(mpt_device_alloc(b.dev, maxbytes, &b.drecv));
  }
  char devname[32];
  mpt_device_str(b.ctl != b.comm ? b.dev : mpt_device_cpu(), devname, sizeof devname);
  const char *raw_name = b.o.raw_nonblocking ? "MPI_Iallreduce" : "MPI_Allreduce";
  const char *mpt_name = "mpt_comm_allreduce";
  if (b.o.coll == BENCH_COLL_REDUCESCATTER) {
    raw_name = "MPI_Reduce_scatter";
    mpt_name = "mpt_comm_reduce_scatter";
  } else if (b.o.coll == BENCH_COLL_ALLGATHER) {
    raw_name = "MPI_Allgather(v)";
    mpt_name = "mpt_comm_allgather (out-of-place) / mpt_comm_allgather_shards (in-place)";
  } else if (b.o.coll == BENCH_COLL_RSAG) {
    mpt_name = "mpt_comm_reduce_scatter + mpt_comm_allgather_shards (an all-reduce)";
  }
#ifdef MPT_HAVE_NCCL
  if (b.o.backend == MPT_COMM_BACKEND_NCCL) {
    char err[256];
    if (bench_raw_nccl_init(&b.nccl, MPI_COMM_WORLD, b.dev.index, err, sizeof err) != 0)
      die("the raw NCCL baseline: %s", err);
    raw_name = "ncclAllReduce";
  }
#endif

  /* The rank table and the machine. */
  bench_rank_info me, *all = calloc((size_t)b.world, sizeof *all);
  if (!all) die("out of memory");
  bench_rank_info_fill(&me, b.ctl, devname);
  BENCH_CHECK(mpt_comm_allgather_sync(b.ctl, &me, all, (int64_t)sizeof me, MPT_U8));
  bench_run_info info;
  bench_run_info_fill(&info, b.comm, devname);
  info.coll = b.o.coll;
  int confirm_on = b.o.confirm >= 0 ? b.o.confirm : mpt_comm_config_default().confirm_collectives;
  const char *type = b.o.dtype == MPT_F32 ? "float" : b.o.dtype == MPT_BF16 ? "bfloat16" : "int32";
  const char *redop = b.o.coll == BENCH_COLL_ALLGATHER ? "none" : mpt_reduce_op_name(b.o.op);

  FILE *out = b.rank == 0 ? stdout : NULL;
  if (out) {
    bench_print_preamble(out, &info, all, b.world);
    fprintf(out, "# minBytes %lld maxBytes %lld step: %lld(%s) warmup iters: %d iters: %d "
                 "repeats: %d validation: %d blocking: %d\n",
            (long long)b.o.minbytes, (long long)b.o.maxbytes,
            (long long)(b.o.stepfactor > 1 ? b.o.stepfactor : b.o.stepbytes),
            b.o.stepfactor > 1 ? "factor" : "bytes", b.o.warmup, b.o.iters, b.o.repeats,
            b.o.check, b.o.blocking);
    int mpi_confirm = confirm_on && b.o.backend == MPT_COMM_BACKEND_MPI;
    fprintf(out, "# collective: %s; busbw = algbw * %s\n", bench_coll_name(b.o.coll),
            b.o.coll == BENCH_COLL_ALLREDUCE || b.o.coll == BENCH_COLL_RSAG ? "2 (n - 1) / n"
                                                                             : "(n - 1) / n");
    fprintf(out, "# mpitrain: %s (%s backend, %s buffers) on the comm stream + "
                 "event synchronize, confirm_collectives %d%s, flight recorder %lld\n",
            mpt_name, mpt_comm_backend_name(b.o.backend), devname, mpi_confirm,
            mpi_confirm ? " (an extra 3 x int64 all-reduce after each collective)" : "",
            (long long)mpt_comm_flight_capacity(b.comm));
    if (b.o.backend == MPT_COMM_BACKEND_NCCL)
      fprintf(out, "# raw: ncclAllReduce on its own NCCL communicator and stream, same device "
                   "buffers\n");
    else
      fprintf(out, "# raw: %s on MPI_COMM_WORLD from the main thread, %s%s\n", raw_name,
              b.dsend ? "host buffers (MPI is not CUDA-aware here)" : "same buffers",
              b.o.op == MPT_REDUCE_AVG ? " (op sum: MPI has no average)" : "");
    fprintf(out, "#\n");
    bench_print_header(out, raw_name);
  }

  size_t es = mpt_dtype_size(b.o.dtype);
  int64_t nrows = 0, cap = 64;
  bench_row *rows = calloc((size_t)cap, sizeof *rows);
  if (!rows) die("out of memory");
  bench_summary sum = {0, 0, 0, 0, INFINITY, 0, 0};
  double factor = bench_bus_factor(b.o.coll, b.world);
  int nbus = 0;
  for (int64_t size = b.o.minbytes; size <= b.o.maxbytes;
       size = b.o.stepfactor > 1 ? size * b.o.stepfactor : size + b.o.stepbytes) {
    int64_t count = size / (int64_t)es;
    if (count == 0) continue;
    if (nrows == cap) {
      bench_row *more = realloc(rows, sizeof *rows * (size_t)(cap *= 2));
      if (!more) die("out of memory");
      rows = more;
    }
    bench_row *r = &rows[nrows++];
    memset(r, 0, sizeof *r);
    r->count = count;
    r->bytes = count * (int64_t)es;
    if (b.o.coll == BENCH_COLL_REDUCESCATTER || b.o.coll == BENCH_COLL_ALLGATHER)
      r->rank_count = shards(&b, count);
    measure(&b, r);
    for (int v = 0; v < NVARIANT; v++) sum.wrong_total += r->wrong[v];
    double bus[NVARIANT];
    for (int v = 0; v < NVARIANT; v++) bus[v] = (double)r->bytes / (r->time_us[v] * 1e3) * factor;
    sum.avg_busbw += bus[V_MPT_OOP] + bus[V_MPT_IP];
    sum.avg_busbw_raw += bus[V_RAW_OOP] + bus[V_RAW_IP];
    nbus += 2;
    if (r->bytes >= (1 << 20)) {
      double ro = r->time_us[V_RAW_OOP] / r->time_us[V_MPT_OOP];
      double ri = r->time_us[V_RAW_IP] / r->time_us[V_MPT_IP];
      sum.ratio_oop += ro;
      sum.ratio_ip += ri;
      sum.ratio_min = fmin(sum.ratio_min, fmin(ro, ri));
      sum.nratio++;
    }
    if (out) {
      bench_print_row(out, r, type, redop, factor);
      fflush(out);
    }
  }
  if (nbus) sum.avg_busbw /= nbus, sum.avg_busbw_raw /= nbus;
  if (sum.nratio) sum.ratio_oop /= sum.nratio, sum.ratio_ip /= sum.nratio;
  else sum.ratio_oop = sum.ratio_ip = sum.ratio_min = NAN;
  if (out) {
    fprintf(out, "# Out of bounds values : %lld %s\n", (long long)sum.wrong_total,
            sum.wrong_total ? "WRONG" : "OK");
    fprintf(out, "# Avg bus bandwidth    : %g\n", sum.avg_busbw);
    fprintf(out, "# Avg bus bandwidth of raw %s : %g\n", raw_name, sum.avg_busbw_raw);
    if (sum.nratio)
      fprintf(out, "# busbw ratio mpitrain/raw, sizes >= 1 MiB (%d sizes): out-of-place %.3f  "
                   "in-place %.3f  mean %.3f  min %.3f\n",
              sum.nratio, sum.ratio_oop, sum.ratio_ip, 0.5 * (sum.ratio_oop + sum.ratio_ip),
              sum.ratio_min);
    else
      fprintf(out, "# busbw ratio mpitrain/raw, sizes >= 1 MiB: no such sizes\n");
    fprintf(out, "#\n");
    fflush(out);
    if (b.o.json[0]) {
      bench_config cfg = {type,        redop,     raw_name,   b.o.iters, b.o.warmup,
                          b.o.repeats, b.o.check, b.o.blocking, confirm_on};
      if (bench_write_json(b.o.json, &info, all, &cfg, rows, nrows, &sum) != 0)
        die("cannot write the JSON file '%s': %s", b.o.json, mpt_last_error());
    }
  }
  int64_t wrong_total = sum.wrong_total;
  free(rows);
  free(all);
  free(b.counts);
  if (b.o.dtype == MPT_BF16) MPI_Op_free(&b.mop);
  mpt_device_free(mpt_device_cpu(), b.send);
  mpt_device_free(mpt_device_cpu(), b.recv);
  mpt_device_free(b.dev, b.dsend);
  mpt_device_free(b.dev, b.drecv);
  mpt_stream_free(b.io);
#ifdef MPT_HAVE_NCCL
  bench_raw_nccl_free(b.nccl);
#endif
  mpt_event_free(b.ev);
  if (b.ctl != b.comm) mpt_comm_free(b.comm);
  mpt_comm_free(b.ctl);
  mpt_comm_finalize();
  if (wrong_total && b.rank == 0)
    fprintf(stderr, "mpt_allreduce_bench: %lld wrong values\n", (long long)wrong_total);
  return wrong_total ? 1 : 0;
}
