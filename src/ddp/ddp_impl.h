/* The DDP engine's state, shared by ddp.c (bucket plan, hooks, launches), reducer.c (what a
 * bucket's reduction enqueues), zero.c (the shards: the sharded optimizer step, all-gather,
 * clipping, checkpoints) and rsag.c (the norm in shard order). Internal to src/ddp. */
#ifndef MPT_DDP_IMPL_H
#define MPT_DDP_IMPL_H

#include "mpitrain/comm.h"
#include "mpitrain/ddp.h"
#include "mpitrain/optim.h"

struct mpt__ddp_reducer;

/* How a pass is timed (see the header comment). */
enum { TIMING_NOW, TIMING_LATE, TIMING_EVENTS };

typedef struct bucket_arg {
  struct mpt_ddp *ddp;
  int bucket;
} bucket_arg;

struct mpt_ddp {
  mpt_model *model;
  mpt_comm *comm;
  mpt_stream *compute;
  mpt_stream *comm_stream;
  mpt_ddp_config cfg;
  int nparams, nbuckets;
  mpt_ddp_bucket_info *buckets; /* [nbuckets] */
  int *param_bucket;            /* [nparams] */
  int *bucket_params;           /* [nbuckets] parameters per bucket */
  int *bucket_pending;          /* [nbuckets] parameters not ready yet in this pass */
  unsigned char *param_ready;   /* [nparams] */
  bucket_arg *args;             /* [nbuckets] */
  mpt_event **ready_events;     /* [nbuckets] recorded on compute before the launch */
  mpt_event *done_event;        /* recorded on the comm stream after the last bucket */
  mpt_event *order_event;       /* on the compute stream, before a broadcast of the model */
  double *bucket_start_ms, *bucket_end_ms; /* [nbuckets], written on the comm thread */
  int next_bucket;
  int sync, prepared;
  int forward_open;     /* a training forward ran; its backward has not started */
  int synced;           /* the gradient buffer holds averaged gradients (a synchronised
                           backward, or mpt_ddp_allreduce_grads) not yet zeroed */
  mpt_status failed;    /* an earlier backward failed on this rank: refuse further passes */
  char failed_detail[512];
  uint64_t generation;  /* the model's at init (mpt_model_generation) */
  float *params, *grads;
  mpt_status hook_error;
  double prepare_ms;
  double backward_end_ms;        /* host clock, at finalize's entry */
  double done_ms;                /* host clock, after finalize's wait was enqueued / done */
  int timing;                    /* TIMING_* */
  int stats_pending;             /* a pass whose timings are not all known yet */
  int pass_backward;             /* the pending pass had a backward (not allreduce_grads) */
  mpt_event **start_events, **end_events; /* [nbuckets] TIMING_EVENTS: on the comm stream */
  mpt_event *pass_start, *backward_end, *pass_done; /* TIMING_EVENTS: on the compute stream */
  mpt_ddp_stats stats;
  mpt_trace *trace;
  uint16_t *wire; /* grad_comm bf16: one conversion buffer per bucket, bucket b at its offset */
  const struct mpt__ddp_reducer *reducer; /* reducer.h: built-in, or the user's hook */
  mpt_ddp_comm_hook hook;                 /* mpt_ddp_register_comm_hook; NULL: built-in */
  void *hook_state;
  /* ZeRO-1 (cfg.zero == 1; zero.c): this rank's shard of each bucket, by offset */
  int nshard;
  mpt_optim_range *shard;   /* [nshard] sorted by offset (empty shards left out) */
  int64_t shard_count;      /* elements owned */
  int64_t *bucket_shard;    /* [2 * nbuckets]: offset (in the bucket) and count of its shard */
  double sent_bytes;        /* bytes this rank sent in the engine's collectives (ring model) */
  int rsag; /* plain DDP all-reduces as reduce-scatter + all-gather (rsag.c; cfg.allreduce) */
  /* ZeRO-3 (cfg.zero == 3 at W > 1; zero.c): parameters sharded as the gradients; a bucket's
   * parameters are whole only while gathered */
  int z3;
  unsigned char *gathered; /* [nbuckets] Z3_*: the bucket's parameters given back, whole and
                              current, or being all-gathered (a prefetch) */
  mpt_event **gather_events; /* [nbuckets] recorded on the comm stream after its all-gather */
  int bwd_unit;            /* the unit whose nodes backward last ran (prefetch: the one before) */
  int in_backward;         /* between the before_backward and after_backward hooks */
  int *param_unit;         /* [nparams] the model's unit of each parameter (mpt_model_units) */
  int *unit_first;         /* [nunits + 1] a copy of the units, with the parameter count last */
  int nunits;
  int cur_unit, prev_unit; /* the forward's current and previous unit (-1: none yet) */
  int64_t gathers;         /* buckets all-gathered for ZeRO-3 since init */
};

