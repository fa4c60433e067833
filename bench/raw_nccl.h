/* The raw NCCL baseline of mpt_allreduce_bench (bench/raw_nccl.c, built with NCCL only): its
 * own NCCL communicator over the ranks of an MPI communicator (rank 0's unique id broadcast over
 * MPI), its own CUDA stream, and ncclAllReduce on the benchmark's device buffers. No deadlines:
 * it is the bare library the comm layer is compared with. Program code (prefix bench_). */
#ifndef MPT_BENCH_RAW_NCCL_H
#define MPT_BENCH_RAW_NCCL_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "mpitrain/comm.h"

typedef struct bench_raw_nccl bench_raw_nccl;

/* Collective over `comm`: one NCCL rank per MPI rank, on CUDA device `device_index` (made
 * current on the calling thread). 0 ok; -1 with a message in err. */
int bench_raw_nccl_init(bench_raw_nccl **out, MPI_Comm comm, int device_index, char *err,
                        size_t nbytes);
/* `iters` ncclAllReduce calls (sendbuf == recvbuf: in place) on the baseline's stream, then
 * cudaStreamSynchronize. avg is ncclAvg. 0 ok; -1 with a message in err. */
int bench_raw_nccl_run(bench_raw_nccl *r, const void *sendbuf, void *recvbuf, int64_t count,
                       mpt_dtype dtype, mpt_reduce_op op, int iters, char *err, size_t nbytes);
void bench_raw_nccl_free(bench_raw_nccl *r);

#endif
