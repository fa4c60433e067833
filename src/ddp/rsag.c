/* The clipping norm of plain DDP's rs-ag all-reduce (ddp.h MPT_DDP_ALLREDUCE_RS_AG; its
 * collectives are reducer.c's rs-ag reducer): the sum of squares of the gradients in ZeRO's
 * partition, which both plain DDP with rs-ag and ZeRO (zero.c) clip with.
 *
 * Why: MPI_Allreduce and MPI_Reduce_scatter add the W ranks' values in different orders at
 * W > 2 (a few ulps per element), so plain DDP and ZeRO-1 drift apart under AdamW. Built from
 * the reduce-scatter that ZeRO-1 issues for the same bucket (same count, same shard layout of
 * mpt_comm_shard, same average), every element's sum is the same bits in both; the all-gather
 * only copies. The clipping norm is summed alike: per rank, over that rank's shard of every
 * bucket in increasing offset (16 lane-wise double partial sums per slice, added in lane order,
 * then the slices added in order), and the W rank sums added in rank order. ZeRO-1 all-gathers
 * the W sums; plain DDP holds every gradient and computes them all locally. Same doubles, same
 * norm, same clipping coefficient.
 *
 * Threads: the training thread. */
#include <math.h>

#include "ddp/ddp_impl.h"
#include "mpitrain/ops.h"

double mpt__ddp_shard_sq(const mpt_ddp *d, int rank) {
  const int world = mpt_comm_world_size(d->comm);
  double sq = 0;
  /* bucket b + 1 lies before bucket b in the flat buffer (reverse registration order) */
  for (int b = d->nbuckets - 1; b >= 0; b--) {
    int64_t off, n;
    mpt_comm_shard(d->buckets[b].count, world, rank, &off, &n);
    if (n > 0) sq += mpt_cpu_sum_squares(d->grads + d->buckets[b].offset + off, n);
  }
  return sq;
}

mpt_status mpt__ddp_rsag_clip(mpt_ddp *d, mpt_stream *stream, float max_norm,
                              float *total_norm) {
  if (!(max_norm > 0.0f))
    return MPT_FAIL(MPT_EINVAL, "clip_grad_norm: max_norm = %g must be > 0", (double)max_norm);
  const int world = mpt_comm_world_size(d->comm);
  double sq = 0;
  for (int r = 0; r < world; r++) sq += mpt__ddp_shard_sq(d, r); /* ZeRO-1's order */
  const double norm = sqrt(sq);
  if (total_norm) *total_norm = (float)norm;
  if (!isfinite(norm)) return MPT_OK; /* the caller decides (skip the step) */
  const double coef = (double)max_norm / (norm + MPT__DDP_CLIP_EPS);
  if (coef >= 1.0) return MPT_OK;
  return mpt_op_scale(stream, d->grads, mpt_model_param_count(d->model), (float)coef);
}
