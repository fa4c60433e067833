/* The command line of mpt_allreduce_bench (see allreduce_opts.h). */
#include "bench/allreduce_opts.h"

#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_util.h"

/* ---- options ----------------------------------------------------------------------------- */

const char bench_allreduce_usage[] =
    "usage: mpirun -np N mpt_allreduce_bench [options]\n"
    "All-reduce bandwidth through mpitrain's comm layer (nccl-tests all_reduce_perf format),\n"
    "with raw MPI_Allreduce on the same buffers in the same run.\n"
    "  -b, --minbytes SIZE       smallest message (default 32M; suffixes K, M, G = 2^10..2^30)\n"
    "  -e, --maxbytes SIZE       largest message (default 32M)\n"
    "  -f, --stepfactor F        multiply the size by F each step (default 2)\n"
    "  -i, --stepbytes SIZE      add SIZE each step instead (when -f is 1 or not given)\n"
    "  -n, --iters N             timed iterations per size (default 20)\n"
    "  -w, --warmup-iters N      untimed iterations per size (default 5)\n"
    "  -c, --check 0|1           check every size for correctness first (default 1)\n"
    "  -o, --op sum|min|max|avg  reduction (default sum; prod is not supported by the comm\n"
    "                            layer; raw MPI runs sum for avg)\n"
    "  -d, --datatype float|int32|bfloat16   element type (default float; avg needs float or\n"
    "                            bfloat16; bfloat16: sum or avg, --backend mpi on cpu, summed\n"
    "                            in float32 steps; the raw side uses the same MPI_Op)\n"
    "      --coll allreduce|reducescatter|allgather|rsag   the collective (default allreduce).\n"
    "                            reducescatter: mpt_comm_reduce_scatter (sum or avg) against\n"
    "                            MPI_Reduce_scatter with the same shard counts; allgather:\n"
    "                            out-of-place mpt_comm_allgather of equal blocks against\n"
    "                            MPI_Allgather, in-place mpt_comm_allgather_shards against\n"
    "                            MPI_Allgatherv. Size = the whole buffer; count = per rank;\n"
    "                            busbw = algbw * (n - 1) / n. rsag: an all-reduce (sum or\n"
    "                            avg) as mpt_comm_reduce_scatter + mpt_comm_allgather_shards\n"
    "                            (DDP's rs-ag) against MPI_Allreduce, all-reduce's busbw.\n"
    "                            --backend mpi on cpu only\n"
    "  -z, --blocking 0|1        synchronize after every mpitrain call (default 0)\n"
    "  -R, --repeats R           measure R times in alternation, keep the median (default 1)\n"
    "      --backend mpi|nccl    comm backend (default mpi; nccl needs a CUDA+NCCL build)\n"
    "      --device cpu|cuda|cuda:N  buffers of the mpitrain variants (default cpu, nccl: cuda);\n"
    "                            cuda = cuda:<local rank>; cuda:N = device N on every rank\n"
    "                            (ranks may share it with --backend mpi only)\n"
    "      --confirm 0|1         the comm layer's agreement after each collective\n"
    "                            (confirm_collectives; default: the layer's default, on)\n"
    "      --progress blocking|polling  the MPI backend's progress mode (default: the comm\n"
    "                            layer's, blocking)\n"
    "      --flight-recorder N   the comm's flight recorder: its last N collectives (default:\n"
    "                            the layer's, 2000; 0 = off), to measure its cost\n"
    "      --raw allreduce|iallreduce   the raw MPI baseline (default MPI_Allreduce; with\n"
    "                            --backend nccl the baseline is ncclAllReduce)\n"
    "      --json FILE           write the results as JSON (rank 0)\n"
    "  -h, --help\n"
    "Exit status: 0 ok, 1 wrong results or an error, 2 bad usage.\n";

static int parse_int(const char *s, int64_t lo, int64_t hi, int64_t *out) {
  char *end;
  long long v = strtoll(s, &end, 10);
  if (end == s || *end || v < lo || v > hi) return -1;
  *out = v;
  return 0;
}

