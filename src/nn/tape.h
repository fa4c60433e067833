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

/* Op profiling (tape_profile.c; the public side is nn.h mpt_tape_set_profiling). */
typedef struct mpt__tape_profile mpt__tape_profile;
mpt_status mpt__tape_profile_init(mpt__tape_profile **p);
void mpt__tape_profile_free(mpt__tape_profile *p);
void mpt__tape_profile_clear(mpt__tape_profile *p);
/* Sets the mark to now, after the stream's queued work. */
mpt_status mpt__tape_profile_mark(mpt__tape_profile *p, mpt_stream *s);
/* Adds now - mark to row `name`'s forward and moves the mark to now. */
mpt_status mpt__tape_profile_forward(mpt__tape_profile *p, mpt_stream *s, const char *name);
/* Adds now - start_ms to row `name`'s backward; *end_ms = now. */
mpt_status mpt__tape_profile_backward(mpt__tape_profile *p, mpt_stream *s, const char *name,
                                      double start_ms, double *end_ms);
int mpt__tape_profile_rows(const mpt__tape_profile *p, mpt_op_time *rows, int max_rows);
/* Called by mpt_model_forward at its start: the first op's forward is timed from here. */
mpt_status mpt__tape_profile_start_forward(mpt_tape *tape);

/* Deferred initialisation (nn.h mpt_model_init_unit). fn writes the initial values of
 * parameters [first, end) (one unit), after their registered kinds (zeros, ones) were written,
 * from the model's forward context `ctx`. defer: marks every unit pending (host models whose
 * parameters are all zeros, ones or fn's; MPT_EINVAL not finalised, MPT_ENOMEM). clear: none
 * pending (the values were written otherwise: mpt_model_init_params, a load). */
typedef mpt_status (*mpt__model_range_init)(void *ctx, mpt_model *model, int first, int end);
mpt_status mpt__model_defer_init(mpt_model *model, mpt__model_range_init fn);
void mpt__model_init_clear(mpt_model *model);

#endif
