/* The reverse-mode autodiff tape (include/mpitrain/nn.h, internals in src/nn/tape.h): the
 * arena, the var and node pools, parameter vars and use counts, and backward.
 *
 * Arena. Device memory on the model's device, as a list of chunks with a bump pointer; every
 * allocation is rounded up to 64 bytes and starts 64-byte aligned. At reset, if the pass used
 * more than one chunk, all chunks are replaced by ONE chunk of the total bytes used, which the
 * same pass fits exactly (the rounded sizes add up the same way in one chunk), so after the
 * first step or two the steady state allocates nothing.
 *
 * Vars and nodes live in host blocks of fixed size (pools): a var's address is stable for the
 * whole pass (ops keep pointers to their inputs), blocks are reused after reset and only new
 * blocks are ever allocated. Every var is the first member of a var_slot that also remembers
 * what it views (flatten): a view var SHARES its base's gradient storage, so the view op's
 * backward has nothing to do (its gradient already landed in the base).
 *
 * Parameter vars: one per parameter per pass, created by mpt_tape_param, viewing the model's
 * flat parameter and gradient buffers. uses[i] counts the recorded node inputs that are
 * parameter i's var (twice if a node takes it twice). Backward walks the nodes in reverse;
 * a node whose output got no gradient is skipped (it contributes zero) but its parameter uses
 * are still released; when a parameter's remaining uses reach zero its gradient is final and
 * the grad-ready hook fires.
 *
 * One thread at a time; all device work goes on the tape's stream. */
#include <stdlib.h>
#include <string.h>

#include "mpitrain/core.h"
#include "mpitrain/autograd.h"
#include "mpitrain/ops.h"
#include "mpitrain/ops_bf16.h"
#include "nn/tape.h"

#define ARENA_ALIGN ((size_t)64)
#define ARENA_MIN_CHUNK ((size_t)64 * 1024)
#define POOL_BLOCK 256
/* Deadline for host waits on the tape's stream (mpt_var_item, arena consolidation). */
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

  arena_chunk *chunks; /* chunks [0, nchunks); the bump pointer is in chunks[nchunks - 1] */
  int nchunks, cap_chunks;
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

/* ---- pools ---- */

static mpt_status pool_take(mpt_tape *tape, pool *p, void **item) {
  const int64_t block = p->used / POOL_BLOCK, slot = p->used % POOL_BLOCK;
  if (block == p->nblocks) {
    void **blocks = realloc(p->blocks, (size_t)(p->nblocks + 1) * sizeof *blocks);
    if (!blocks) return MPT_FAIL(MPT_ENOMEM, "tape: out of host memory for the pool");
    p->blocks = blocks;
    /* 64-byte aligned: a node's context is (mpt_node_ctx). */
    const size_t nbytes = (POOL_BLOCK * p->item_size + 63) & ~(size_t)63;
    p->blocks[p->nblocks] = aligned_alloc(64, nbytes);
    if (!p->blocks[p->nblocks])
      return MPT_FAIL(MPT_ENOMEM, "tape: out of host memory for the pool");
    p->nblocks++;
    tape->allocations++;
  }
  *item = (char *)p->blocks[block] + (size_t)slot * p->item_size;
  memset(*item, 0, p->item_size);
  p->used++;
  return MPT_OK;
}

static void pool_free(pool *p) {
  for (int i = 0; i < p->nblocks; i++) free(p->blocks[i]);
  free(p->blocks);
  memset(p, 0, sizeof *p);
}

static mpt_node *node_at(const mpt_tape *tape, int64_t i) {
  return (mpt_node *)((char *)tape->nodes.blocks[i / POOL_BLOCK] +
                       (size_t)(i % POOL_BLOCK) * sizeof(mpt_node));
}

/* 1 if `var` is a live var of this pass on this tape. */
static int var_is_live(const mpt_tape *tape, const mpt_var *var) {
  for (int b = 0; b < tape->vars.nblocks; b++) {
    const char *lo = tape->vars.blocks[b], *hi = lo + POOL_BLOCK * sizeof(var_slot);
    const char *v = (const char *)var;
    if (v >= lo && v < hi) {
      int64_t index = (int64_t)b * POOL_BLOCK + (int64_t)((size_t)(v - lo) / sizeof(var_slot));
      return index < tape->vars.used;
    }
  }
  return 0;
}

/* ---- arena ---- */

static void arena_release(mpt_tape *tape) {
  for (int i = 0; i < tape->nchunks; i++) mpt_device_free(tape->device, tape->chunks[i].base);
  tape->nchunks = 0;
}

static mpt_status arena_add_chunk(mpt_tape *tape, size_t nbytes) {
  if (tape->nchunks == tape->cap_chunks) {
    int cap = tape->cap_chunks ? 2 * tape->cap_chunks : 8;
    arena_chunk *chunks = realloc(tape->chunks, (size_t)cap * sizeof *chunks);
    if (!chunks) return MPT_FAIL(MPT_ENOMEM, "tape arena: out of host memory");
    tape->chunks = chunks;
    tape->cap_chunks = cap;
    tape->allocations++;
  }
  void *base = NULL;
  mpt_status st = mpt_device_alloc(tape->device, nbytes, &base);
  if (st != MPT_OK) return st;
  tape->chunks[tape->nchunks++] = (arena_chunk){.base = base, .nbytes = nbytes, .used = 0};
  tape->allocations++;
  return MPT_OK;
}

