/* The reverse-mode autodiff tape (include/mpitrain/nn.h, internals in src/nn/tape_impl.h): the
 * arena, the var and node pools, the tape's lifetime and settings, vars, parameter vars and use
 * counts. Var gradients, recording and backward are in tape_backward.c.
 *
 * Arena. Device memory on the model's device, as a list of chunks with a bump pointer that
 * moves from chunk to chunk (a request that does not fit the rest of one goes to the next, a
 * new chunk of twice the last one's size when none is left); every allocation is rounded up to
 * 64 bytes and starts 64-byte aligned. At reset the pointer goes back to the first chunk.
 * On a GPU, if the pass used more than one chunk, all chunks are then replaced by ONE chunk of
 * the most bytes used at once, which the same pass fits exactly (the rounded sizes add up the
 * same way in one chunk): device memory is taken in full when allocated, and the skipped tails
 * would be lost. On the CPU the chunks are kept: the same pass fits them again the same way, and
 * their pages are already mapped, where a merged chunk would be fresh memory that the next pass
 * faults in page by page (gpt-mini, B 8: 160,000 page faults, 625 MiB, made the second step 20 %
 * slower than the third); the tails a pass skips are never touched, so never resident. Either
 * way, after the first step or two the steady state allocates nothing.
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

#include "mpitrain/ops.h"
#include "mpitrain/ops_bf16.h"
#include "nn/tape_impl.h"

#define ARENA_ALIGN ((size_t)64)
#define ARENA_MIN_CHUNK ((size_t)64 * 1024)

/* ---- pools ---- */

mpt_status mpt__tape_pool_take(mpt_tape *tape, pool *p, void **item) {
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

mpt_node *mpt__tape_node_at(const mpt_tape *tape, int64_t i) {
  return (mpt_node *)((char *)tape->nodes.blocks[i / POOL_BLOCK] +
                       (size_t)(i % POOL_BLOCK) * sizeof(mpt_node));
}

/* 1 if `var` is a live var of this pass on this tape. */
int mpt__tape_var_is_live(const mpt_tape *tape, const mpt_var *var) {
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
  tape->cur_chunk = 0;
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
  arena_chunk *c = tape->nchunks ? &tape->chunks[tape->cur_chunk] : NULL;
  while (c && c->nbytes - c->used < need && tape->cur_chunk + 1 < tape->nchunks)
    c = &tape->chunks[++tape->cur_chunk]; /* a kept chunk, empty */
  if (!c || c->nbytes - c->used < need) {
    size_t size = c ? 2 * tape->chunks[tape->nchunks - 1].nbytes : ARENA_MIN_CHUNK;
    if (size < need) size = need;
    mpt_status st = arena_add_chunk(tape, size);
    if (st != MPT_OK) return st;
    tape->cur_chunk = tape->nchunks - 1;
    c = &tape->chunks[tape->cur_chunk];
  }
  *ptr = c->base + c->used;
  c->used += need;
  tape->arena_total += need;
  if (tape->arena_total > tape->arena_peak) tape->arena_peak = tape->arena_total;
  return MPT_OK;
}

arena_mark mpt__tape_arena_mark(const mpt_tape *tape) {
  arena_mark m = {.chunk = tape->nchunks ? tape->cur_chunk : -1, .total = tape->arena_total,
                  .scratch = tape->scratch, .scratch_nbytes = tape->scratch_nbytes};
  m.used = m.chunk >= 0 ? tape->chunks[m.chunk].used : 0;
  return m;
}

/* Frees everything allocated after `m` (the chunks added since stay, empty, for the next
 * allocations; work queued on the stream that uses the memory runs before the work that will
 * reuse it, on the same stream). */
void mpt__tape_arena_rewind(mpt_tape *tape, const arena_mark *m) {
  for (int i = m->chunk + 1; i < tape->nchunks; i++) tape->chunks[i].used = 0;
  if (m->chunk >= 0) tape->chunks[m->chunk].used = m->used;
  tape->cur_chunk = m->chunk >= 0 ? m->chunk : 0;
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

/* Empties the chunks for the next pass; on a GPU replaces several by one of their total use
 * (see the file comment). */
static void arena_restart(mpt_tape *tape) {
  /* the most in use at once this pass (checkpoints rewind: the sum of what is used now may be
   * less), which one chunk holds exactly: in one chunk the bump pointer is that sum */
  size_t total = tape->arena_peak;
  tape->arena_total = 0;
  tape->arena_peak = 0;
  tape->cur_chunk = 0;
  if (tape->nchunks <= 1 || tape->device.type == MPT_DEVICE_CPU) {
    for (int i = 0; i < tape->nchunks; i++) tape->chunks[i].used = 0;
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
  arena_restart(tape);
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
  mpt_status st = mpt__tape_pool_take(tape, &tape->vars, (void **)slot);
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
mpt_status mpt__tape_param_arrays(mpt_tape *tape) {
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
  MPT_RETURN_IF(mpt__tape_param_arrays(tape));
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
