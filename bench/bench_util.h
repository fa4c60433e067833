/* Helpers of mpt_allreduce_bench (bench/allreduce.c): size parsing, the run and rank
 * descriptions of the preamble, the nccl-tests style table, and the JSON mirror of the results.
 * Program code (not part of the library): names are prefixed bench_. Printing happens on the
 * calling rank only (the caller picks rank 0). */
#ifndef MPT_BENCH_UTIL_H
#define MPT_BENCH_UTIL_H

#include <stdint.h>
#include <stdio.h>

#include "mpitrain/comm.h"

/* The collective measured (--coll): all-reduce; reduce-scatter (mpt_comm_reduce_scatter, each
 * rank one shard, the last shorter); all-gather (out-of-place: mpt_comm_allgather of equal
 * blocks; in-place: mpt_comm_allgather_shards of the whole buffer); rsag: an all-reduce built
 * as mpt_comm_reduce_scatter + mpt_comm_allgather_shards (the DDP engine's rs-ag algorithm,
 * ddp.h), against raw MPI_Allreduce. */
typedef enum {
  BENCH_COLL_ALLREDUCE = 0,
  BENCH_COLL_REDUCESCATTER = 1,
  BENCH_COLL_ALLGATHER = 2,
  BENCH_COLL_RSAG = 3,
} bench_coll;

/* "allreduce", "reducescatter", "allgather", "rsag". */
const char *bench_coll_name(bench_coll coll);

/* The four measured variants of one size. */
enum { BENCH_MPT_OOP = 0, BENCH_MPT_IP = 1, BENCH_RAW_OOP = 2, BENCH_RAW_IP = 3, BENCH_NVARIANT = 4 };

/* One row: times are maxima over ranks (medians over repeats), wrong counts sums over ranks. */
typedef struct bench_row {
  int64_t bytes, count; /* the whole buffer */
  int64_t rank_count;   /* elements per rank (reduce-scatter, all-gather; 0: count) */
  double time_us[BENCH_NVARIANT];
  int64_t wrong[BENCH_NVARIANT];
} bench_row;

/* One rank, as gathered (fixed size: it travels as bytes). */
typedef struct bench_rank_info {
  int32_t rank, local_rank, pid, pad;
  char host[64];
  char device[32];
} bench_rank_info;

/* The run, as printed in the preamble and the JSON. */
typedef struct bench_run_info {
  char version[32];     /* mpitrain's PACKAGE_VERSION */
  int cuda, nccl;       /* what this build has */
  char backend[16];     /* the comm backend */
  char progress[16];    /* MPI backend: "blocking" or "polling" (the comm's agreed mode) */
  char device[16];      /* where the buffers live: "cpu" or "cuda" */
  char mpi_library[160];/* first line of MPI_Get_library_version */
  char cpu_model[128];  /* /proc/cpuinfo "model name" */
  int cpus;             /* online CPUs of rank 0's host */
  char launcher[32];
  int world;
  bench_coll coll;
  char date[32];        /* UTC, ISO 8601 */
} bench_run_info;

/* The settings echoed into the JSON. */
typedef struct bench_config {
  const char *dtype, *op, *raw; /* raw: the baseline's name ("MPI_Allreduce", "ncclAllReduce") */
  int iters, warmup, repeats, check, blocking, confirm;
} bench_config;

typedef struct bench_summary {
  double avg_busbw, avg_busbw_raw; /* GB/s, mean over sizes of out-of-place and in-place */
  double ratio_oop, ratio_ip;      /* mean busbw ratio over sizes >= 1 MiB (NaN: none) */
  double ratio_min;                /* smallest ratio over those sizes and both placements */
  int nratio;                      /* number of sizes >= 1 MiB */
  int64_t wrong_total;
} bench_summary;

/* Inputs whose all-reduce is exact: rank r holds h(i) + r + 1 with h(i) in [0, 64) varying from
 * element to element (so misplaced chunks show), for i < count; float32, int32 or bfloat16
 * (h in [0, 32): exact sums up to 7 ranks) (host memory). */
void bench_fill(void *buf, mpt_dtype dtype, int64_t count, int rank);
/* The same values for the elements [first, first + n), written to buf[0..n). */
void bench_fill_range(void *buf, mpt_dtype dtype, int64_t first, int64_t n, int rank);
/* Elements of buf (host memory) that differ from the exact result of `op` over `world` ranks
 * of bench_fill's inputs (avg: the float32 sum divided by the float32 world size, as the comm
 * layer computes it). Exact while world * (64 + world) < 2^24 (float32 sums stay exact). */
int64_t bench_count_wrong(const void *buf, mpt_dtype dtype, int64_t count, int world,
                          mpt_reduce_op op);
/* The same for buf[0..n) holding the reduced elements [first, first + n) (a shard). */
int64_t bench_count_wrong_range(const void *buf, mpt_dtype dtype, int64_t first, int64_t n,
                                int world, mpt_reduce_op op);
/* Elements of buf[0..n) that differ from rank `rank`'s inputs [first, first + n) (gathers). */
int64_t bench_count_wrong_copy(const void *buf, mpt_dtype dtype, int64_t first, int64_t n,
                               int rank);

/* Parses "8", "64K", "32M", "1G" (powers of 1024, as nccl-tests). 0 ok, -1 bad text. */
int bench_parse_size(const char *text, int64_t *bytes);

void bench_rank_info_fill(bench_rank_info *r, const mpt_comm *comm, const char *device);
/* `comm`: the comm under test; `device`: "cpu" or "cuda". */
void bench_run_info_fill(bench_run_info *info, const mpt_comm *comm, const char *device);

/* busbw factor (nccl-tests' PERFORMANCE.md): all-reduce 2 (n - 1) / n, reduce-scatter and
 * all-gather (n - 1) / n, applied to algbw = (bytes of the whole buffer) / time; 0 for one
 * rank. */
double bench_bus_factor(bench_coll coll, int world);

void bench_print_preamble(FILE *f, const bench_run_info *info, const bench_rank_info *ranks,
                          int nranks);
void bench_print_header(FILE *f, const char *raw_name);
/* factor: bench_bus_factor of the run. */
void bench_print_row(FILE *f, const bench_row *r, const char *type, const char *redop,
                     double factor);

/* Writes the whole run as JSON, atomically (a temporary file renamed over path). 0 ok, -1 on
 * an I/O error (the message in mpt_last_error()). */
int bench_write_json(const char *path, const bench_run_info *info, const bench_rank_info *ranks,
                     const bench_config *cfg, const bench_row *rows, int64_t nrows,
                     const bench_summary *s);
/* Whether the JSON file can be written: path is not a folder or other non-regular file, and its
 * temporary file can be created (and is removed again). Run before the measurements, so that a
 * bad --json fails at once, not after them. 0 ok, -1 with the reason in why[n]. */
int bench_json_probe(const char *path, char *why, size_t n);

#endif
