/* The DDP engine's reducers: what happens to a gradient bucket once it is ready, with PyTorch's
 * communication hook (DistributedDataParallel.register_comm_hook) as the model. The engine
 * (ddp.c) knows only this interface: it waits for the bucket's ready event on the comm stream,
 * calls the reducer's launch, and waits for the comm stream at the end of backward. Which
 * reducer runs is chosen once, at init (mpt__ddp_reducer_choose), or by the user
 * (mpt_ddp_register_comm_hook):
 *   allreduce        the average of the whole bucket with the backend's all-reduce
 *   rs-ag            a reduce-scatter of the bucket then the all-gather of its shards
 *   reduce-scatter   the reduce-scatter only: this rank's shard of the bucket holds the average
 *                    (sharded: ZeRO-1 and ZeRO-2, whose optimizer steps the shard)
 *   hook             the user's function (ddp.h mpt_ddp_comm_hook)
 * Each built-in reducer takes the wire format of config.grad_comm: float32 (an AVG collective
 * in place) or bfloat16 (the bucket rounded into its conversion buffer on the comm worker, a
 * SUM collective on it, which the comm layer accumulates in float32 and rounds once, then the
 * reduced part widened back and divided by W). Internal to src/ddp. */
#ifndef MPT_DDP_REDUCER_H
#define MPT_DDP_REDUCER_H

#include "mpitrain/core.h"

struct mpt_ddp;

typedef struct mpt__ddp_reducer {
  const char *name;
  /* 1: after launch only this rank's shard of the bucket (bucket_shard) holds the average */
  int sharded;
  /* Enqueues bucket b's reduction on the comm stream (the training thread calls it, after the
   * comm stream was made to wait for the bucket's gradients). */
  mpt_status (*launch)(struct mpt_ddp *d, int b);
  /* Bytes one rank sends for bucket b (ring model of nccl-tests); 0 when unknown (hook). */
  double (*bytes)(const struct mpt_ddp *d, int b);
} mpt__ddp_reducer;

extern const mpt__ddp_reducer mpt__ddp_reducer_allreduce;
extern const mpt__ddp_reducer mpt__ddp_reducer_rsag;
extern const mpt__ddp_reducer mpt__ddp_reducer_reduce_scatter;
extern const mpt__ddp_reducer mpt__ddp_reducer_hook;

/* The built-in reducer for d's configuration: reduce-scatter with ZeRO (stage >= 1) at W > 1,
 * rs-ag for config.allreduce RS_AG at W > 1, else allreduce. */
const mpt__ddp_reducer *mpt__ddp_reducer_choose(const struct mpt_ddp *d);

#endif
