/* nn internals shared by the tape (tape.c), the model (model.c) and the ops (the other files
 * of src/nn).
 *
 * A var is a value in the pass: `value` is its tensor, `grad` its gradient (data NULL until
 * backward first needs it, then zeroed arena memory; for a parameter both are views into the
 * model's flat buffers). A node records one op: its inputs, its output, a backward function
 * and a small inline context for what backward needs (saved pointers into the arena, sizes).
 *
 * Recording rules for an op implementation:
 *   1. validate shapes (MPT_FAIL(MPT_ESHAPE, ...) naming the op and both shapes);
 *   2. mpt__tape_new_var for the output, compute the forward on mpt_tape_stream(tape);
 *   3. if mpt__tape_needs_grad(tape, inputs, n): mpt__tape_record(...) and save in node->ctx
 *      whatever backward needs (allocate saved tensors with mpt__tape_alloc).
 * Backward functions ACCUMULATE into the inputs' gradients, obtained with mpt__var_grad (which
 * returns NULL for an input that needs no gradient: skip that input's computation). */
#ifndef MPT_NN_TAPE_H
#define MPT_NN_TAPE_H

#include "mpitrain/nn.h"
#include "mpitrain/ops.h"

struct mpt_var {
  mpt_tensor value;
  mpt_tensor grad;
  int requires_grad;
  int param_index; /* -1 unless this is a parameter's var */
};

typedef struct mpt__node mpt__node;
typedef mpt_status (*mpt__backward_fn)(mpt_tape *tape, mpt__node *node);

#define MPT__NODE_MAX_INPUTS 5

struct mpt__node {
  mpt__backward_fn backward;
  const char *name; /* op name for error messages ("linear") */
  mpt_var *inputs[MPT__NODE_MAX_INPUTS];
  int ninputs;
  mpt_var *output;
  union {
    int64_t i[16];
    float f[32];
    void *p[16];
  } ctx;
  void *saved[4]; /* arena pointers the op saved for backward */
};

/* A new var whose value is `ndim`/`shape` of `dtype` in the arena (contents undefined); it
 * needs no gradient until recorded as a node's output. Errors: MPT_ENOMEM, MPT_EINVAL. */
mpt_status mpt__tape_new_var(mpt_tape *tape, int ndim, const int64_t *shape, mpt_dtype dtype,
                             mpt_var **var);
/* A new var that views `data` (same device) with a new shape: flatten and reshape. */
mpt_status mpt__tape_view_var(mpt_tape *tape, mpt_var *of, int ndim, const int64_t *shape,
                              mpt_var **var);
/* Scratch memory on the model's device from the arena, valid until the next reset (64-byte
 * aligned). Errors: MPT_ENOMEM. */
mpt_status mpt__tape_alloc(mpt_tape *tape, size_t nbytes, void **ptr);
/* 1 when gradients are enabled and any of the inputs needs a gradient. */
int mpt__tape_needs_grad(const mpt_tape *tape, mpt_var *const *inputs, int ninputs);
/* Records a node: marks output->requires_grad, counts one use of every parameter input.
 * *node (may be NULL) receives the node for its ctx/saved fields. */
mpt_status mpt__tape_record(mpt_tape *tape, const char *name, mpt__backward_fn backward,
                            mpt_var *const *inputs, int ninputs, mpt_var *output,
                            mpt__node **node);
/* Gradient storage of `var` for accumulation: NULL when the var needs no gradient; otherwise
 * allocated (zeroed) on first use. Errors: MPT_ENOMEM. */
mpt_status mpt__var_grad(mpt_tape *tape, mpt_var *var, float **grad);
/* A per-op dropout seed: the pass seed mixed with a counter of dropout ops in this pass. */
uint64_t mpt__tape_next_seed(mpt_tape *tape);
/* For tests: how many allocations the tape has made since mpt_tape_init (device arena chunks
 * and host pool blocks). Constant across steps of the same shapes once the arena has settled. */
size_t mpt__tape_arena_allocations(const mpt_tape *tape);

#endif
