/* Internals of the tape shared by its two files: tape.c (the arena, the var and node pools,
 * the tape's lifetime and settings, vars and parameter vars) and tape_backward.c (var
 * gradients, recording, backward, activation checkpoints, profiling's entry points and the
 * accessors of the public op API). src/nn/tape.c's opening comment describes the invariants.
 * Private to those two files. */
#ifndef MPT_NN_TAPE_IMPL_H
#define MPT_NN_TAPE_IMPL_H

#include "mpitrain/autograd.h"
#include "mpitrain/core.h"
#include "nn/tape.h"

#define POOL_BLOCK 256
/* Deadline for host waits on the tape's stream (mpt_var_item, the GPU arena's merge at reset). */
#define TAPE_SYNC_TIMEOUT_MS 600000.0

/* What made a var: only the vars an op made (new, or a view) may be a node's output. */
enum { VAR_NEW, VAR_VIEW, VAR_INPUT, VAR_PARAM };

struct mpt_var {
  mpt_tensor value;
  mpt_tensor grad;   /* data NULL until backward first needs it */
  int requires_grad;
  int param_index;   /* -1 unless this is a parameter's var */
  int kind;          /* VAR_* */
  int grad_unwritten; /* gradient storage made ahead (a checkpoint's input): the next
                       * mpt_var_grad_beta / _acc treats it as freshly allocated */
};

struct mpt_node {
  _Alignas(64) unsigned char ctx[MPT_NODE_CTX_BYTES]; /* the op's context (mpt_node_ctx) */
  mpt_backward_fn backward;
  const char *name; /* op name for error messages ("linear") */
  mpt_var *inputs[MPT_NODE_MAX_INPUTS];
  int ninputs;
  mpt_var *output;
};

typedef struct var_slot {
  mpt_var var;            /* first member: a mpt_var * is a var_slot * */
  struct var_slot *of;    /* the var this one views (shares its gradient), or NULL */
} var_slot;

typedef struct arena_chunk {
  char *base;
  size_t nbytes, used;
} arena_chunk;

/* A pool of fixed-size items in blocks of POOL_BLOCK; items [0, used) are live. */
typedef struct pool {
  void **blocks;
  int nblocks;
  int64_t used;
  size_t item_size;
} pool;

struct mpt_tape {
  mpt_model *model;
  mpt_stream *stream;
  mpt_device device;

  arena_chunk *chunks; /* chunks [0, nchunks); the bump pointer is in chunks[cur_chunk], the
                       * chunks after it are empty */
  int nchunks, cap_chunks, cur_chunk;
  size_t allocations; /* device chunks + host blocks allocated since init */
  void *scratch;        /* mpt_tape_scratch's block in the arena, this pass, or NULL */
  size_t scratch_nbytes;

  pool vars;  /* var_slot */
  pool nodes; /* mpt_node */

  int nparams;           /* size of the arrays below (the model's parameter count) */
  mpt_var **param_vars;  /* [nparams] this pass's parameter vars, NULL until asked */
  int *uses;             /* [nparams] recorded uses this pass */
  int *remaining;        /* [nparams] uses not yet released by backward */

  int grad_enabled;
  mpt_precision precision; /* of the GEMMs and convolutions recorded (default fp32) */
  int model_hooks;   /* call the model's wrapper hooks (default 1) */
  int backward_done; /* backward ran in this pass: the var gradients are spent */
  mpt_grad_ready_fn hook;
  void *hook_user;
  uint64_t seed;
  uint64_t seed_counter;
  mpt__tape_profile *prof; /* op profiling, NULL when off */

  size_t arena_total, arena_peak; /* bytes used in all chunks now, and the most this pass */
  int recompute;        /* mpt_tape_set_recompute */
  int ckpt_forward;     /* inside a checkpoint's forward: mpt_tape_param notes the index */
  int *ckpt_params;     /* the parameters each checkpoint's forward used, one run after
                         * another (the node keeps its run's start and length) */
  int nckpt_params, cap_ckpt_params;
  int *ckpt_stamp;      /* [nparams] the last checkpoint (1-based count) that noted it */
  int ckpt_count;
};

/* A position of the arena's bump pointer (and the scratch block then), to free what was
 * allocated after it (checkpoints: a block's activations). */
typedef struct arena_mark {
  int chunk;
  size_t used, total;
  void *scratch;
  size_t scratch_nbytes;
} arena_mark;

/* Appends a zeroed item to pool p (a new host block when the last one is full). */
mpt_status mpt__tape_pool_take(mpt_tape *tape, pool *p, void **item);
/* Node i of this pass. */
mpt_node *mpt__tape_node_at(const mpt_tape *tape, int64_t i);
/* 1 if `var` is a live var of this pass on this tape. */
int mpt__tape_var_is_live(const mpt_tape *tape, const mpt_var *var);
/* The arena's position now, and the rewind to a position (everything allocated after it is
 * freed). */
arena_mark mpt__tape_arena_mark(const mpt_tape *tape);
void mpt__tape_arena_rewind(mpt_tape *tape, const arena_mark *m);
/* Sizes the per-parameter arrays to the (finalised) model. */
mpt_status mpt__tape_param_arrays(mpt_tape *tape);

#endif
