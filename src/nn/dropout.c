/* Inverted dropout on the tape (mpt_nn_dropout; Srivastava et al., 2014, scaled at training
 * time as PyTorch does): when the tape's model is training and p > 0,
 *   mask[i] = (u_i >= p) / (1 - p),  y = x * mask,  dx += dy * mask,
 * with u drawn by mpt_op_dropout from a per-op seed (mpt__tape_next_seed: the pass seed given
 * to mpt_tape_reset mixed with the op's position in the pass), so the same reset seed gives
 * the same masks. Otherwise the op is the identity and returns x itself (nothing recorded).
 * The mask lives in the tape arena (node->saved[0]). Runs on the tape's stream. */

#include "core/error.h"
#include "nn/tape.h"

static mpt_status dropout_backward(mpt_tape *tape, mpt__node *node) {
  const float *dy = node->output->grad.data;
  float *dx = NULL;
  if (!dy) return MPT_OK;
  MPT_RETURN_IF(mpt__var_grad(tape, node->inputs[0], &dx));
  if (!dx) return MPT_OK;
  return mpt_op_mul_backward(mpt_tape_stream(tape), dx, dy, node->saved[0],
                             node->output->value.count);
}

mpt_status mpt_nn_dropout(mpt_tape *tape, mpt_var *x, float p, mpt_var **y) {
  if (!tape || !x || !y) return MPT_FAIL(MPT_EINVAL, "dropout: NULL tape, x or y");
  if (!(p >= 0.0f && p < 1.0f))
    return MPT_FAIL(MPT_EINVAL, "dropout: p = %g must be in [0, 1)", (double)p);
  if (x->value.dtype != MPT_F32) return MPT_FAIL(MPT_EINVAL, "dropout: x must be float32");
  if (p == 0.0f || !mpt_model_training(mpt_tape_model(tape))) {
    *y = x;
    return MPT_OK;
  }
  mpt_var *out = NULL;
  void *mask = NULL;
  const int64_t count = x->value.count;
  MPT_RETURN_IF(mpt__tape_new_var(tape, x->value.ndim, x->value.shape, MPT_F32, &out));
  MPT_RETURN_IF(mpt__tape_alloc(tape, (size_t)count * sizeof(float), &mask));
  MPT_RETURN_IF(mpt_op_dropout(mpt_tape_stream(tape), x->value.data, out->value.data, mask,
                               count, p, mpt__tape_next_seed(tape)));
  if (mpt__tape_needs_grad(tape, &x, 1)) {
    mpt__node *node = NULL;
    MPT_RETURN_IF(mpt__tape_record(tape, "dropout", dropout_backward, &x, 1, out, &node));
    node->saved[0] = mask;
  }
  *y = out;
  return MPT_OK;
}
