/* The CPU ops' own threads (cpu_pool.c): the non-GEMM kernels (GELU, LayerNorm, the causal
 * softmax, the vocabulary cross-entropy, bias, AdamW, fills and copies) split their work over
 * mpt_cpu_threads() threads, the count the GEMMs use too (unless MPT_GEMM_THREADS caps theirs,
 * ops.h), so the cores that the GEMMs use do not idle between them.
 *
 * Work is a range [0, n) cut into fixed chunks; each chunk runs exactly once, on the calling
 * thread or on a worker, whichever claims it first (the caller never waits for a worker that has
 * not started: it runs the unclaimed chunks itself, and waits only for chunks already being
 * computed). A kernel whose chunks write disjoint outputs therefore gives the same bits at every
 * thread count; a reduction gets them by fixing its chunks from n alone (never from the thread
 * count) and adding the chunks' partial results in chunk order afterwards.
 *
 * One job at a time: a caller that finds the pool busy (another thread's job: DataParallel
 * replicas, or a chunk that itself calls a parallel kernel) runs its chunks on its own thread.
 * Workers are created on first use, up to mpt_cpu_threads() - 1, block the asynchronous
 * signals (core/threads.h), and sleep on a condition variable between jobs (timed, re-checked;
 * no spinning). After fork() the child starts with no workers. */
#ifndef MPT_CORE_CPU_POOL_H
#define MPT_CORE_CPU_POOL_H

#include <stdint.h>

/* Rows per block of the sums over rows that split by rows (LayerNorm's dweight / dbias, the
 * linear layer's bias gradient): each block sums from 0 into its own partial sum, then the
 * partials are added to the output in block order, at every thread count. */
#define MPT__CPU_SUM_ROWS 256

/* Computes the items [begin, end) of a job; arg is the caller's. */
typedef void (*mpt__cpu_range_fn)(void *arg, int64_t begin, int64_t end);

/* Runs fn over [0, n) in chunks [i chunk, min(n, (i + 1) chunk)), each exactly once, on the
 * calling thread and the workers, and returns when all are done. chunk >= 1; n <= 0 does
 * nothing. With one thread (or one chunk) the chunks run in order on the calling thread. */
void mpt__cpu_parallel_for(int64_t n, int64_t chunk, mpt__cpu_range_fn fn, void *arg);

/* A chunk size for a job of n independent items whose results do not depend on the chunking:
 * n (one chunk: no threads) when mpt_cpu_threads() is 1 or n < 5 grain, else about n / (4
 * threads) (claimed dynamically: a worker that starts late takes fewer), at least grain.
 * grain: items worth about 10 us of work, so a split job has at least ~50 us, and waking a
 * worker (a few us, on the caller) pays. */
int64_t mpt__cpu_parallel_chunk(int64_t n, int64_t grain);

/* The same from an item's cost in picoseconds (measured: e.g. GELU ~1,100 per element), the
 * chunk rounded up to a multiple of `align` items. even: about n / threads instead (one wide
 * chunk per thread: for column splits, whose chunks stride through every row). */
int64_t mpt__cpu_parallel_chunk_ps(int64_t n, double item_ps, int64_t align, int even);

/* Whether a job of n items in chunks of `chunk` would use the workers now (several chunks and
 * several threads): lets a kernel keep a fused one-thread path. */
int mpt__cpu_parallel_would_split(int64_t n, int64_t chunk);

/* Chunks run by the workers (not the caller) since the process started: for tests, which
 * check that a job was really shared. */
int64_t mpt__cpu_pool_worker_chunks(void);

#endif
