/* The DDP engine's per-pass statistics (ddp_stats.h): pure arithmetic on timings that the
 * engine gathered once they all exist (host stamps after the host waited for the last bucket;
 * CUDA event times after the events completed). No state, any thread. */
#include <math.h>

#include "ddp/ddp_stats.h"

static int bad_time(double t) { return !isfinite(t) || t < 0; }

mpt_status mpt__ddp_stats_add(mpt_ddp_stats *x, int nbuckets, const double *start_ms,
                              const double *end_ms, double backward_end_ms, double done_ms) {
  if (!x || nbuckets < 0 || (nbuckets > 0 && (!start_ms || !end_ms)))
    return MPT_FAIL(MPT_EINVAL, "ddp stats: NULL argument");
  if (bad_time(backward_end_ms) || bad_time(done_ms))
    return MPT_FAIL(MPT_EINVAL, "ddp stats: backward end %g ms, done %g ms", backward_end_ms,
                    done_ms);
  double allreduce = 0, hidden = 0;
  for (int b = 0; b < nbuckets; b++) {
    const double s = start_ms[b], e = end_ms[b];
    if (bad_time(s) || bad_time(e) || e < s)
      return MPT_FAIL(MPT_EINVAL, "ddp stats: bucket %d ran from %g to %g ms (not finished?)",
                      b, s, e);
    allreduce += e - s;
    const double hi = e < backward_end_ms ? e : backward_end_ms;
    if (hi > s) hidden += hi - s;
  }
  x->backward_ms = backward_end_ms;
  x->exposed_comm_ms = done_ms > backward_end_ms ? done_ms - backward_end_ms : 0;
  x->allreduce_ms = allreduce;
  x->hidden_ms = hidden;
  x->steps++;
  x->sum_backward_ms += x->backward_ms;
  x->sum_exposed_comm_ms += x->exposed_comm_ms;
  x->sum_allreduce_ms += allreduce;
  x->sum_hidden_ms += hidden;
  return MPT_OK;
}
