/* Stragglers (trainer.h straggler_warn; docs/hangs.md): at each step line every rank's compute
 * time per step since the last one (forward + backward + optimizer, less the time backward
 * waited for the gradient all-reduce and DataParallel's all-reduce) is all-gathered, one float
 * per rank; rank 0 logs the slowest and the fastest rank with their hosts and the ratio, and
 * warns above straggler_warn. Why compute and not step time: in DDP every rank waits for the
 * slowest at each bucket, so step times are equal and only the time spent computing tells the
 * ranks apart (Horovod's timeline and PyTorch's straggler tools measure the same).
 *
 * Runs on the training thread; collective (every rank reaches each step line). */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>

#include "train/train_impl.h"

mpt_status mpt__train_stragglers(mpt__trainer *t) {
  const double busy = t->sum_forward + t->sum_backward + t->sum_optimizer;
  double wait = t->sum_dp_allreduce;
  if (t->ddp) wait += mpt_ddp_get_stats(t->ddp).sum_exposed_comm_ms;
  const int64_t steps = t->timed_steps - t->strag_steps;
  double compute = steps > 0 ? ((busy - t->strag_busy) - (wait - t->strag_wait)) / (double)steps
                             : 0;
  if (!(compute > 0)) compute = 0;
  const double now = mpt_time_ms();
  const double start = t->strag_start_ms;
  t->strag_busy = busy;
  t->strag_wait = wait;
  t->strag_steps = t->timed_steps;
  t->strag_start_ms = now;
  if (t->world == 1 || steps == 0) return MPT_OK;
  float mine = (float)compute, *all = malloc(sizeof(float) * (size_t)t->world);
  if (!all) return MPT_FAIL(MPT_ENOMEM, "cannot allocate the straggler table");
  mpt_status st = mpt_comm_allgather_sync(t->comm, &mine, all, 1, MPT_F32);
  if (st != MPT_OK) {
    free(all);
    return st;
  }
  int slow = 0, fast = 0;
  for (int r = 1; r < t->world; r++) {
    if (all[r] > all[slow]) slow = r;
    if (all[r] < all[fast]) fast = r;
  }
  const double slow_ms = all[slow], fast_ms = all[fast];
  const double ratio = fast_ms > 0 ? slow_ms / fast_ms : 1.0;
  free(all);
  t->strag_intervals++;
  t->strag_last_ratio = ratio;
  if (ratio > t->strag_max_ratio || t->strag_intervals == 1) {
    t->strag_max_ratio = ratio;
    t->strag_max_slowest = slow;
    t->strag_max_fastest = fast;
  }
  if (t->trace) /* this rank's compute per step over the interval; n: the ratio x 1000 */
    mpt_trace_add(t->trace, "compute per step (stragglers)", 0, start, compute,
                  (int64_t)llround(ratio * 1000));
  if (t->rank != 0) return MPT_OK;
  const int over = ratio > t->c.straggler_warn;
  if (over) t->strag_warnings++;
  mpt_log(over ? MPT_LOG_WARN : MPT_LOG_INFO,
          "stragglers: slowest rank %d (host %s) %.2f ms/step of compute, fastest rank %d "
          "(host %s) %.2f ms/step, ratio %.2f%s (steps %" PRId64 "-%" PRId64 ")", slow,
          mpt_comm_rank_host(t->comm, slow), slow_ms, fast, mpt_comm_rank_host(t->comm, fast),
          fast_ms, ratio, over ? ": above --straggler-warn" : "", t->global_step - steps + 1,
          t->global_step);
  return MPT_OK;
}
