/* Internals shared by the transformer ops (src/nn/gpt_ops.c, src/nn/attention.c). */
#ifndef MPT_NN_GPT_OPS_H
#define MPT_NN_GPT_OPS_H

#include "mpitrain/autograd.h"

/* MPT_EINVAL unless `v` is a float32 var with data. `op` and `what` name it in the message. */
mpt_status mpt__gpt_check_var(const char *op, const char *what, const mpt_var *v);

#endif
