/* Private to src/comm and its tests: the parts of the NCCL comm backend (comm_nccl.c) that run
 * without a GPU, so that they are tested on any machine of an NCCL build. No NCCL types here:
 * the unique id travels as its 128 bytes. */
#ifndef MPT_COMM_NCCL_H
#define MPT_COMM_NCCL_H

#include "comm/comm_impl.h"

/* sizeof(ncclUniqueId) (NCCL_UNIQUE_ID_BYTES); comm_nccl.c checks that they agree. */
#define MPT__NCCL_ID_NBYTES 128

/* The bootstrap of an NCCL communicator before ncclCommInitRank (docs/faults.md F13), collective
 * over comm->mpi_comm: rank 0 calls ncclGetUniqueId (which needs no GPU), MPI_Ibcast of the
 * 128 bytes to every rank, then an all-reduce (MAX) of `local_failure` that doubles as the
 * barrier: every rank learns whether some rank could not prepare its side (non-zero: that
 * rank fails with its own detail, the others with MPT_ECOMM naming the lowest such rank), so no
 * rank enters NCCL init alone. Each MPI step is polled until deadline_ms (mpt_time_ms clock).
 * On return id[0..128) is byte-identical on every rank.
 * Errors: MPT_ECOMM (ncclGetUniqueId or an MPI call failed, or another rank failed),
 * MPT_ETIMEOUT (a rank did not arrive in time; MPI may still hold the request: abort). */
mpt_status mpt__nccl_id_bootstrap(mpt_comm *comm, unsigned char id[MPT__NCCL_ID_NBYTES],
                                  int local_failure, double deadline_ms);

#endif
