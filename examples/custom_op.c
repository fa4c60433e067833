/* Your own differentiable op, written through the public op API (mpitrain/autograd.h) the way
 * every built-in op is, and checked by finite differences.
 *
 *   ./examples/custom_op
 *
 * The op is SiLU (Elfwing et al., 2018; "swish"): y = x * sigmoid(x), with
 * dy/dx = s + x * s * (1 - s), s = sigmoid(x). Forward saves s in the tape's arena for backward;
 * backward ACCUMULATES into dx (a value used twice gets both gradients: checked below by using
 * the op twice on the same input). Exits 1 if an analytic gradient differs from the central
 * difference by more than 1e-3 (relative). */
#include <math.h>
#include <stdio.h>

#include "mpitrain.h"

typedef struct silu_ctx {
  const float *s; /* sigmoid(x) [count], in the arena */
  int64_t count;
} silu_ctx;

static mpt_status silu_backward(mpt_tape *tape, mpt_node *node) {
  const silu_ctx *c = mpt_node_ctx(node);
  mpt_var *x = mpt_node_input(node, 0);
  const float *dy = mpt_node_grad_output(node), *xv = mpt_var_value(x)->data;
  float *dx = NULL;
  MPT_RETURN_IF(mpt_var_grad_acc(tape, x, &dx));
  if (!dx) return MPT_OK; /* x needs no gradient */
  for (int64_t i = 0; i < c->count; i++)
    dx[i] += dy[i] * (c->s[i] + xv[i] * c->s[i] * (1.0f - c->s[i]));
  return MPT_OK;
}

/* y = silu(x), elementwise on float32 of any shape, on the CPU. */
static mpt_status my_silu(mpt_tape *tape, mpt_var *x, mpt_var **y) {
  const mpt_tensor *xv = mpt_var_value(x);
  if (xv->dtype != MPT_F32 || xv->device.type != MPT_DEVICE_CPU)
    return MPT_FAIL(MPT_EINVAL, "silu: x must be float32 on the CPU");
  float *s = NULL;
  MPT_RETURN_IF(mpt_tape_new_var(tape, xv->ndim, xv->shape, MPT_F32, y));
  MPT_RETURN_IF(mpt_tape_alloc(tape, (size_t)xv->count * sizeof(float), (void **)&s));
  const float *in = xv->data;
  float *out = mpt_var_value(*y)->data;
  for (int64_t i = 0; i < xv->count; i++) {
    s[i] = 1.0f / (1.0f + expf(-in[i]));
    out[i] = in[i] * s[i];
  }
  if (mpt_tape_needs_grad(tape, &x, 1)) {
    mpt_node *node;
    MPT_RETURN_IF(mpt_tape_record(tape, "silu", silu_backward, &x, 1, *y, &node));
    _Static_assert(sizeof(silu_ctx) <= MPT_NODE_CTX_BYTES, "context too large");
    *(silu_ctx *)mpt_node_ctx(node) = (silu_ctx){.s = s, .count = xv->count};
  }
  return MPT_OK;
}

enum { N = 12 };
static float weights[N]; /* loss = sum_i w_i * (silu(x_i) + silu(x_i)) */

/* The "model": its one parameter is x, so the tape gives dloss/dx in the model's gradients. */
static mpt_status forward(mpt_model *m, mpt_tape *tape, void *ctx, mpt_var *w, mpt_var **loss) {
  (void)m;
  (void)ctx;
  mpt_var *x, *a, *b, *y;
  MPT_RETURN_IF(mpt_tape_param(tape, 0, &x));
  MPT_RETURN_IF(my_silu(tape, x, &a));
  MPT_RETURN_IF(my_silu(tape, x, &b)); /* x used twice: its gradient is the sum */
  MPT_RETURN_IF(mpt_nn_add(tape, a, b, &y));
  MPT_RETURN_IF(mpt_nn_mul(tape, y, w, &y));
  return mpt_nn_sum(tape, y, loss);
}

static mpt_status loss_at(mpt_model *m, mpt_tape *tape, mpt_tensor *wt, int grad, float *value) {
  mpt_var *w, *loss;
  mpt_tape_reset(tape, 0);
  mpt_tape_set_grad_enabled(tape, grad);
  MPT_RETURN_IF(mpt_tape_input(tape, wt, &w));
  MPT_RETURN_IF(mpt_model_forward(m, tape, w, &loss));
  MPT_RETURN_IF(mpt_var_item(tape, loss, value));
  return grad ? mpt_tape_backward(tape, loss, 1.0f) : MPT_OK;
}

int main(void) {
  mpt_model *m = NULL;
  mpt_tape *tape = NULL;
  const int64_t shape[1] = {N};
  mpt_status st = MPT_OK;
  int index, bad = 0;
  for (int i = 0; i < N; i++) weights[i] = 0.5f + 0.25f * (float)(i % 5) - 0.6f * (float)(i % 2);
  mpt_tensor wt = mpt_tensor_view(weights, mpt_device_cpu(), MPT_F32, 1, shape);
  MPT_CHECK(mpt_model_init(&m, mpt_device_cpu()), fail);
  MPT_CHECK(mpt_model_add_param(m, "x", 1, shape, MPT_INIT_ZEROS, 0, &index), fail);
  mpt_model_set_forward(m, forward, NULL, NULL);
  MPT_CHECK(mpt_model_finalize(m), fail);
  MPT_CHECK(mpt_tape_init(&tape, m, NULL), fail);
  float *x = mpt_model_params(m);
  for (int i = 0; i < N; i++) x[i] = -3.0f + 0.5f * (float)i; /* -3 .. 2.5 */
  float value;
  MPT_CHECK(mpt_model_zero_grad(m, NULL), fail);
  MPT_CHECK(loss_at(m, tape, &wt, 1, &value), fail);
  const float *grad = mpt_model_grads(m);
  for (int i = 0; i < N; i++) {
    const float h = 1e-2f, keep = x[i];
    float up, down;
    x[i] = keep + h;
    MPT_CHECK(loss_at(m, tape, &wt, 0, &up), fail);
    x[i] = keep - h;
    MPT_CHECK(loss_at(m, tape, &wt, 0, &down), fail);
    x[i] = keep;
    const double fd = ((double)up - (double)down) / (2.0 * h);
    const double err = fabs(fd - grad[i]) / fmax(fabs(fd), 1e-2);
    printf("x = %5.2f  analytic %+.6f  central difference %+.6f  rel. error %.1e\n", keep,
           grad[i], fd, err);
    if (err > 1e-3) bad++;
  }
  printf("%s: %d of %d gradients differ\n", bad ? "FAILED" : "ok", bad, N);
fail:
  if (st != MPT_OK) fprintf(stderr, "custom_op: %s\n", mpt_last_error());
  mpt_tape_free(tape);
  mpt_model_free(m);
  return st != MPT_OK || bad ? 1 : 0;
}
