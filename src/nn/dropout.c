/* Inverted dropout on the tape (mpt_nn_dropout; Srivastava et al., 2014, scaled at training
 * time as PyTorch does): when the tape's model is training and p > 0,
 *   mask[i] = (u_i >= p) / (1 - p),  y = x * mask,  dx += dy * mask,
 * with u drawn by mpt_op_dropout from a per-op seed (mpt_tape_next_seed: the pass seed given
 * to mpt_tape_reset mixed with the op's position in the pass), so the same reset seed gives
 * the same masks. Otherwise the op is the identity and returns x itself (nothing recorded).
 * The mask lives in the tape arena; the node's context points to it. Runs on the tape's
 * stream. */

#include "mpitrain/autograd.h"
#include "mpitrain/ops.h"

static mpt_status dropout_backward(mpt_tape *tape, mpt_node *node) {
  const float *dy = mpt_node_grad_output(node);
  float *dx = NULL;
  if (!dy) return MPT_OK;
  MPT_RETURN_IF(mpt_var_grad_acc(tape, mpt_node_input(node, 0), &dx));
  if (!dx) return MPT_OK;
  const float *const *mask = mpt_node_ctx(node);
  return mpt_op_mul_backward(mpt_tape_stream(tape), dx, dy, *mask,
                             mpt_var_value(mpt_node_output(node))->count);
}

mpt_status mpt_nn_dropout(mpt_tape *tape, mpt_var *x, float p, mpt_var **y) {
  if (!tape || !x || !y) return MPT_FAIL(MPT_EINVAL, "dropout: NULL tape, x or y");
  if (!(p >= 0.0f && p < 1.0f))
    return MPT_FAIL(MPT_EINVAL, "dropout: p = %g must be in [0, 1)", (double)p);
  if (mpt_var_value(x)->dtype != MPT_F32) return MPT_FAIL(MPT_EINVAL, "dropout: x must be float32");
  if (p == 0.0f || !mpt_model_training(mpt_tape_model(tape))) {
    *y = x;
    return MPT_OK;
  }
  mpt_var *out = NULL;
  void *mask = NULL;
  const int64_t count = mpt_var_value(x)->count;
  MPT_RETURN_IF(mpt_tape_new_var(tape, mpt_var_value(x)->ndim, mpt_var_value(x)->shape, MPT_F32, &out));
  MPT_RETURN_IF(mpt_tape_alloc(tape, (size_t)count * sizeof(float), &mask));
  MPT_RETURN_IF(mpt_op_dropout(mpt_tape_stream(tape), mpt_var_value(x)->data, mpt_var_value(out)->data, mask,
                               count, p, mpt_tape_next_seed(tape)));
  if (mpt_tape_needs_grad(tape, &x, 1)) {
    mpt_node *node = NULL;
    MPT_RETURN_IF(mpt_tape_record(tape, "dropout", dropout_backward, &x, 1, out, &node));
    *(void **)mpt_node_ctx(node) = mask;
  }
  *y = out;
  return MPT_OK;
}
