/* Command line of mpt_allreduce_bench (bench/allreduce.c): nccl-tests' flags and meaning, plus
 * mpitrain's own (backend, device, progress mode, agreement, raw baseline, repeats, JSON). Pure
 * parsing, no I/O. Program code (prefix bench_). */
#ifndef MPT_BENCH_ALLREDUCE_OPTS_H
#define MPT_BENCH_ALLREDUCE_OPTS_H

#include <stddef.h>
#include <stdint.h>

#include "bench/bench_util.h"
#include "mpitrain/comm.h"

enum { BENCH_MAX_REPEATS = 99 };

typedef struct bench_opts {
  int64_t minbytes, maxbytes, stepbytes;
  int64_t stepfactor;
  int iters, warmup, check, blocking, repeats;
  int confirm;       /* -1: the comm layer's default */
  int progress;      /* -1: the comm layer's default (blocking); 1 blocking; 0 polling */
  int64_t flight;    /* --flight-recorder: -1: the comm layer's default */
  int raw_nonblocking;
  mpt_reduce_op op;
  mpt_dtype dtype;
  bench_coll coll; /* --coll (default all-reduce) */
  mpt_comm_backend backend;
  char device[32]; /* "cpu", "cuda" (cuda:<local rank>) or "cuda:N" */
  char json[4096];
} bench_opts;

extern const char bench_allreduce_usage[];

/* Parses argv into *o (defaults first). 0: run; 1: --help (print bench_allreduce_usage);
 * -1: bad usage, a one-line message in msg. */
int bench_allreduce_parse(int argc, char **argv, bench_opts *o, char *msg, size_t nbytes);

#endif