mpt_status mpt_tape_alloc(mpt_tape *tape, size_t nbytes, void **ptr) {
  if (!tape || !ptr) return MPT_FAIL(MPT_EINVAL, "tape_alloc: NULL tape or output");
  *ptr = NULL;
  /* Round up to the alignment; even an empty request gets its own (non-NULL) slot. */
  if (nbytes > SIZE_MAX - ARENA_ALIGN)
    return MPT_FAIL(MPT_ENOMEM, "tape arena: request of %zu bytes is too large", nbytes);
  size_t need = nbytes == 0 ? ARENA_ALIGN : (nbytes + ARENA_ALIGN - 1) & ~(ARENA_ALIGN - 1);
  arena_chunk *c = tape->nchunks ? &tape->chunks[tape->nchunks - 1] : NULL;
  if (!c || c->nbytes - c->used < need) {
    size_t size = c ? 2 * c->nbytes : ARENA_MIN_CHUNK;
    if (size < need) size = need;
    mpt_status st = arena_add_chunk(tape, size);
    if (st != MPT_OK) return st;
    c = &tape->chunks[tape->nchunks - 1];
  }
  *ptr = c->base + c->used;
  c->used += need;
  tape->arena_total += need;
  if (tape->arena_total > tape->arena_peak) tape->arena_peak = tape->arena_total;
  return MPT_OK;
}

/* A position of the arena's bump pointer (and the scratch block then), to free what was
 * allocated after it (checkpoints: a block's activations). */
typedef struct arena_mark {
  int chunk;
  size_t used, total;
  void *scratch;
  size_t scratch_nbytes;
} arena_mark;

static arena_mark arena_get_mark(const mpt_tape *tape) {
  arena_mark m = {.chunk = tape->nchunks - 1, .total = tape->arena_total,
                  .scratch = tape->scratch, .scratch_nbytes = tape->scratch_nbytes};
  m.used = m.chunk >= 0 ? tape->chunks[m.chunk].used : 0;
  return m;
}

/* Frees everything allocated after `m` (the chunks added since stay, empty, for the next
 * allocations; work queued on the stream that uses the memory runs before the work that will
 * reuse it, on the same stream). */
static void arena_rewind(mpt_tape *tape, const arena_mark *m) {
  for (int i = m->chunk + 1; i < tape->nchunks; i++) tape->chunks[i].used = 0;
  if (m->chunk >= 0) tape->chunks[m->chunk].used = m->used;
  tape->arena_total = m->total;
  tape->scratch = m->scratch;
  tape->scratch_nbytes = m->scratch_nbytes;
}

mpt_status mpt_tape_scratch(mpt_tape *tape, size_t nbytes, void **ptr) {
  if (!tape || !ptr) return MPT_FAIL(MPT_EINVAL, "tape_scratch: NULL tape or output");
  *ptr = NULL;
  if (!tape->scratch || tape->scratch_nbytes < nbytes) { /* grows; the old block is left */
    MPT_RETURN_IF(mpt_tape_alloc(tape, nbytes, &tape->scratch));
    tape->scratch_nbytes = nbytes;
  }
  *ptr = tape->scratch;
  return MPT_OK;
}

/* Replaces several chunks by one of their total use (see the file comment). */
static void arena_consolidate(mpt_tape *tape) {
  /* the most in use at once this pass (checkpoints rewind: the sum of what is used now may be
   * less), which one chunk holds exactly: in one chunk the bump pointer is that sum */
  size_t total = tape->arena_peak;
  tape->arena_total = 0;
  tape->arena_peak = 0;
  if (tape->nchunks <= 1) {
    if (tape->nchunks == 1) tape->chunks[0].used = 0;
    return;
  }
  /* Work still queued on the stream may use the chunks: let it finish first. If it cannot,
   * keep the chunks (wasteful, never unsafe). */
  if (tape->stream && mpt_stream_synchronize(tape->stream, TAPE_SYNC_TIMEOUT_MS) != MPT_OK) {
    for (int i = 0; i < tape->nchunks; i++) tape->chunks[i].used = 0;
    return;
  }
  arena_release(tape);
  /* On failure the arena is simply empty: the next pass grows it again and reports. */
  if (arena_add_chunk(tape, total > ARENA_MIN_CHUNK ? total : ARENA_MIN_CHUNK) != MPT_OK)
    mpt_error_clear();
}

size_t mpt__tape_arena_allocations(const mpt_tape *tape) { return tape ? tape->allocations : 0; }

/* ---- lifetime ---- */

mpt_status mpt_tape_init(mpt_tape **tape, mpt_model *model, mpt_stream *stream) {
  if (!tape || !model) return MPT_FAIL(MPT_EINVAL, "tape_init: NULL output or model");
  *tape = NULL;
  const mpt_device device = mpt_model_device(model);
  const mpt_device_type have = stream ? mpt_stream_device(stream).type : MPT_DEVICE_CPU;
  if (have != device.type)
    return MPT_FAIL(MPT_EINVAL, "tape_init: a %s stream for a model on %s",
                    stream ? (have == MPT_DEVICE_CPU ? "CPU" : "CUDA") : "NULL (CPU)",
                    device.type == MPT_DEVICE_CPU ? "the CPU" : "CUDA");
  mpt_tape *t = calloc(1, sizeof *t);
  if (!t) return MPT_FAIL(MPT_ENOMEM, "tape_init: out of host memory");
  t->model = model;
  t->stream = stream;
  t->device = device;
  t->vars.item_size = sizeof(var_slot);
  t->nodes.item_size = sizeof(mpt_node);
  t->grad_enabled = 1;
  t->model_hooks = 1;
  *tape = t;
  return MPT_OK;
}

void mpt_tape_free(mpt_tape *tape) {
  if (!tape) return;
  arena_release(tape);
  free(tape->chunks);
  pool_free(&tape->vars);
  pool_free(&tape->nodes);
  mpt__tape_profile_free(tape->prof);
  free(tape->param_vars);
  free(tape->uses);
  free(tape->remaining);
  free(tape->ckpt_params);
  free(tape->ckpt_stamp);
  free(tape);
}

