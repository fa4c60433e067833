/* The CUDA backend's interface to the other layers of mpitrain (comm's NCCL and MPI-staging
 * backends, the DP mode): plain C, no CUDA headers, so a file that includes it still compiles
 * when CUDA was not built (the functions then simply do not exist: call them only under
 * #ifdef MPT_HAVE_CUDA). Always include it as "core/cuda/cuda.h" (a bare "cuda.h" is the CUDA
 * driver API's header).
 *
 * Thread rules: every function here may be called from any thread. */
#ifndef MPT_CORE_CUDA_CUDA_H
#define MPT_CORE_CUDA_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "mpitrain/core.h"

/* The stream's cudaStream_t as a void *, or NULL when `stream` is NULL or not a CUDA stream.
 * The handle stays valid until mpt_stream_free; work enqueued on it directly (ncclAllReduce)
 * is ordered with the backend's own work on the stream. */
void *mpt__cuda_stream_handle(mpt_stream *stream);

/* Marks a CUDA stream failed with `status` (sticky, as a failed host function does): later ops
 * on it return the status with `detail`, and so do waits on it and on events recorded on it.
 * For asynchronous errors found outside the backend (ncclCommGetAsyncError). The first error
 * wins. A non-CUDA stream or MPT_OK is ignored. */
void mpt__cuda_stream_set_error(mpt_stream *stream, mpt_status status, const char *detail);

/* Clears a cudaErrorNotReady left in the calling thread's last-error slot by a query
 * (cudaEventQuery, cudaStreamQuery) that found work still running, so that the next launch
 * check (cudaGetLastError after a kernel) does not report it as a failure. Any other error
 * stays for that check to see. Call after a polling loop. */
void mpt__cuda_clear_not_ready(void);

/* Lets cuda:from access cuda:to's memory directly (cudaDeviceEnablePeerAccess), so that copies
 * between them skip host memory. 1 when peer access is on (now or already), 0 when the pair
 * cannot (no P2P path, or an error, which is cleared). Leaves the calling thread's current
 * device as it was. */
int mpt__cuda_enable_peer_access(int from, int to);

/* Page-locked host memory (cudaMallocHost) for staging copies: copies between it and device
 * memory are truly asynchronous. Errors: MPT_ENOMEM, MPT_EDEVICE (no CUDA device). nbytes == 0
 * gives NULL. mpt__cuda_host_free(NULL) is a no-op. */
mpt_status mpt__cuda_host_alloc(size_t nbytes, void **ptr);
void mpt__cuda_host_free(void *ptr);

/* The physical identity of cuda:index, 16 bytes: its UUID (cudaDeviceProp.uuid, what
 * nvidia-smi shows as GPU-...), or, when the driver reports none, "pci" then its PCI domain (4
 * bytes, little-endian), bus and device numbers. The same GPU gives the same bytes in every
 * process, whatever CUDA_VISIBLE_DEVICES each has. Errors: MPT_EINVAL (not present),
 * MPT_EDEVICE. */
mpt_status mpt__cuda_device_uid(int index, uint8_t uid[16]);

/* The caching allocator's counters for one device (see cuda_alloc.c). */
typedef struct mpt__cuda_alloc_stats {
  size_t reserved_nbytes; /* held from cudaMalloc: in use + cached */
  size_t in_use_nbytes;   /* handed out by mpt_device_alloc (rounded to the size class) */
  int64_t malloc_count;   /* cudaMalloc calls so far (flat after warm-up) */
  int64_t cache_hits;     /* allocations served from the cache */
  int64_t fence_waits;    /* times the allocator WAITED for fences (out of memory, empty) */
} mpt__cuda_alloc_stats;

/* A host worker that issues copies into (or out of) a device's memory later than the caller
 * enqueued them (the staged MPI backend): the allocator's fences include it, so that a block
 * freed while such a copy is still queued is not reused before the copy ran. ticket() returns
 * a number for "the work queued so far" (called with allocator locks held: must not block or
 * allocate); done(ticket) is 1 once all of that work has finished (or was dropped for good). */
typedef struct mpt__cuda_host_source {
  void *ctx;
  uint64_t (*ticket)(void *ctx);
  int (*done)(void *ctx, uint64_t ticket);
} mpt__cuda_host_source;

/* Registers a source with the allocator of cuda:index until removed (by its ctx). Errors:
 * MPT_EINVAL, MPT_ENOMEM. */
mpt_status mpt__cuda_alloc_add_host_source(int index, const mpt__cuda_host_source *src);
void mpt__cuda_alloc_remove_host_source(int index, void *ctx);

/* Errors: MPT_EINVAL for a device index that is not present. */
mpt_status mpt__cuda_alloc_get_stats(int index, mpt__cuda_alloc_stats *stats);
/* Returns every cached (free) block of the device to the driver (cudaFree). Blocks still in use
 * are untouched. Errors: MPT_EINVAL, MPT_EDEVICE, MPT_ETIMEOUT (streams did not drain). */
mpt_status mpt__cuda_alloc_empty_cache(int index);

#endif
