/* The DDP engine's reducers (reducer.h): all-reduce, rs-ag, reduce-scatter to shards, each in
 * float32 or bfloat16 on the wire, and the user's communication hook.
 *
 * Threads: launch runs on the training thread and only enqueues; the bfloat16 conversions run
 * on the comm worker as host functions, each touching only its bucket (to_bf16: the whole
 * bucket; from_bf16: the part the collective reduced). */
#include <stdio.h>

#include "ddp/ddp_impl.h"
#include "ddp/grad_comm.h"
#include "ddp/reducer.h"

/* The part of bucket b a reducer leaves averaged: the whole bucket, or this rank's shard. */
static void reduced_part(const mpt_ddp *d, int b, int64_t *at, int64_t *count) {
  const mpt_ddp_bucket_info *bk = &d->buckets[b];
  if (d->reducer->sharded) {
    *at = bk->offset + d->bucket_shard[2 * b];
    *count = d->bucket_shard[2 * b + 1];
  } else {
    *at = bk->offset;
    *count = bk->count;
  }
}

/* bf16, on the comm worker: the bucket's float32 gradients rounded into its conversion buffer */
static mpt_status to_bf16(void *arg) {
  bucket_arg *a = arg;
  const mpt_ddp_bucket_info *bk = &a->ddp->buckets[a->bucket];
  mpt_bf16_round_array(a->ddp->grads + bk->offset, a->ddp->wire + bk->offset, bk->count);
  return MPT_OK;
}

/* bf16, on the comm worker: the reduced bfloat16 sums widened back and divided by W */
static mpt_status from_bf16(void *arg) {
  bucket_arg *a = arg;
  int64_t at, n;
  reduced_part(a->ddp, a->bucket, &at, &n);
  mpt__ddp_bf16_widen_avg(a->ddp->wire + at, a->ddp->grads + at, n,
                          mpt_comm_world_size(a->ddp->comm));
  return MPT_OK;
}

/* The collectives of each algorithm on one buffer (float32 average or bfloat16 sum). */
enum { ALGO_ALLREDUCE, ALGO_RSAG, ALGO_RS };

static mpt_status launch_algo(mpt_ddp *d, int b, int algo) {
  const mpt_ddp_bucket_info *bk = &d->buckets[b];
  const int bf16 = d->cfg.grad_comm == MPT_DDP_GRAD_BF16;
  const mpt_dtype dtype = bf16 ? MPT_BF16 : MPT_F32;
  const mpt_reduce_op op = bf16 ? MPT_REDUCE_SUM : MPT_REDUCE_AVG;
  const size_t es = bf16 ? sizeof(uint16_t) : sizeof(float);
  char *base = bf16 ? (char *)(d->wire + bk->offset) : (char *)(d->grads + bk->offset);
  if (bf16) MPT_RETURN_IF(mpt_stream_launch_host(d->comm_stream, to_bf16, &d->args[b]));
  if (algo == ALGO_ALLREDUCE) {
    MPT_RETURN_IF(mpt_comm_allreduce(d->comm, d->comm_stream, base, base, bk->count, dtype, op));
  } else {
    int64_t off, n;
    mpt_comm_shard(bk->count, mpt_comm_world_size(d->comm), mpt_comm_rank(d->comm), &off, &n);
    MPT_RETURN_IF(mpt_comm_reduce_scatter(d->comm, d->comm_stream, base, base + (size_t)off * es,
                                          bk->count, dtype, op));
    if (algo == ALGO_RSAG)
      MPT_RETURN_IF(mpt_comm_allgather_shards(d->comm, d->comm_stream, base, bk->count, dtype));
  }
  if (bf16) MPT_RETURN_IF(mpt_stream_launch_host(d->comm_stream, from_bf16, &d->args[b]));
  return MPT_OK;
}

static double wire_bytes(const mpt_ddp *d, int b) {
  return (double)d->buckets[b].count * (d->cfg.grad_comm == MPT_DDP_GRAD_BF16 ? 2.0 : 4.0);
}