mpt_stream *mpt_tape_stream(const mpt_tape *tape) { return tape ? tape->stream : NULL; }
mpt_model *mpt_tape_model(const mpt_tape *tape) { return tape ? tape->model : NULL; }

void mpt_tape_reset(mpt_tape *tape, uint64_t seed) {
  if (!tape) return;
  arena_consolidate(tape);
  tape->scratch = NULL;
  tape->scratch_nbytes = 0;
  tape->vars.used = 0;
  tape->nodes.used = 0;
  for (int i = 0; i < tape->nparams; i++) {
    tape->param_vars[i] = NULL;
    tape->uses[i] = 0;
    tape->remaining[i] = 0;
  }
  tape->backward_done = 0;
  tape->nckpt_params = 0;
  tape->ckpt_forward = 0;
  if (tape->prof) (void)mpt__tape_profile_mark(tape->prof, NULL); /* no stream wait: no error */
  tape->seed = seed;
  tape->seed_counter = 0;
}

void mpt_tape_set_grad_enabled(mpt_tape *tape, int enabled) {
  if (tape) tape->grad_enabled = enabled != 0;
}

int mpt_tape_grad_enabled(const mpt_tape *tape) { return tape ? tape->grad_enabled : 0; }

mpt_status mpt_tape_set_precision(mpt_tape *tape, mpt_precision precision) {
  if (!tape) return MPT_FAIL(MPT_EINVAL, "tape_set_precision: NULL tape");
  if (precision != MPT_PRECISION_FP32 && precision != MPT_PRECISION_BF16)
    return MPT_FAIL(MPT_EINVAL, "tape_set_precision: %d is neither fp32 nor bf16",
                    (int)precision);
  if (precision == MPT_PRECISION_BF16) MPT_RETURN_IF(mpt_op_bf16_check(tape->stream));
  tape->precision = precision;
  return MPT_OK;
}

mpt_precision mpt_tape_precision(const mpt_tape *tape) {
  return tape ? tape->precision : MPT_PRECISION_FP32;
}

void mpt_tape_set_model_hooks(mpt_tape *tape, int enabled) {
  if (tape) tape->model_hooks = enabled != 0;
}

int mpt_tape_model_hooks(const mpt_tape *tape) { return tape ? tape->model_hooks : 0; }

void mpt_tape_set_grad_hook(mpt_tape *tape, mpt_grad_ready_fn fn, void *user) {
  if (!tape) return;
  tape->hook = fn;
  tape->hook_user = fn ? user : NULL;
}

