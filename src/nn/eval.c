/* Evaluation mode as one switch (mpt_tape_set_eval) and the evaluation of a batch's real rows
 * (mpt_eval_batch), as declared in include/mpitrain/nn.h.
 *
 * Built only on the public tape and model calls, like a user's code would be. mpt_eval_batch
 * restores both flags (the model's training flag, the tape's grad flag) as it found them. Runs
 * on the caller's thread; the ops go to the tape's stream, which
 * mpt_var_item and mpt_op_count_correct synchronise. */
#include <math.h>
#include <stddef.h>

#include "mpitrain/nn.h"
#include "mpitrain/ops.h"

/* The sums are all-reduced as one array of three floats. */
_Static_assert(offsetof(mpt_eval_sums, correct) == sizeof(float) &&
                   offsetof(mpt_eval_sums, count) == 2 * sizeof(float) &&
                   sizeof(mpt_eval_sums) == 3 * sizeof(float),
               "mpt_eval_sums must be three consecutive floats");

void mpt_tape_set_eval(mpt_tape *tape, int eval) {
  if (!tape) return;
  mpt_model_set_training(mpt_tape_model(tape), !eval);
  mpt_tape_set_grad_enabled(tape, !eval);
}

/* CPU replicas share memory, so only the type must match there (as the optimizer checks). */
static int on_device(const mpt_tensor *t, mpt_device d) {
  return t->device.type == d.type && (d.type == MPT_DEVICE_CPU || t->device.index == d.index);
}

mpt_status mpt_eval_batch(mpt_tape *tape, const mpt_tensor *inputs, const mpt_tensor *labels,
                          int64_t num_real, mpt_eval_sums *sums) {
  if (!tape || !inputs || !labels || !sums)
    return MPT_FAIL(MPT_EINVAL, "mpt_eval_batch: NULL tape, inputs, labels or sums");
  mpt_model *model = mpt_tape_model(tape);
  mpt_device dev = mpt_model_device(model);
  const int64_t rows = inputs->ndim >= 1 ? inputs->shape[0] : -1;
  if (inputs->ndim < 1 || num_real < 0 || num_real > rows)
    return MPT_FAIL(MPT_EINVAL, "mpt_eval_batch: num_real %lld outside [0, %lld] (rows of the "
                    "inputs)", (long long)num_real, (long long)rows);
  if (labels->dtype != MPT_I32 || labels->ndim != 1 || labels->shape[0] != rows)
    return MPT_FAIL(MPT_EINVAL, "mpt_eval_batch: labels must be I32 [%lld] (got %s, %d dims, "
                    "%lld rows)", (long long)rows, mpt_dtype_name(labels->dtype), labels->ndim,
                    (long long)(labels->ndim ? labels->shape[0] : 0));
  if (!on_device(inputs, dev) || !on_device(labels, dev)) {
    char a[32];
    return MPT_FAIL(MPT_EINVAL, "mpt_eval_batch: inputs and labels must be on the model's "
                    "device %s (stage a host batch there first)", mpt_device_str(dev, a, sizeof a));
  }
  if (num_real == 0) return MPT_OK;

  const int was_training = mpt_model_training(model), had_grad = mpt_tape_grad_enabled(tape);
  mpt_status st;
  mpt_tape_set_eval(tape, 1);
  mpt_tape_reset(tape, 0);
  /* Views of the first num_real rows: the padding rows are never computed. */
  mpt_tensor x = mpt_tensor_view(inputs->data, inputs->device, inputs->dtype, inputs->ndim,
                                 inputs->shape);
  x.shape[0] = num_real;
  x.count = inputs->count / rows * num_real;
  mpt_tensor y = mpt_tensor_view(labels->data, labels->device, MPT_I32, 1, &num_real);
  mpt_var *in, *logits, *loss;
  float l = 0.0f;
  int64_t correct = 0;
  MPT_CHECK(mpt_tape_input(tape, &x, &in), done);
  MPT_CHECK(mpt_model_forward(model, tape, in, &logits), done);
  MPT_CHECK(mpt_nn_cross_entropy(tape, logits, &y, &loss), done);
  MPT_CHECK(mpt_var_item(tape, loss, &l), done);
  const mpt_tensor *lv = mpt_var_value(logits);
  MPT_CHECK(mpt_op_count_correct(mpt_tape_stream(tape), lv->data, y.data, num_real,
                                 lv->shape[1], &correct), done);
  sums->loss_sum += l * (float)num_real;
  sums->correct += (float)correct;
  sums->count += (float)num_real;
done:
  mpt_model_set_training(model, was_training);
  mpt_tape_set_grad_enabled(tape, had_grad);
  return st;
}

double mpt_eval_sums_loss(const mpt_eval_sums *sums) {
  return sums && sums->count > 0 ? (double)sums->loss_sum / sums->count : NAN;
}

double mpt_eval_sums_accuracy(const mpt_eval_sums *sums) {
  return sums && sums->count > 0 ? (double)sums->correct / sums->count : NAN;
}
