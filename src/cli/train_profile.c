/* --profile's table (train_impl.h trainer_report_op_times): the tape's per-op times
 * (nn.h mpt_tape_set_profiling) as milliseconds per step, largest first, and what the ops do
 * not cover (the optimizer, gradient clipping, waiting for the all-reduce, loading the batch). */
#include <stdlib.h>

#include "cli/train_impl.h"
#include "mpitrain.h"

static int by_total_desc(const void *a, const void *b) {
  const mpt_op_time *x = a, *y = b;
  const double tx = x->forward_ms + x->backward_ms, ty = y->forward_ms + y->backward_ms;
  return tx < ty ? 1 : tx > ty ? -1 : 0;
}

void trainer_report_op_times(const mpt_tape *tape, int64_t steps, double wall_ms,
                             int64_t gemm_calls, double gemm_ms, double gemm_flop) {
  if (steps < 1) { /* warned at the start when the run was known to be this short */
    mpt_log(MPT_LOG_INFO, "--profile: no step after the first was run, so no op was timed");
    return;
  }
  mpt_op_time rows[MPT_TAPE_PROFILE_MAX_OPS];
  const int n = mpt_tape_op_times(tape, rows, MPT_TAPE_PROFILE_MAX_OPS);
  qsort(rows, (size_t)n, sizeof rows[0], by_total_desc);
  const double per = 1.0 / (double)steps, step_ms = wall_ms * per;
  mpt_log(MPT_LOG_INFO, "op times on this rank, ms per step (mean of %lld steps after the "
          "first; step %.1f ms):", (long long)steps, step_ms);
  mpt_log(MPT_LOG_INFO, "  %-24s %8s %11s %11s %10s %8s", "op", "nodes", "forward", "backward",
          "total", "of step");
  double fwd = 0, bwd = 0;
  for (int i = 0; i < n; i++) {
    const double f = rows[i].forward_ms * per, b = rows[i].backward_ms * per;
    fwd += f;
    bwd += b;
    mpt_log(MPT_LOG_INFO, "  %-24s %8.1f %11.2f %11.2f %10.2f %7.1f%%", rows[i].name,
            (double)rows[i].nodes * per, f, b, f + b, 100 * (f + b) / step_ms);
  }
  mpt_log(MPT_LOG_INFO, "  %-24s %8s %11.2f %11.2f %10.2f %7.1f%%", "all ops", "", fwd, bwd,
          fwd + bwd, 100 * (fwd + bwd) / step_ms);
  mpt_log(MPT_LOG_INFO, "  %-24s %8s %11s %11s %10.2f %7.1f%%",
          "rest of the step", "", "", "", step_ms - fwd - bwd,
          100 * (step_ms - fwd - bwd) / step_ms);
  if (gemm_calls > 0) /* CPU only: a GPU's GEMMs are asynchronous and not counted */
    mpt_log(MPT_LOG_INFO, "  %-24s %8.1f %11s %11s %10.2f %7.1f%%  (%.1f GFLOP/s)",
            "GEMMs inside the ops", (double)gemm_calls * per, "", "", gemm_ms * per,
            100 * gemm_ms * per / step_ms, gemm_ms > 0 ? gemm_flop / gemm_ms * 1e-6 : 0.0);
}