int bench_allreduce_parse(int argc, char **argv, bench_opts *o, char *msg, size_t n) {
  static const struct option longs[] = {
      {"minbytes", required_argument, 0, 'b'},   {"maxbytes", required_argument, 0, 'e'},
      {"stepfactor", required_argument, 0, 'f'}, {"stepbytes", required_argument, 0, 'i'},
      {"iters", required_argument, 0, 'n'},      {"warmup-iters", required_argument, 0, 'w'},
      {"check", required_argument, 0, 'c'},      {"op", required_argument, 0, 'o'},
      {"datatype", required_argument, 0, 'd'},   {"blocking", required_argument, 0, 'z'},
      {"repeats", required_argument, 0, 'R'},    {"backend", required_argument, 0, 1},
      {"confirm", required_argument, 0, 2},      {"raw", required_argument, 0, 3},
      {"json", required_argument, 0, 4},         {"help", no_argument, 0, 'h'},
      {"device", required_argument, 0, 5},       {"progress", required_argument, 0, 6},
      {"coll", required_argument, 0, 7},         {"flight-recorder", required_argument, 0, 8},
      {0, 0, 0, 0}};
  memset(o, 0, sizeof *o);
  o->minbytes = o->maxbytes = 32 << 20;
  o->stepfactor = 2;
  o->iters = 20;
  o->warmup = 5;
  o->check = 1;
  o->repeats = 1;
  o->confirm = -1;
  o->progress = -1;
  o->flight = -1;
  o->op = MPT_REDUCE_SUM;
  o->dtype = MPT_F32;
  o->backend = MPT_COMM_BACKEND_MPI;
  int c, factor_given = 0, step_given = 0;
  int64_t v;
  opterr = 0;
  while ((c = getopt_long(argc, argv, "b:e:f:i:n:w:c:o:d:z:R:h", longs, NULL)) != -1) {
    const char *a = optarg;
    switch (c) {
      case 'b':
      case 'e':
      case 'i':
        if (bench_parse_size(a, &v) != 0 || v < 1)
          return snprintf(msg, n, "-%c: '%s' is not a size in bytes (e.g. 8, 64K, 32M, 1G)", c, a),
                 -1;
        if (c == 'b') o->minbytes = v;
        if (c == 'e') o->maxbytes = v;
        if (c == 'i') o->stepbytes = v, step_given = 1;
        break;
      case 'f':
        if (parse_int(a, 1, 1 << 20, &o->stepfactor) != 0)
          return snprintf(msg, n, "-f: '%s' is not an integer factor >= 1", a), -1;
        factor_given = 1;
        break;
      case 'n':
      case 'w':
      case 'c':
      case 'z':
      case 'R':
        if (parse_int(a, c == 'n' || c == 'R' ? 1 : 0,
                      c == 'c' || c == 'z' ? 1 : c == 'R' ? BENCH_MAX_REPEATS : 10000000, &v) != 0)
          return snprintf(msg, n, "-%c: '%s' is out of range", c, a), -1;
        if (c == 'n') o->iters = (int)v;
        if (c == 'w') o->warmup = (int)v;
        if (c == 'c') o->check = (int)v;
        if (c == 'z') o->blocking = (int)v;
        if (c == 'R') o->repeats = (int)v;
        break;
      case 'o':
        if (strcmp(a, "sum") == 0) o->op = MPT_REDUCE_SUM;
        else if (strcmp(a, "min") == 0) o->op = MPT_REDUCE_MIN;
        else if (strcmp(a, "max") == 0) o->op = MPT_REDUCE_MAX;
        else if (strcmp(a, "avg") == 0) o->op = MPT_REDUCE_AVG;
        else if (strcmp(a, "prod") == 0 || strcmp(a, "all") == 0)
          return snprintf(msg, n, "-o %s: mpitrain's comm layer has no %s reduction (it supports "
                          "sum, min, max, avg)", a, strcmp(a, "prod") == 0 ? "prod" : "'all'"), -1;
        else
          return snprintf(msg, n, "-o: unknown reduction '%s' (sum, min, max or avg)", a), -1;
        break;
      case 'd':
        if (strcmp(a, "float") == 0 || strcmp(a, "float32") == 0) o->dtype = MPT_F32;
        else if (strcmp(a, "int32") == 0 || strcmp(a, "int") == 0) o->dtype = MPT_I32;
        else if (strcmp(a, "bfloat16") == 0 || strcmp(a, "bf16") == 0) o->dtype = MPT_BF16;
        else
          return snprintf(msg, n, "-d: datatype '%s' is not supported (float, int32 or "
                          "bfloat16)", a), -1;
        break;
      case 1:
        if (strcmp(a, "mpi") == 0) o->backend = MPT_COMM_BACKEND_MPI;
        else if (strcmp(a, "nccl") == 0) o->backend = MPT_COMM_BACKEND_NCCL;
        else return snprintf(msg, n, "--backend: '%s' is not mpi or nccl", a), -1;
        break;
      case 2:
        if (parse_int(a, 0, 1, &v) != 0)
          return snprintf(msg, n, "--confirm: '%s' is not 0 or 1", a), -1;
        o->confirm = (int)v;
        break;
      case 3:
        if (strcmp(a, "allreduce") == 0) o->raw_nonblocking = 0;
        else if (strcmp(a, "iallreduce") == 0) o->raw_nonblocking = 1;
        else return snprintf(msg, n, "--raw: '%s' is not allreduce or iallreduce", a), -1;
        break;
      case 4:
        if (strlen(a) >= sizeof o->json || !a[0])
          return snprintf(msg, n, "--json: bad file name"), -1;
        snprintf(o->json, sizeof o->json, "%s", a);
        break;
      case 5: {
        mpt_device d;
        if (strlen(a) >= sizeof o->device || mpt_device_parse(a, &d) != MPT_OK)
          return snprintf(msg, n, "--device: '%s' is not cpu, cuda or cuda:N", a), -1;
        snprintf(o->device, sizeof o->device, "%s", a);
        break;
      }
      case 8:
        if (parse_int(a, 0, MPT_COMM_FLIGHT_MAX, &v) != 0)
          return snprintf(msg, n, "--flight-recorder: '%s' is not a count in [0, %d]", a,
                          MPT_COMM_FLIGHT_MAX), -1;
        o->flight = v;
        break;
      case 6:
        if (strcmp(a, "blocking") == 0) o->progress = 1;
        else if (strcmp(a, "polling") == 0) o->progress = 0;
        else return snprintf(msg, n, "--progress: '%s' is not blocking or polling", a), -1;
        break;
      case 7:
        if (strcmp(a, "allreduce") == 0 || strcmp(a, "all_reduce") == 0)
          o->coll = BENCH_COLL_ALLREDUCE;
        else if (strcmp(a, "reducescatter") == 0 || strcmp(a, "reduce_scatter") == 0)
          o->coll = BENCH_COLL_REDUCESCATTER;
        else if (strcmp(a, "allgather") == 0 || strcmp(a, "all_gather") == 0)
          o->coll = BENCH_COLL_ALLGATHER;
        else if (strcmp(a, "rsag") == 0)
          o->coll = BENCH_COLL_RSAG;
        else
          return snprintf(msg, n, "--coll: '%s' is not allreduce, reducescatter, allgather or "
                          "rsag", a), -1;
        break;
      case 'h':
        return 1;
      default:
        return snprintf(msg, n, "unknown option or missing value: '%s' (see --help)",
                        argv[optind - 1]), -1;
    }
  }
  if (optind < argc) return snprintf(msg, n, "unexpected argument '%s'", argv[optind]), -1;
  if (!o->device[0])
    snprintf(o->device, sizeof o->device, "%s", o->backend == MPT_COMM_BACKEND_NCCL ? "cuda" : "cpu");
  if (o->backend == MPT_COMM_BACKEND_NCCL && strncmp(o->device, "cuda", 4) != 0)
    return snprintf(msg, n, "--backend nccl needs --device cuda"), -1;
  if (o->minbytes > o->maxbytes)
    return snprintf(msg, n, "-b %lld is larger than -e %lld", (long long)o->minbytes,
                    (long long)o->maxbytes), -1;
  if (step_given && !factor_given) o->stepfactor = 1;
  if (o->stepfactor == 1 && o->stepbytes == 0) o->stepbytes = o->minbytes;
  if (o->op == MPT_REDUCE_AVG && o->dtype != MPT_F32 && o->dtype != MPT_BF16)
    return snprintf(msg, n, "-o avg needs -d float or bfloat16"), -1;
  const int host_mpi = o->backend == MPT_COMM_BACKEND_MPI && strcmp(o->device, "cpu") == 0;
  if (o->dtype == MPT_BF16 && (o->op == MPT_REDUCE_MIN || o->op == MPT_REDUCE_MAX))
    return snprintf(msg, n, "-d bfloat16 takes -o sum or avg"), -1;
  if (o->dtype == MPT_BF16 && !host_mpi)
    return snprintf(msg, n, "-d bfloat16 needs --backend mpi --device cpu"), -1;
  if (o->coll != BENCH_COLL_ALLREDUCE) {
    if (!host_mpi)
      return snprintf(msg, n, "--coll %s needs --backend mpi --device cpu",
                      bench_coll_name(o->coll)), -1;
    if (o->raw_nonblocking)
      return snprintf(msg, n, "--raw iallreduce is for --coll allreduce"), -1;
    if ((o->coll == BENCH_COLL_REDUCESCATTER || o->coll == BENCH_COLL_RSAG) &&
        o->op != MPT_REDUCE_SUM && o->op != MPT_REDUCE_AVG)
      return snprintf(msg, n, "--coll %s takes -o sum or avg", bench_coll_name(o->coll)), -1;
  }
  if (o->maxbytes / (int64_t)mpt_dtype_size(o->dtype) > INT_MAX / 2)
    return snprintf(msg, n, "-e %lld: at most %d elements per message (one MPI call)",
                    (long long)o->maxbytes, INT_MAX / 2), -1;
  return 0;
}

