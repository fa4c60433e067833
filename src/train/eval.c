/* Evaluation (trainer.h): the evaluation set in order, each sample exactly once over the ranks
 * (the distributed sampler's padding rows are not counted), at most eval_max_batches batches per
 * rank, in evaluation mode (no dropout, BatchNorm's running statistics) and without recording
 * gradients. The loss and the metric are sums over every rank's real rows (loss x rows, metric,
 * rows), so the figures are the same for any number of ranks. Collective; training thread. */
#include <math.h>

#include "train/train_impl.h"

mpt_status mpt__train_sum(mpt__trainer *t, float *v, int n) {
  if (t->world == 1) return MPT_OK;
  return mpt_comm_allreduce_sync(t->comm, v, v, n, MPT_F32, MPT_REDUCE_SUM);
}

mpt_status mpt__train_evaluate(mpt__trainer *t) {
  const mpt_train_task *task = t->task;
  t->eval_loss = t->eval_metric = NAN;
  if (!t->eval_loader) return MPT_OK;
  MPT_RETURN_IF(mpt_loader_start_epoch(t->eval_loader, 0));
  const int training = mpt_model_training(t->model);
  mpt_model_set_training(t->model, 0);
  mpt_tape_set_grad_enabled(t->tape, 0);
  /* in double: a float sum of 400000 equal losses of 5.5452 came to a mean of 5.5239 */
  double sums[3] = {0, 0, 0};
  mpt_status st = MPT_OK;
  int64_t done = 0;
  mpt_batch b;
  int r;
  while (st == MPT_OK && (t->c.eval_max_batches == 0 || done < t->c.eval_max_batches) &&
         (r = mpt_loader_next(t->eval_loader, &b)) != MPT_LOADER_END) {
    if (r < 0) {
      st = (mpt_status)r;
      break;
    }
    done++;
    mpt_train_batch tb;
    st = mpt__train_view(t, &b, &tb);
    if (st != MPT_OK || tb.real_rows < 1) continue;
    mpt_tensor x, y;
    mpt_var *in, *out, *loss;
    float l = 0;
    double metric = 0;
    mpt_tape_reset(t->tape, 0);
    st = mpt__train_stage(t, &tb, tb.real_rows, &x, &y);
    if (st == MPT_OK) st = mpt_tape_input(t->tape, &x, &in);
    if (st == MPT_OK) st = mpt_model_forward(t->model, t->tape, in, &out);
    if (st == MPT_OK) st = task->loss(task->ctx, t->tape, out, &y, &loss);
    if (st == MPT_OK) st = mpt_var_item(t->tape, loss, &l);
    if (st == MPT_OK && task->metric)
      st = task->metric(task->ctx, t->stream, mpt_var_value(out), &y, tb.real_rows, &metric);
    sums[0] += (double)l * (double)tb.real_rows;
    sums[1] += metric;
    sums[2] += (double)tb.real_rows;
  }
  mpt_tape_set_grad_enabled(t->tape, 1);
  mpt_model_set_training(t->model, training);
  MPT_RETURN_IF(st);
  float f[3] = {(float)sums[0], (float)sums[1], (float)sums[2]}; /* each rank's, rounded once */
  MPT_RETURN_IF(mpt__train_sum(t, f, 3));
  t->eval_loss = f[2] > 0 ? (double)f[0] / f[2] : NAN;
  t->eval_metric = f[2] > 0 && task->metric ? (double)f[1] / f[2] : NAN;
  return MPT_OK;
}
