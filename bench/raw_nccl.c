/* The raw NCCL baseline of mpt_allreduce_bench: a bare ncclAllReduce loop on its own
 * communicator and stream (see raw_nccl.h). Built only when configure found NCCL. */
#include "bench/raw_nccl.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>

struct bench_raw_nccl {
  ncclComm_t comm;
  cudaStream_t stream;
};

int bench_raw_nccl_init(bench_raw_nccl **out, MPI_Comm comm, int device_index, char *err,
                        size_t nbytes) {
  *out = NULL;
  int rank = 0, world = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &world);
  cudaError_t ce = cudaSetDevice(device_index);
  if (ce != cudaSuccess)
    return snprintf(err, nbytes, "cudaSetDevice(%d): %s", device_index, cudaGetErrorString(ce)),
           -1;
  ncclUniqueId id;
  ncclResult_t nr = ncclSuccess;
  if (rank == 0) nr = ncclGetUniqueId(&id);
  int ok = nr == ncclSuccess, all_ok = 0;
  if (MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, comm) != MPI_SUCCESS || !all_ok)
    return snprintf(err, nbytes, "ncclGetUniqueId on rank 0: %s", ncclGetErrorString(nr)), -1;
  if (MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, comm) != MPI_SUCCESS)
    return snprintf(err, nbytes, "MPI_Bcast of the NCCL unique id failed"), -1;
  bench_raw_nccl *r = calloc(1, sizeof *r);
  if (!r) return snprintf(err, nbytes, "out of memory"), -1;
  if ((nr = ncclCommInitRank(&r->comm, world, id, rank)) != ncclSuccess) {
    free(r);
    return snprintf(err, nbytes, "ncclCommInitRank: %s", ncclGetErrorString(nr)), -1;
  }
  if ((ce = cudaStreamCreateWithFlags(&r->stream, cudaStreamNonBlocking)) != cudaSuccess) {
    ncclCommDestroy(r->comm);
    free(r);
    return snprintf(err, nbytes, "cudaStreamCreate: %s", cudaGetErrorString(ce)), -1;
  }
  *out = r;
  return 0;
}

int bench_raw_nccl_run(bench_raw_nccl *r, const void *sendbuf, void *recvbuf, int64_t count,
                       mpt_dtype dtype, mpt_reduce_op op, int iters, char *err, size_t nbytes) {
  ncclDataType_t t = dtype == MPT_F32 ? ncclFloat32 : ncclInt32;
  ncclRedOp_t o = op == MPT_REDUCE_MIN ? ncclMin
                  : op == MPT_REDUCE_MAX ? ncclMax
                  : op == MPT_REDUCE_AVG ? ncclAvg
                                         : ncclSum;
  for (int i = 0; i < iters; i++) {
    ncclResult_t nr = ncclAllReduce(sendbuf, recvbuf, (size_t)count, t, o, r->comm, r->stream);
    if (nr != ncclSuccess)
      return snprintf(err, nbytes, "ncclAllReduce: %s", ncclGetErrorString(nr)), -1;
  }
  cudaError_t ce = cudaStreamSynchronize(r->stream);
  if (ce != cudaSuccess)
    return snprintf(err, nbytes, "cudaStreamSynchronize: %s", cudaGetErrorString(ce)), -1;
  return 0;
}

void bench_raw_nccl_free(bench_raw_nccl *r) {
  if (!r) return;
  cudaStreamDestroy(r->stream);
  ncclCommDestroy(r->comm);
  free(r);
}
