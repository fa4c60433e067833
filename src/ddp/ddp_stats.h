/* The DDP engine's per-pass statistics from bucket timings (internal to src/ddp; tested with
 * fake timings in tests/test_ddp_stats.c). */
#ifndef MPT_DDP_STATS_H
#define MPT_DDP_STATS_H

#include "mpitrain/ddp.h"

/* Adds one synchronised pass to `x` (the last-pass fields and the sums). Times are in ms from
 * the pass's start (prepare_backward, or the call of mpt_ddp_allreduce_grads): bucket b's
 * all-reduce ran from start_ms[b] to end_ms[b]; backward ended at backward_end_ms (0 for a pass
 * without backward); the compute stream was past the wait for the last bucket at done_ms.
 * backward_ms = backward_end_ms; allreduce_ms = sum of the buckets' durations; hidden_ms = the
 * part of each bucket within [0, backward_end_ms]; exposed_comm_ms = done_ms -
 * backward_end_ms, never below 0. Every time must be known: a bucket that has not ended (the
 * defect of reading host stamps before the comm thread wrote them) must never be counted, so
 * a time that is not finite, negative, or a bucket that ends before it starts is refused with
 * MPT_EINVAL and `x` is left unchanged. */
mpt_status mpt__ddp_stats_add(mpt_ddp_stats *x, int nbuckets, const double *start_ms,
                              const double *end_ms, double backward_end_ms, double done_ms);

#endif
