/* nn internals for tests. Ops are written through the public op API
 * (include/mpitrain/autograd.h), the built-in ones included. */
#ifndef MPT_NN_TAPE_H
#define MPT_NN_TAPE_H

#include "mpitrain/nn.h"

/* For tests: how many allocations the tape has made since mpt_tape_init (device arena chunks
 * and host pool blocks). Constant across steps of the same shapes once the arena has settled. */
size_t mpt__tape_arena_allocations(const mpt_tape *tape);

/* Called by mpt_tape_backward with its final status: MPT_OK moves the model's gradient state
 * to MPT_GRADS_READY (model.c). */
void mpt__model_backward_done(mpt_model *model, mpt_status status);

#endif