static mpt_status allreduce_launch(mpt_ddp *d, int b) { return launch_algo(d, b, ALGO_ALLREDUCE); }
static mpt_status rsag_launch(mpt_ddp *d, int b) { return launch_algo(d, b, ALGO_RSAG); }
/* ZeRO-2: once the shard is reduced, the rest of the bucket's gradients (and its bf16 buffer)
 * is given back (zero.c) */
static mpt_status rs_launch(mpt_ddp *d, int b) {
  MPT_RETURN_IF(launch_algo(d, b, ALGO_RS));
  if (d->cfg.zero < 2) return MPT_OK;
  return mpt_stream_launch_host(d->comm_stream, mpt__ddp_zero_release, &d->args[b]);
}

/* all-reduce 2 (W-1)/W; rs-ag the same (a reduce-scatter and an all-gather, (W-1)/W each) */
static double allreduce_bytes(const mpt_ddp *d, int b) {
  return mpt__ddp_ring_bytes(1, wire_bytes(d, b), mpt_comm_world_size(d->comm));
}

static double rs_bytes(const mpt_ddp *d, int b) {
  return mpt__ddp_ring_bytes(0, wire_bytes(d, b), mpt_comm_world_size(d->comm));
}

/* The user's hook (ddp.h mpt_ddp_register_comm_hook). */
static mpt_status hook_launch(mpt_ddp *d, int b) {
  const mpt_ddp_bucket_info *bk = &d->buckets[b];
  const mpt_ddp_comm_bucket view = {b, bk->offset, bk->count, d->grads + bk->offset, d->comm,
                                    d->comm_stream};
  mpt_error_clear();
  mpt_status st = d->hook(d->hook_state, &view);
  if (st == MPT_OK) return MPT_OK;
  char detail[512];
  snprintf(detail, sizeof detail, "%s", mpt_last_error());
  return MPT_FAIL(st, "the communication hook failed on bucket %d (%s)", b,
                  detail[0] ? detail : mpt_status_name(st));
}

static double no_bytes(const mpt_ddp *d, int b) {
  (void)d;
  (void)b;
  return 0.0;
}

const mpt__ddp_reducer mpt__ddp_reducer_allreduce = {"allreduce", 0, allreduce_launch,
                                                     allreduce_bytes};
const mpt__ddp_reducer mpt__ddp_reducer_rsag = {"rs-ag", 0, rsag_launch, allreduce_bytes};
const mpt__ddp_reducer mpt__ddp_reducer_reduce_scatter = {"reduce-scatter", 1, rs_launch,
                                                          rs_bytes};
const mpt__ddp_reducer mpt__ddp_reducer_hook = {"hook", 0, hook_launch, no_bytes};

const mpt__ddp_reducer *mpt__ddp_reducer_choose(const mpt_ddp *d) {
  if (d->cfg.zero) return &mpt__ddp_reducer_reduce_scatter;
  if (d->rsag) return &mpt__ddp_reducer_rsag;
  return &mpt__ddp_reducer_allreduce;
}

mpt_status mpt_ddp_register_comm_hook(mpt_ddp *d, mpt_ddp_comm_hook hook, void *state) {
  if (!d) return MPT_FAIL(MPT_EINVAL, "mpt_ddp_register_comm_hook: NULL DDP engine");
  if (d->prepared)
    return MPT_FAIL(MPT_ESTATE, "mpt_ddp_register_comm_hook during a backward pass");
  if (hook && d->cfg.zero)
    return MPT_FAIL(MPT_ENOTSUP, "a communication hook with ZeRO-%d: the reduce-scatter into "
                    "the shards belongs to the sharded optimizer", d->cfg.zero);
  if (hook && d->cfg.grad_comm != MPT_DDP_GRAD_FP32)
    return MPT_FAIL(MPT_ENOTSUP, "a communication hook with bf16 gradient communication: "
                    "round to bfloat16 in the hook instead (config.grad_comm fp32)");
  d->hook = hook;
  d->hook_state = hook ? state : NULL;
  d->reducer = hook ? &mpt__ddp_reducer_hook : mpt__ddp_reducer_choose(d);
  return MPT_OK;
}