#define MPT__DDP_CLIP_EPS 1e-6 /* as mpt_clip_grad_norm (torch.nn.utils.clip_grad_norm_) */

/* zero.c. At init (after the bucket plan): this rank's shard of each bucket (mpt_comm_shard of
 * the bucket's count). Errors: MPT_ENOMEM. */
mpt_status mpt__ddp_zero_init(struct mpt_ddp *d);
/* ZeRO-2, on the comm worker after bucket arg->bucket's reduce-scatter: the pages of the
 * bucket's gradient slice outside this rank's shard, and of its bf16 conversion buffer, are
 * given back to the system (madvise MADV_DONTNEED: they read as zero until written again).
 * Always MPT_OK (a page that cannot be given back stays). */
mpt_status mpt__ddp_zero_release(void *arg);
/* ZeRO-2's zero_grads model hook (nn.h): the gradient buffer zeroed by giving its whole pages
 * back (they read as zero) and writing zeros only into the pages it shares with other memory at
 * its ends, so zero_grad does not make the whole buffer resident again. MPT_OK. */
mpt_status mpt__ddp_zero_grads(void *user, float *grads, int64_t count);

/* ZeRO-3 (zero.c): at init (after zero_init): the units and the gathered flags (every bucket
 * whole after the broadcast). Errors: MPT_ENOMEM. */
mpt_status mpt__ddp_z3_init(struct mpt_ddp *d);
/* At init, for a model whose initialisation is pending (nn.h mpt_model_init_unit): each unit
 * initialised in turn on every rank, its bucket broadcast from rank 0 and given back outside
 * this rank's shard, so no rank holds more than its shard and one unit. Collective. Errors:
 * those of the initialisation, comm errors. */
mpt_status mpt__ddp_z3_init_by_unit(struct mpt_ddp *d);
/* The param_needed model hook (nn.h): a forward's move to another unit gives back the buckets
 * of neither this unit nor the previous one; the parameter's bucket is all-gathered if it is not
 * whole (waited for). */
mpt_status mpt__ddp_z3_param_needed(void *user, mpt_tape *tape, int param, int phase);
/* Bucket b's parameters outside this rank's shard given back (whole pages); not gathered (a
 * gather in flight is waited for first). Errors: those of the wait. */
mpt_status mpt__ddp_z3_release(struct mpt_ddp *d, int b);
/* The ZeRO-3 events freed (mpt_ddp_free). */
void mpt__ddp_z3_free(struct mpt_ddp *d);

/* rsag.c. The sum of squares (double) of rank `rank`'s ZeRO shard of the gradient buffer: its
 * shard of each bucket in increasing offset, each summed in 16 lanes. Every rank computes the same
 * double for the same gradients. */
double mpt__ddp_shard_sq(const struct mpt_ddp *d, int rank);
/* Plain DDP's clipping with cfg.allreduce RS_AG: the norm from the W shard sums added in rank
 * order (what ZeRO-1 computes), then the whole buffer scaled. Local (no collective). */
mpt_status mpt__ddp_rsag_clip(struct mpt_ddp *d, mpt_stream *stream, float max_norm,
                              float *total_norm);

/* Bytes one rank sends in a collective of `nbytes` over `world` ranks, in the ring model of
 * nccl-tests: all-reduce 2 (W-1)/W nbytes, reduce-scatter and all-gather (W-1)/W nbytes. */
double mpt__ddp_ring_bytes(int allreduce, double nbytes, int world);

#endif