uint64_t mpt_tape_next_seed(mpt_tape *tape) {
  if (!tape) return 0;
  /* splitmix64 finaliser of (seed, counter): distinct, well-mixed seeds per dropout op. */
  uint64_t z = tape->seed + (++tape->seed_counter) * 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

/* ---- vars ---- */

static mpt_status new_slot(mpt_tape *tape, var_slot **slot) {
  mpt_status st = pool_take(tape, &tape->vars, (void **)slot);
  if (st != MPT_OK) return st;
  (*slot)->var.param_index = -1;
  return MPT_OK;
}

mpt_status mpt_tape_new_var(mpt_tape *tape, int ndim, const int64_t *shape, mpt_dtype dtype,
                             mpt_var **var) {
  if (!tape || !var || (ndim > 0 && !shape))
    return MPT_FAIL(MPT_EINVAL, "tape_new_var: NULL tape, output or shape");
  *var = NULL;
  char buf[128];
  if (ndim < 0 || ndim > MPT_MAX_DIMS || mpt_dtype_size(dtype) == 0)
    return MPT_FAIL(MPT_EINVAL, "tape_new_var: rank %d (0..%d) or dtype %d is bad", ndim,
                    MPT_MAX_DIMS, (int)dtype);
  int64_t count = 1;
  for (int d = 0; d < ndim; d++)
    if (shape[d] < 0 || __builtin_mul_overflow(count, shape[d], &count))
      return MPT_FAIL(MPT_EINVAL, "tape_new_var: bad shape %s",
                      mpt_shape_str(ndim, shape, buf, sizeof buf));
  void *data = NULL;
  var_slot *slot = NULL;
  size_t nbytes;
  if (__builtin_mul_overflow((size_t)count, mpt_dtype_size(dtype), &nbytes))
    return MPT_FAIL(MPT_ENOMEM, "tape_new_var: %s of %s needs more bytes than size_t holds",
                    mpt_shape_str(ndim, shape, buf, sizeof buf), mpt_dtype_name(dtype));
  MPT_RETURN_IF(mpt_tape_alloc(tape, nbytes, &data));
  MPT_RETURN_IF(new_slot(tape, &slot));
  slot->var.value = mpt_tensor_view(data, tape->device, dtype, ndim, shape);
  slot->var.grad = mpt_tensor_view(NULL, tape->device, MPT_F32, ndim, shape);
  slot->var.kind = VAR_NEW;
  *var = &slot->var;
  return MPT_OK;
}

/* The view shares its base's gradient storage (mpt_var_grad_acc): nothing to add here. */
static mpt_status view_backward(mpt_tape *tape, mpt_node *node) {
  (void)tape;
  (void)node;
  return MPT_OK;
}

mpt_status mpt_tape_view_var(mpt_tape *tape, mpt_var *of, int ndim, const int64_t *shape,
                              mpt_var **var) {
  if (!tape || !of || !var || (ndim > 0 && !shape))
    return MPT_FAIL(MPT_EINVAL, "tape_view_var: NULL tape, base, output or shape");
  *var = NULL;
  char a[128], b[128];
  int64_t count = 1;
  int ok = ndim >= 0 && ndim <= MPT_MAX_DIMS;
  for (int d = 0; ok && d < ndim; d++)
    ok = shape[d] >= 0 && !__builtin_mul_overflow(count, shape[d], &count);
  if (!ok || count != of->value.count)
    return MPT_FAIL(MPT_ESHAPE, "tape_view_var: cannot view %s as %s",
                    mpt_shape_str(of->value.ndim, of->value.shape, a, sizeof a),
                    ok ? mpt_shape_str(ndim, shape, b, sizeof b) : "(a bad shape)");
  var_slot *slot = NULL;
  MPT_RETURN_IF(new_slot(tape, &slot));
  slot->var.value = mpt_tensor_view(of->value.data, of->value.device, of->value.dtype, ndim,
                                    shape);
  slot->var.grad = mpt_tensor_view(NULL, of->value.device, MPT_F32, ndim, shape);
  slot->of = (var_slot *)of;
  slot->var.kind = VAR_VIEW;
  *var = &slot->var;
  /* A view of a value that needs a gradient is a node (whose backward has nothing to do: the
   * gradient storage is shared): the view then needs a gradient too, and a parameter viewed
   * counts one use that is released only after every consumer of the view has run. */
  if (mpt_tape_needs_grad(tape, &of, 1))
    return mpt_tape_record(tape, "view", view_backward, &of, 1, *var, NULL);
  return MPT_OK;
}

mpt_status mpt_tape_input(mpt_tape *tape, const mpt_tensor *value, mpt_var **var) {
  if (!tape || !value || !var) return MPT_FAIL(MPT_EINVAL, "tape_input: NULL argument");
  *var = NULL;
  if (value->device.type != tape->device.type)
    return MPT_FAIL(MPT_EINVAL, "tape_input: the tensor is on device type %d, the model on %d",
                    (int)value->device.type, (int)tape->device.type);
  if (value->count > 0 && !value->data)
    return MPT_FAIL(MPT_EINVAL, "tape_input: tensor with %lld elements and no data",
                    (long long)value->count);
  var_slot *slot = NULL;
  MPT_RETURN_IF(new_slot(tape, &slot));
  slot->var.value = *value;
  slot->var.value.owns_data = 0; /* borrowed */
  slot->var.kind = VAR_INPUT;
  slot->var.grad = mpt_tensor_view(NULL, value->device, MPT_F32, value->ndim, value->shape);
  *var = &slot->var;
  return MPT_OK;
}

/* Sizes the per-parameter arrays to the (finalised) model. */
static mpt_status ensure_param_arrays(mpt_tape *tape) {
  const int n = mpt_model_num_params(tape->model);
  if (n == tape->nparams) return MPT_OK;
  mpt_var **vars = calloc((size_t)n, sizeof *vars);
  int *uses = calloc((size_t)n, sizeof *uses), *rem = calloc((size_t)n, sizeof *rem);
  int *stamp = calloc((size_t)n, sizeof *stamp);
  if (!vars || !uses || !rem || !stamp) {
    free(vars);
    free(uses);
    free(rem);
    free(stamp);
    return MPT_FAIL(MPT_ENOMEM, "tape: no host memory for %d parameters", n);
  }
  free(tape->param_vars);
  free(tape->uses);
  free(tape->remaining);
  free(tape->ckpt_stamp);
  tape->param_vars = vars;
  tape->uses = uses;
  tape->remaining = rem;
  tape->ckpt_stamp = stamp;
  tape->nparams = n;
  tape->allocations++;
  return MPT_OK;
}

mpt_status mpt_tape_param(mpt_tape *tape, int index, mpt_var **var) {
  if (!tape || !var) return MPT_FAIL(MPT_EINVAL, "tape_param: NULL tape or output");
  *var = NULL;
  if (mpt_model_num_params(tape->model) > 0 && !mpt_model_params(tape->model))
    return MPT_FAIL(MPT_ESTATE, "tape_param: the model is not finalised");
  if (index < 0 || index >= mpt_model_num_params(tape->model))
    return MPT_FAIL(MPT_EINVAL, "tape_param: index %d outside [0, %d)", index,
                    mpt_model_num_params(tape->model));
  MPT_RETURN_IF(ensure_param_arrays(tape));
  const mpt_model_hooks *hooks = tape->model_hooks ? mpt_model_get_hooks(tape->model) : NULL;
  if (hooks && hooks->param_needed)
    MPT_RETURN_IF(hooks->param_needed(hooks->user, tape, index,
                                      tape->grad_enabled || tape->ckpt_forward ? 0 : 2));
  if (tape->ckpt_forward && tape->ckpt_stamp[index] != tape->ckpt_count) {
    if (tape->nckpt_params == tape->cap_ckpt_params) {
      int cap = tape->cap_ckpt_params ? 2 * tape->cap_ckpt_params : 64;
      int *p = realloc(tape->ckpt_params, (size_t)cap * sizeof *p);
      if (!p) return MPT_FAIL(MPT_ENOMEM, "tape: no host memory for a checkpoint's parameters");
      tape->ckpt_params = p;
      tape->cap_ckpt_params = cap;
      tape->allocations++;
    }
    tape->ckpt_params[tape->nckpt_params++] = index;
    tape->ckpt_stamp[index] = tape->ckpt_count;
  }
  if (tape->param_vars[index]) {
    *var = tape->param_vars[index];
    return MPT_OK;
  }
  var_slot *slot = NULL;
  MPT_RETURN_IF(new_slot(tape, &slot));
  slot->var.value = mpt_model_param(tape->model, index);
  slot->var.grad = mpt_model_grad(tape->model, index);
  slot->var.requires_grad = 1;
  slot->var.param_index = index;
  slot->var.kind = VAR_PARAM;
  tape->param_vars[index] = &slot->var;
  *var = &slot->var;
  return MPT_OK;
}

int mpt_tape_param_uses(const mpt_tape *tape, int index) {
  if (!tape || index < 0 || index >= tape->nparams) return 0;
  return tape->uses[index];
}

const mpt_tensor *mpt_var_value(const mpt_var *var) { return var ? &var->value : NULL; }
const mpt_tensor *mpt_var_grad(const mpt_var *var) { return var ? &var->grad : NULL; }

/* The gradient storage of var, allocated on first use; *fresh = 1 when this call allocated it
 * (zero-filled only when `zero`), else 0. */
static mpt_status grad_get(mpt_tape *tape, mpt_var *var, int zero, float **grad, int *fresh) {
  *fresh = 0;
  if (var->grad.data && var->grad_unwritten) { /* made ahead: as if allocated now */
    var->grad_unwritten = 0;
    if (zero) MPT_RETURN_IF(mpt_op_fill(tape->stream, var->grad.data, var->value.count, 0.0f));
    *fresh = 1;
  } else if (!var->grad.data) {
    var_slot *slot = (var_slot *)var;
    if (slot->of) { /* a view: share the base's gradient */
      float *base = NULL;
      MPT_RETURN_IF(grad_get(tape, &slot->of->var, zero, &base, fresh));
      if (!base)
        return MPT_FAIL(MPT_ESTATE, "var_grad: a view that needs a gradient of a base that "
                        "does not");
      var->grad.data = base;
    } else {
      if (var->value.dtype != MPT_F32)
        return MPT_FAIL(MPT_EINVAL, "var_grad: a %s value cannot have a gradient",
                        mpt_dtype_name(var->value.dtype));
      void *data = NULL;
      MPT_RETURN_IF(mpt_tape_alloc(tape, (size_t)var->value.count * sizeof(float), &data));
      if (zero) MPT_RETURN_IF(mpt_op_fill(tape->stream, data, var->value.count, 0.0f));
      var->grad.data = data;
      *fresh = 1;
    }
  }
  *grad = var->grad.data;
  return MPT_OK;
}

mpt_status mpt_var_grad_acc(mpt_tape *tape, mpt_var *var, float **grad) {
  if (!tape || !var || !grad) return MPT_FAIL(MPT_EINVAL, "var_grad: NULL argument");
  *grad = NULL;
  if (!var->requires_grad) return MPT_OK;
  int fresh;
  return grad_get(tape, var, 1, grad, &fresh);
}

mpt_status mpt_var_grad_beta(mpt_tape *tape, mpt_var *var, float **grad, float *beta) {
  if (!tape || !var || !grad || !beta) return MPT_FAIL(MPT_EINVAL, "var_grad_beta: NULL argument");
  *grad = NULL;
  *beta = 1.0f;
  if (!var->requires_grad) return MPT_OK;
  int fresh = 0;
  MPT_RETURN_IF(grad_get(tape, var, 0, grad, &fresh));
  *beta = fresh ? 0.0f : 1.0f;
  return MPT_OK;
}

mpt_status mpt_var_grad_take(mpt_tape *tape, mpt_var *var, mpt_var *from, int *taken) {
  if (!tape || !var || !from || !taken) return MPT_FAIL(MPT_EINVAL, "var_grad_take: NULL argument");
  *taken = 0;
  /* Only between two of this pass's new vars (a view's storage is its base's, a parameter's
   * is the model's), from's storage already made, var's not yet. */
  if (var == from || !var->requires_grad || var->kind != VAR_NEW || var->grad.data ||
      from->kind != VAR_NEW || !from->grad.data || var->value.count != from->value.count ||
      var->value.dtype != MPT_F32)
    return MPT_OK;
  var->grad.data = from->grad.data;
  *taken = 1;
  return MPT_OK;
}

mpt_status mpt_var_item(mpt_tape *tape, const mpt_var *var, float *value) {
  if (!tape || !var || !value) return MPT_FAIL(MPT_EINVAL, "var_item: NULL argument");
  if (var->value.count != 1 || var->value.dtype != MPT_F32) {
    char buf[128];
    return MPT_FAIL(MPT_EINVAL, "var_item: want one float32, the var is %s %s",
                    mpt_dtype_name(var->value.dtype),
                    mpt_shape_str(var->value.ndim, var->value.shape, buf, sizeof buf));
  }
  MPT_RETURN_IF(mpt_op_memcpy(tape->stream, mpt_device_cpu(), value, var->value.device,
                              var->value.data, sizeof(float)));
  if (tape->stream) MPT_RETURN_IF(mpt_stream_synchronize(tape->stream, TAPE_SYNC_TIMEOUT_MS));
  return MPT_OK;
}

/* ---- recording and backward ---- */

int mpt_tape_needs_grad(const mpt_tape *tape, mpt_var *const *inputs, int ninputs) {
  if (!tape || !tape->grad_enabled || !inputs) return 0;
  for (int i = 0; i < ninputs; i++)
    if (inputs[i] && inputs[i]->requires_grad) return 1;
  return 0;
}

mpt_status mpt_tape_record(mpt_tape *tape, const char *name, mpt_backward_fn backward,
                            mpt_var *const *inputs, int ninputs, mpt_var *output,
                            mpt_node **node) {
  if (node) *node = NULL;
  if (!tape || !backward || !output)
    return MPT_FAIL(MPT_EINVAL, "tape_record '%s': NULL %s", name ? name : "?",
                    !tape ? "tape" : !backward ? "backward function" : "output");
  if (ninputs < 0 || ninputs > MPT_NODE_MAX_INPUTS || (ninputs > 0 && !inputs))
    return MPT_FAIL(MPT_EINVAL, "tape_record '%s': %d inputs (0..%d, and a NULL array only for "
                    "0)", name ? name : "?", ninputs, MPT_NODE_MAX_INPUTS);
  if (!tape->grad_enabled)
    return MPT_FAIL(MPT_ESTATE, "tape_record '%s': gradients are disabled on this tape",
                    name ? name : "?");
  const char *op = name ? name : "?";
  if (!var_is_live(tape, output) || (output->kind != VAR_NEW && output->kind != VAR_VIEW) ||
      output->requires_grad)
    return MPT_FAIL(MPT_EINVAL, "tape_record '%s': the output must be a var the op made in this "
                    "pass with mpt_tape_new_var (or a view), not yet recorded: not an input, a "
                    "parameter, a var from before mpt_tape_reset or another node's output", op);
  for (int i = 0; i < ninputs; i++) {
    const mpt_var *in = inputs[i];
    if (in && !var_is_live(tape, in))
      return MPT_FAIL(MPT_EINVAL, "tape_record '%s': input %d is not a var of this tape's "
                      "current pass (kept from before mpt_tape_reset, or of another tape)", op, i);
    if (in == output)
      return MPT_FAIL(MPT_EINVAL, "tape_record '%s': input %d is the output itself", op, i);
    if (in && in->param_index >= 0 &&
        (in->param_index >= tape->nparams || tape->param_vars[in->param_index] != in))
      return MPT_FAIL(MPT_EINVAL, "tape_record '%s': input %d is parameter %d's var from "
                      "another tape or pass", name ? name : "?", i, in->param_index);
  }
  mpt_node *n = NULL;
  MPT_RETURN_IF(pool_take(tape, &tape->nodes, (void **)&n));
  n->backward = backward;
  n->name = name ? name : "?";
  n->ninputs = ninputs;
  for (int i = 0; i < ninputs; i++) {
    n->inputs[i] = inputs[i];
    if (inputs[i] && inputs[i]->param_index >= 0) tape->uses[inputs[i]->param_index]++;
  }
  n->output = output;
  output->requires_grad = 1;
  if (node) *node = n;
  if (tape->prof) MPT_RETURN_IF(mpt__tape_profile_forward(tape->prof, tape->stream, n->name));
  return MPT_OK;
}

static mpt_status run_backward(mpt_tape *tape, mpt_var *loss, float scale,
                               const mpt_model_hooks *hooks);

mpt_status mpt_tape_backward(mpt_tape *tape, mpt_var *loss, float scale) {
  if (!tape || !loss) return MPT_FAIL(MPT_EINVAL, "tape_backward: NULL tape or loss");
  if (tape->backward_done)
    return MPT_FAIL(MPT_ESTATE, "tape_backward: already ran for this pass (reset the tape "
                    "and run the forward again)");
  if (!var_is_live(tape, loss))
    return MPT_FAIL(MPT_ESTATE, "tape_backward: the loss is not a var of this tape's pass");
  if (loss->value.count != 1 || loss->value.dtype != MPT_F32) {
    char buf[128];
    return MPT_FAIL(MPT_ESTATE, "tape_backward: the loss must be one float32, it is %s %s",
                    mpt_dtype_name(loss->value.dtype),
                    mpt_shape_str(loss->value.ndim, loss->value.shape, buf, sizeof buf));
  }
  int64_t loss_node = -1;
  for (int64_t i = tape->nodes.used - 1; i >= 0 && loss_node < 0; i--)
    if (node_at(tape, i)->output == loss) loss_node = i;
  if (!loss->requires_grad || loss_node < 0)
    return MPT_FAIL(MPT_ESTATE, "tape_backward: the loss was not recorded on this tape (no "
                    "input needed a gradient, or gradients were disabled)");
  if (mpt_model_grads_state(tape->model) == MPT_GRADS_APPLIED)
    return MPT_FAIL(MPT_ESTATE, "tape_backward: the model's gradients were already applied by an "
                    "optimizer step (call mpt_model_zero_grad before the next forward)");
  tape->backward_done = 1;
  const mpt_model_hooks *hooks = tape->model_hooks ? mpt_model_get_hooks(tape->model) : NULL;
  if (hooks && hooks->before_backward) MPT_RETURN_IF(hooks->before_backward(hooks->user, tape));
  mpt_status st = run_backward(tape, loss, scale, hooks);
  if (hooks && hooks->after_backward) st = hooks->after_backward(hooks->user, tape, st);
  mpt__model_backward_done(tape->model, st);
  return st;
}

/* Runs the backward functions of nodes [lo, hi) in reverse, releasing their parameter uses
 * (a parameter whose last use is released fires the hooks). *t_ms: profiling's mark. */
static mpt_status walk_nodes(mpt_tape *tape, int64_t lo, int64_t hi,
                             const mpt_model_hooks *hooks, double *t_ms) {
  /* Every node, the ones after the loss too: they got no gradient, but their parameter uses
   * must be released for the hook to fire. */
  for (int64_t i = hi - 1; i >= lo; i--) {
    mpt_node *node = node_at(tape, i);
    if (node->output->grad.data) {
      mpt_status st = MPT_OK;
      for (int k = 0; st == MPT_OK && hooks && hooks->param_needed && k < node->ninputs; k++)
        if (node->inputs[k] && node->inputs[k]->param_index >= 0)
          st = hooks->param_needed(hooks->user, tape, node->inputs[k]->param_index, 1);
      if (st == MPT_OK) st = node->backward(tape, node);
      if (st != MPT_OK) {
        char inner[512];
        strncpy(inner, mpt_last_error(), sizeof inner - 1);
        inner[sizeof inner - 1] = '\0';
        return MPT_FAIL(st, "tape_backward: node %lld ('%s'): %s", (long long)i, node->name,
                        inner);
      }
      if (tape->prof)
        MPT_RETURN_IF(mpt__tape_profile_backward(tape->prof, tape->stream, node->name, *t_ms,
                                                 t_ms));
    }
    int fired = 0;
    for (int k = 0; k < node->ninputs; k++) {
      const mpt_var *in = node->inputs[k];
      if (!in || in->param_index < 0) continue;
      if (--tape->remaining[in->param_index] != 0) continue;
      fired = 1;
      if (tape->hook) tape->hook(tape->hook_user, in->param_index);
      if (hooks && hooks->grad_ready) hooks->grad_ready(hooks->user, in->param_index);
    }
    if (tape->prof && fired && (tape->hook || (hooks && hooks->grad_ready)))
      MPT_RETURN_IF(mpt__tape_profile_backward(tape->prof, tape->stream, "grad-ready hooks",
                                               *t_ms, t_ms));
    else if (tape->prof)
      *t_ms = mpt_time_ms(); /* a skipped node's bookkeeping is nobody's time */
  }
  return MPT_OK;
}

/* The walk itself (mpt_tape_backward has checked its arguments and run before_backward). */
static mpt_status run_backward(mpt_tape *tape, mpt_var *loss, float scale,
                               const mpt_model_hooks *hooks) {
  float *dloss = NULL;
  MPT_RETURN_IF(mpt_var_grad_acc(tape, loss, &dloss));
  MPT_RETURN_IF(mpt_op_fill(tape->stream, dloss, 1, scale));
  for (int i = 0; i < tape->nparams; i++) tape->remaining[i] = tape->uses[i];
  double t_ms = 0; /* profiling: the end of the last timed interval */
  if (tape->prof) {
    MPT_RETURN_IF(mpt__tape_profile_mark(tape->prof, tape->stream)); /* forward's work done */
    t_ms = mpt_time_ms();
  }
  return walk_nodes(tape, 0, tape->nodes.used, hooks, &t_ms);
}

/* ---- activation checkpoints (recompute) ---- */

void mpt_tape_set_recompute(mpt_tape *tape, int enabled) {
  if (tape) tape->recompute = enabled != 0;
}

int mpt_tape_recompute(const mpt_tape *tape) { return tape ? tape->recompute : 0; }

typedef struct ckpt_ctx {
  mpt_checkpoint_fn fn;
  void *user;
  mpt_var *x;
  uint64_t seed_counter; /* at the forward: dropout draws the same masks again */
  int params_start, params_count; /* its run in tape->ckpt_params */
} ckpt_ctx;
_Static_assert(sizeof(ckpt_ctx) <= MPT_NODE_CTX_BYTES, "checkpoint context too large");

/* Releases one use of parameter p (the hooks fire at its last). */
static void release_use(mpt_tape *tape, int p, const mpt_model_hooks *hooks) {
  if (--tape->remaining[p] != 0) return;
  if (tape->hook) tape->hook(tape->hook_user, p);
  if (hooks && hooks->grad_ready) hooks->grad_ready(hooks->user, p);
}

/* Recomputes the block with gradients on, runs its nodes' backward right away, then frees its
 * nodes and arena memory. */
static mpt_status ckpt_backward(mpt_tape *tape, mpt_node *node) {
  ckpt_ctx *c = mpt_node_ctx(node);
  mpt_var *x = c->x, *r = NULL;
  const mpt_model_hooks *hooks = tape->model_hooks ? mpt_model_get_hooks(tape->model) : NULL;
  if (x->requires_grad && !x->grad.data) {
    /* x's gradient lives on after the block's memory is freed: made before the mark, and
     * written by the block's first contribution as if made then */
    float *g = NULL;
    if (((var_slot *)x)->of) {
      MPT_RETURN_IF(mpt_var_grad_acc(tape, x, &g));
    } else {
      void *data = NULL;
      MPT_RETURN_IF(mpt_tape_alloc(tape, (size_t)x->value.count * sizeof(float), &data));
      x->grad.data = data;
      x->grad_unwritten = 1;
    }
  }
  const arena_mark mark = arena_get_mark(tape);
  const int64_t n0 = tape->nodes.used;
  const uint64_t seed_counter = tape->seed_counter;
  const int grad_enabled = tape->grad_enabled;
  tape->seed_counter = c->seed_counter;
  tape->grad_enabled = 1;
  mpt_status st = c->fn(tape, c->user, x, &r);
  tape->seed_counter = seed_counter;
  tape->grad_enabled = grad_enabled;
  if (st == MPT_OK && r && r->requires_grad) {
    int taken = 0;
    st = mpt_var_grad_take(tape, r, node->output, &taken);
    if (st == MPT_OK && !taken) {
      float *g = NULL, beta = 1.0f;
      st = mpt_var_grad_beta(tape, r, &g, &beta);
      if (st == MPT_OK && beta == 0.0f)
        st = mpt_op_memcpy(tape->stream, tape->device, g, tape->device, node->output->grad.data,
                           (size_t)r->value.count * sizeof(float));
      else if (st == MPT_OK)
        st = MPT_FAIL(MPT_ESTATE, "checkpoint: the recomputed output already has a gradient");
    }
    for (int64_t i = n0; st == MPT_OK && i < tape->nodes.used; i++) {
      const mpt_node *n = node_at(tape, i);
      for (int k = 0; k < n->ninputs; k++)
        if (n->inputs[k] && n->inputs[k]->param_index >= 0)
          tape->remaining[n->inputs[k]->param_index]++;
    }
    double t_ms = tape->prof ? mpt_time_ms() : 0;
    if (st == MPT_OK) st = walk_nodes(tape, n0, tape->nodes.used, hooks, &t_ms);
  } else if (st == MPT_OK && !r) {
    st = MPT_FAIL(MPT_EINVAL, "checkpoint: the function returned no output");
  }
  if (st == MPT_OK && x->grad_unwritten) { /* the block did not reach x */
    x->grad_unwritten = 0;
    st = mpt_op_fill(tape->stream, x->grad.data, x->value.count, 0.0f);
  }
  /* the forward's placeholder use of each parameter the block used: released last, so a
   * parameter's gradient is final when the whole block's backward is */
  for (int i = 0; i < c->params_count; i++)
    release_use(tape, tape->ckpt_params[c->params_start + i], hooks);
  tape->nodes.used = n0;
  arena_rewind(tape, &mark);
  return st;
}

mpt_status mpt_tape_checkpoint(mpt_tape *tape, mpt_checkpoint_fn fn, void *user, mpt_var *x,
                               mpt_var **y) {
  if (!tape || !fn || !x || !y) return MPT_FAIL(MPT_EINVAL, "tape_checkpoint: NULL argument");
  *y = NULL;
  if (!tape->grad_enabled || tape->ckpt_forward) return fn(tape, user, x, y);
  if (!var_is_live(tape, x))
    return MPT_FAIL(MPT_EINVAL, "tape_checkpoint: x is not a var of this tape's current pass");
  mpt_var *out = NULL, *r = NULL;
  MPT_RETURN_IF(mpt_tape_new_var(tape, x->value.ndim, x->value.shape, x->value.dtype, &out));
  const arena_mark mark = arena_get_mark(tape);
  const int start = tape->nckpt_params;
  const uint64_t seed_counter = tape->seed_counter;
  MPT_RETURN_IF(ensure_param_arrays(tape));
  tape->ckpt_count++;
  tape->ckpt_forward = 1;
  tape->grad_enabled = 0;
  mpt_status st = fn(tape, user, x, &r);
  tape->grad_enabled = 1;
  tape->ckpt_forward = 0;
  if (st == MPT_OK && !r) st = MPT_FAIL(MPT_EINVAL, "tape_checkpoint: the function returned no "
                                        "output");
  if (st == MPT_OK) {
    int same = r->value.ndim == x->value.ndim && r->value.dtype == x->value.dtype;
    for (int d = 0; same && d < x->value.ndim; d++) same = r->value.shape[d] == x->value.shape[d];
    if (!same) {
      char a[128], b[128];
      st = MPT_FAIL(MPT_ESHAPE, "tape_checkpoint: the function maps %s to %s: a checkpointed "
                    "block keeps its input's shape and dtype",
                    mpt_shape_str(x->value.ndim, x->value.shape, a, sizeof a),
                    mpt_shape_str(r->value.ndim, r->value.shape, b, sizeof b));
    }
  }
  if (st == MPT_OK)
    st = mpt_op_memcpy(tape->stream, tape->device, out->value.data, tape->device, r->value.data,
                       (size_t)x->value.count * mpt_dtype_size(x->value.dtype));
  arena_rewind(tape, &mark);
  if (st != MPT_OK) return st;
  const int count = tape->nckpt_params - start;
  if (count == 0 && !x->requires_grad) { /* nothing to differentiate */
    *y = out;
    return MPT_OK;
  }
  mpt_node *node = NULL;
  MPT_RETURN_IF(mpt_tape_record(tape, "checkpoint", ckpt_backward, &x, 1, out, &node));
  ckpt_ctx *c = mpt_node_ctx(node);
  *c = (ckpt_ctx){.fn = fn, .user = user, .x = x, .seed_counter = seed_counter,
                  .params_start = start, .params_count = count};
  for (int i = 0; i < count; i++) tape->uses[tape->ckpt_params[start + i]]++;
  *y = out;
  return MPT_OK;
}

/* ---- op profiling (tape_profile.c) ---- */

mpt_status mpt_tape_set_profiling(mpt_tape *tape, int on) {
  if (!tape) return MPT_FAIL(MPT_EINVAL, "tape_set_profiling: NULL tape");
  if (!on) {
    mpt__tape_profile_free(tape->prof);
    tape->prof = NULL;
    return MPT_OK;
  }
  if (!tape->prof) MPT_RETURN_IF(mpt__tape_profile_init(&tape->prof));
  return MPT_OK;
}

void mpt_tape_clear_op_times(mpt_tape *tape) {
  if (tape && tape->prof) mpt__tape_profile_clear(tape->prof);
}

int mpt_tape_op_times(const mpt_tape *tape, mpt_op_time *rows, int max_rows) {
  return tape && tape->prof ? mpt__tape_profile_rows(tape->prof, rows, max_rows) : 0;
}

mpt_status mpt__tape_profile_start_forward(mpt_tape *tape) {
  return tape->prof ? mpt__tape_profile_mark(tape->prof, tape->stream) : MPT_OK;
}

/* ---- the public op API's accessors (include/mpitrain/autograd.h) ---- */

int mpt_var_requires_grad(const mpt_var *var) { return var ? var->requires_grad : 0; }
int mpt_var_param_index(const mpt_var *var) { return var ? var->param_index : -1; }
int mpt_node_num_inputs(const mpt_node *node) { return node ? node->ninputs : 0; }
mpt_var *mpt_node_input(const mpt_node *node, int index) {
  return node && index >= 0 && index < node->ninputs ? node->inputs[index] : NULL;
}
mpt_var *mpt_node_output(const mpt_node *node) { return node ? node->output : NULL; }
const float *mpt_node_grad_output(const mpt_node *node) {
  return node ? node->output->grad.data : NULL;
}
const char *mpt_node_name(const mpt_node *node) { return node ? node->name : NULL; }
void *mpt_node_ctx(mpt_node *node) { return node ? node->ctx : NULL; }
