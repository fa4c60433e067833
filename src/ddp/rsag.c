/* Plain DDP's all-reduce as a reduce-scatter followed by an all-gather (ddp.h,
 * MPT_DDP_ALLREDUCE_RS_AG), and the sum of squares of the gradients in ZeRO-1's partition, which
 * both plain DDP (this algorithm) and ZeRO-1 (zero.c) clip with.
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
 * Threads: the training thread; rsag_from_bf16 runs on the comm worker (its bucket only). */
#include <math.h>

#include "core/error.h"
#include "ddp/ddp_impl.h"
#include "ddp/grad_comm.h"
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

/* bf16, on the comm worker: the bucket's bfloat16 sums (all shards gathered) widened back into
 * the float32 gradients and divided by W. */
static mpt_status rsag_from_bf16(void *arg) {
  bucket_arg *a = arg;
  const mpt_ddp_bucket_info *bk = &a->ddp->buckets[a->bucket];
  mpt__ddp_bf16_widen_avg(a->ddp->wire + bk->offset, a->ddp->grads + bk->offset, bk->count,
                          mpt_comm_world_size(a->ddp->comm));
  return MPT_OK;
}

mpt_status mpt__ddp_rsag_launch(mpt_ddp *d, int b) {
  const mpt_ddp_bucket_info *bk = &d->buckets[b];
  const int world = mpt_comm_world_size(d->comm);
  int64_t off, n;
  mpt_comm_shard(bk->count, world, mpt_comm_rank(d->comm), &off, &n);
  const double wire = d->cfg.grad_comm == MPT_DDP_GRAD_FP32 ? 4.0 : 2.0;
  d->sent_bytes += mpt__ddp_ring_bytes(1, wire * (double)bk->count, world); /* RS + AG */
  if (d->cfg.grad_comm == MPT_DDP_GRAD_FP32) {
    float *slice = d->grads + bk->offset;
    MPT_RETURN_IF(mpt_comm_reduce_scatter(d->comm, d->comm_stream, slice, slice + off,
                                          bk->count, MPT_F32, MPT_REDUCE_AVG));
    return mpt_comm_allgather_shards(d->comm, d->comm_stream, slice, bk->count, MPT_F32);
  }
  uint16_t *w = d->wire + bk->offset;
  MPT_RETURN_IF(mpt_stream_launch_host(d->comm_stream, mpt__ddp_zero_to_bf16, &d->args[b]));
  MPT_RETURN_IF(mpt_comm_reduce_scatter(d->comm, d->comm_stream, w, w + off, bk->count, MPT_BF16,
                                        MPT_REDUCE_SUM));
  MPT_RETURN_IF(mpt_comm_allgather_shards(d->comm, d->comm_stream, w, bk->count, MPT_BF16));
  return mpt_stream_launch_host(d->comm_stream, rsag_from_bf16, &d->args[b]);
}
