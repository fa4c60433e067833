/* Deadlines kept by the waiter, for stream work that cannot keep its own (docs/comm.md).
 *
 * A blocking MPI collective running on a CPU worker stream cannot be interrupted, so the worker
 * cannot give up on it. Launched with a keeper, such work no longer lets a wait hang: while it
 * runs, every host wait on its stream (mpt_stream_synchronize) or on an event recorded on that
 * stream (mpt_event_synchronize, and a worker stream's wait on such an event) asks the keeper
 * how much longer it may wait, and returns the keeper's error once the work is past its
 * deadline, whatever deadline the caller gave, none (negative) included. The work itself goes
 * on (nothing can stop it); its stream is not marked failed by the waiter.
 *
 * Keeper contract: returns MPT_OK and *left_ms > 0 (the waiter asks again after at most that
 * long, sooner if the wait ends), or an error with its detail set on the calling thread (via
 * MPT_FAIL / mpt_error_set), which the waiter returns. It runs on the waiter's thread with the
 * stream's lock held (and the event's, for event waits): it must not call into streams or
 * events. keeper_arg must stay valid while the work runs.
 *
 * Backends without the slot (CUDA: its work is stopped by the NCCL watchdog) run the work as a
 * plain host function. Private to the library (src/comm uses it). */
#ifndef MPT_CORE_KEEPER_H
#define MPT_CORE_KEEPER_H

#include "mpitrain/core.h"

typedef mpt_status (*mpt__keeper_fn)(void *keeper_arg, double *left_ms);

/* mpt_stream_launch_host with a keeper (see above); same errors. */
mpt_status mpt__stream_launch_host_kept(mpt_stream *stream, mpt_host_fn fn, void *arg,
                                        mpt__keeper_fn keeper, void *keeper_arg);

#endif
