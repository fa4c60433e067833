/* The library's threads and the signals they take (none).
 *
 * A process-directed signal (SIGTERM from Slurm, SIGUSR1 forwarded by mpirun, a profiler's
 * SIGPROF, a user's SIGINT) is delivered to any one thread that does not block it, and its
 * handler then runs on that thread's stack, below the thread's stack pointer. Two reasons the
 * library keeps such signals away from the threads that compute:
 *
 * - oneDNN's JIT fp32 GEMM kernels (jit_avx_gemm_f32 on AVX2, jit_avx512_common_gemm_f32 on
 *   AVX-512; every oneDNN before 3.11.2, and Debian 12 ships 2.6.3) point the stack pointer
 *   into a workspace they malloc'd when a block of K does not fit their stack buffer (some of
 *   the MLP trainer's products). A signal taken while such a kernel runs makes the kernel write the
 *   signal frame (registers and AVX state, kilobytes) below that pointer: on the heap, over
 *   malloc's chunk headers and a neighbour's data. Seen as "free(): invalid next size" or
 *   "corrupted size vs. prev_size" aborts, in dnnl_sgemm or at exit, or as silently changed
 *   data (a handler's local variable lay in the brk heap, outside the thread's stack).
 *   tests/test_signals.c fails within seconds without the guard below.
 * - A thread of ours that took a signal would make the program's flag-and-stop preemption (and
 *   its EINTR handling) depend on which thread the kernel picked.
 *
 * So: every thread the library starts blocks the asynchronous signals (mpt__thread_create), and
 * every oneDNN computation runs with them blocked on the calling thread (mpt__signals_block /
 * mpt__signals_restore around it); the OpenMP team that oneDNN (or the fused attention) starts
 * from inside such a call inherits the mask. A signal that arrives meanwhile stays pending until
 * a thread that accepts it can take it: the program's own thread, after the GEMM (microseconds
 * to milliseconds later). The synchronous fault signals (SIGSEGV, SIGBUS, SIGFPE, SIGILL,
 * SIGTRAP, SIGSYS) and SIGABRT are never blocked: they are raised by the faulting thread itself,
 * and a blocked one would kill the process without the handlers that print a stack (Open MPI's).
 *
 * Not covered: threads that other libraries start on their own before the library runs (the
 * OpenBLAS workers its constructor starts at load time; OpenMP workers of a program's own
 * parallel regions run earlier). They keep the creator's mask; OpenBLAS's kernels keep the stack
 * pointer on their stack, so a handler there is harmless. */
#ifndef MPT_CORE_THREADS_H
#define MPT_CORE_THREADS_H

#include <pthread.h>
#include <signal.h>

/* The asynchronous signals: every signal but SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS
 * and SIGABRT (SIGKILL and SIGSTOP cannot be blocked; glibc keeps its own two). */
void mpt__signals_async(sigset_t *set);

/* Blocks the asynchronous signals on the calling thread; *old receives the mask to restore. */
void mpt__signals_block(sigset_t *old);

/* Sets the calling thread's mask back to *old (from mpt__signals_block); a signal that arrived
 * in between is delivered now, if this thread accepts it. */
void mpt__signals_restore(const sigset_t *old);

/* pthread_create whose thread starts with the asynchronous signals blocked (the caller's mask is
 * blocked around the call, so the thread inherits it, then restored). Returns pthread_create's
 * result (0, or an errno value). */
int mpt__thread_create(pthread_t *thread, const pthread_attr_t *attr, void *(*fn)(void *),
                       void *arg);

#endif
