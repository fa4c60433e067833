/* Internals shared by the language models of src/nn (gpt.c, llama.c): the check of a forward's
 * token input and the normal draws of their weight initialisation. */
#ifndef MPT_NN_LM_COMMON_H
#define MPT_NN_LM_COMMON_H

#include "mpitrain/core.h"

/* MPT_OK when tok is int32 tokens [B, T] with 1 <= T <= max_seq_len; else MPT_ESHAPE, the
 * message opening with `model` ("gpt: input ..."). */
mpt_status mpt__lm_check_tokens(const char *model, const mpt_tensor *tok, int max_seq_len);

/* A standard normal from two 53-bit uniforms in (0, 1) (Box-Muller); the second value of each
 * pair is kept in *spare (with *has_spare set) for the next call. The stream both models'
 * initialisations draw, value for value. */
double mpt__lm_normal_draw(mpt_rng *rng, double *spare, int *has_spare);

#endif
