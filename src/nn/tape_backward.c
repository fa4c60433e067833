/* The tape's backward side (include/mpitrain/nn.h, autograd.h; internals in tape_impl.h): the
 * gradient storage of vars, recording nodes, backward, activation checkpoints (recompute), the
 * entry points of op profiling (tape_profile.c) and the accessors of the public op API.
 *
 * Backward walks the nodes in reverse; a node whose output got no gradient is skipped (it
 * contributes zero) but its parameter uses are still released; when a parameter's remaining
 * uses reach zero its gradient is final and the grad-ready hook fires (tape.c says how the
 * uses are counted). A view var shares its base's gradient storage.
 *
 * One thread at a time; all device work goes on the tape's stream. */
#include <stdlib.h>
#include <string.h>

#include "mpitrain/ops.h"
#include "nn/tape_impl.h"

/* The gradient storage of var, allocated on first use; *fresh = 1 when this call allocated it
 * (zero-filled only when `zero`), else 0. */
static mpt_status grad_get(mpt_tape *tape, mpt_var *var, int zero, float **grad, int *fresh) {
  *fresh = 0;
  if (var->grad.data && var->grad_unwritten) { /* made ahead: as if allocated now */
    var->grad_unwritten = 0;
    if (zero) MPT_RETURN_IF(mpt_op_fill(tape->stream, var->grad.data, var->value.count, 0.0f));
    *fresh = 1;
  } else if (!var->grad.data) {
    var_slot *slot = (var_slot *)var;
    if (slot->of) { /* a view: share the base's gradient */
      float *base = NULL;
      MPT_RETURN_IF(grad_get(tape, &slot->of->var, zero, &base, fresh));
      if (!base)
        return MPT_FAIL(MPT_ESTATE, "var_grad: a view that needs a gradient of a base that "
                        "does not");
      var->grad.data = base;
    } else {
      if (var->value.dtype != MPT_F32)
        return MPT_FAIL(MPT_EINVAL, "var_grad: a %s value cannot have a gradient",
                        mpt_dtype_name(var->value.dtype));
      void *data = NULL;
      MPT_RETURN_IF(mpt_tape_alloc(tape, (size_t)var->value.count * sizeof(float), &data));
      if (zero) MPT_RETURN_IF(mpt_op_fill(tape->stream, data, var->value.count, 0.0f));
      var->grad.data = data;
      *fresh = 1;
    }
  }
  *grad = var->grad.data;
  return MPT_OK;
}

mpt_status mpt_var_grad_acc(mpt_tape *tape, mpt_var *var, float **grad) {
  if (!tape || !var || !grad) return MPT_FAIL(MPT_EINVAL, "var_grad: NULL argument");
  *grad = NULL;
  if (!var->requires_grad) return MPT_OK;
  int fresh;
  return grad_get(tape, var, 1, grad, &fresh);
}

mpt_status mpt_var_grad_beta(mpt_tape *tape, mpt_var *var, float **grad, float *beta) {
  if (!tape || !var || !grad || !beta) return MPT_FAIL(MPT_EINVAL, "var_grad_beta: NULL argument");
  *grad = NULL;
  *beta = 1.0f;
  if (!var->requires_grad) return MPT_OK;
  int fresh = 0;
  MPT_RETURN_IF(grad_get(tape, var, 0, grad, &fresh));
  *beta = fresh ? 0.0f : 1.0f;
  return MPT_OK;
}

mpt_status mpt_var_grad_take(mpt_tape *tape, mpt_var *var, mpt_var *from, int *taken) {
  if (!tape || !var || !from || !taken) return MPT_FAIL(MPT_EINVAL, "var_grad_take: NULL argument");
  *taken = 0;
  /* Only between two of this pass's new vars (a view's storage is its base's, a parameter's
   * is the model's), from's storage already made, var's not yet. */
  if (var == from || !var->requires_grad || var->kind != VAR_NEW || var->grad.data ||
      from->kind != VAR_NEW || !from->grad.data || var->value.count != from->value.count ||
      var->value.dtype != MPT_F32)
    return MPT_OK;
  var->grad.data = from->grad.data;
  *taken = 1;
  return MPT_OK;
}

mpt_status mpt_var_item(mpt_tape *tape, const mpt_var *var, float *value) {
  if (!tape || !var || !value) return MPT_FAIL(MPT_EINVAL, "var_item: NULL argument");
  if (var->value.count != 1 || var->value.dtype != MPT_F32) {
    char buf[128];
    return MPT_FAIL(MPT_EINVAL, "var_item: want one float32, the var is %s %s",
                    mpt_dtype_name(var->value.dtype),
                    mpt_shape_str(var->value.ndim, var->value.shape, buf, sizeof buf));
  }
  MPT_RETURN_IF(mpt_op_memcpy(tape->stream, mpt_device_cpu(), value, var->value.device,
                              var->value.data, sizeof(float)));
  if (tape->stream) MPT_RETURN_IF(mpt_stream_synchronize(tape->stream, TAPE_SYNC_TIMEOUT_MS));
  return MPT_OK;
}

/* ---- recording and backward ---- */

int mpt_tape_needs_grad(const mpt_tape *tape, mpt_var *const *inputs, int ninputs) {
  if (!tape || !tape->grad_enabled || !inputs) return 0;
  for (int i = 0; i < ninputs; i++)
    if (inputs[i] && inputs[i]->requires_grad) return 1;
  return 0;
}

mpt_status mpt_tape_record(mpt_tape *tape, const char *name, mpt_backward_fn backward,
                            mpt_var *const *inputs, int ninputs, mpt_var *output,
                            mpt_node **node) {
  if (node) *node = NULL;
  if (!tape || !backward || !output)
    return MPT_FAIL(MPT_EINVAL, "tape_record '%s': NULL %s", name ? name : "?",
                    !tape ? "tape" : !backward ? "backward function" : "output");
  if (ninputs < 0 || ninputs > MPT_NODE_MAX_INPUTS || (ninputs > 0 && !inputs))
    return MPT_FAIL(MPT_EINVAL, "tape_record '%s': %d inputs (0..%d, and a NULL array only for "
                    "0)", name ? name : "?", ninputs, MPT_NODE_MAX_INPUTS);
  if (!tape->grad_enabled)
    return MPT_FAIL(MPT_ESTATE, "tape_record '%s': gradients are disabled on this tape",
                    name ? name : "?");
  const char *op = name ? name : "?";
  if (!mpt__tape_var_is_live(tape, output) ||
      (output->kind != VAR_NEW && output->kind != VAR_VIEW) || output->requires_grad)
    return MPT_FAIL(MPT_EINVAL, "tape_record '%s': the output must be a var the op made in this "
                    "pass with mpt_tape_new_var (or a view), not yet recorded: not an input, a "
                    "parameter, a var from before mpt_tape_reset or another node's output", op);
  for (int i = 0; i < ninputs; i++) {
    const mpt_var *in = inputs[i];
    if (in && !mpt__tape_var_is_live(tape, in))
      return MPT_FAIL(MPT_EINVAL, "tape_record '%s': input %d is not a var of this tape's "
                      "current pass (kept from before mpt_tape_reset, or of another tape)", op, i);
    if (in == output)
      return MPT_FAIL(MPT_EINVAL, "tape_record '%s': input %d is the output itself", op, i);
    if (in && in->param_index >= 0 &&
        (in->param_index >= tape->nparams || tape->param_vars[in->param_index] != in))
      return MPT_FAIL(MPT_EINVAL, "tape_record '%s': input %d is parameter %d's var from "
                      "another tape or pass", name ? name : "?", i, in->param_index);
  }
  mpt_node *n = NULL;
  MPT_RETURN_IF(mpt__tape_pool_take(tape, &tape->nodes, (void **)&n));
  n->backward = backward;
  n->name = name ? name : "?";
  n->ninputs = ninputs;
  for (int i = 0; i < ninputs; i++) {
    n->inputs[i] = inputs[i];
    if (inputs[i] && inputs[i]->param_index >= 0) tape->uses[inputs[i]->param_index]++;
  }
  n->output = output;
  output->requires_grad = 1;
  if (node) *node = n;
  if (tape->prof) MPT_RETURN_IF(mpt__tape_profile_forward(tape->prof, tape->stream, n->name));
  return MPT_OK;
}

static mpt_status run_backward(mpt_tape *tape, mpt_var *loss, float scale,
                               const mpt_model_hooks *hooks);

mpt_status mpt_tape_backward(mpt_tape *tape, mpt_var *loss, float scale) {
  if (!tape || !loss) return MPT_FAIL(MPT_EINVAL, "tape_backward: NULL tape or loss");
  if (tape->backward_done)
    return MPT_FAIL(MPT_ESTATE, "tape_backward: already ran for this pass (reset the tape "
                    "and run the forward again)");
  if (!mpt__tape_var_is_live(tape, loss))
    return MPT_FAIL(MPT_ESTATE, "tape_backward: the loss is not a var of this tape's pass");
  if (loss->value.count != 1 || loss->value.dtype != MPT_F32) {
    char buf[128];
    return MPT_FAIL(MPT_ESTATE, "tape_backward: the loss must be one float32, it is %s %s",
                    mpt_dtype_name(loss->value.dtype),
                    mpt_shape_str(loss->value.ndim, loss->value.shape, buf, sizeof buf));
  }
  int64_t loss_node = -1;
  for (int64_t i = tape->nodes.used - 1; i >= 0 && loss_node < 0; i--)
    if (mpt__tape_node_at(tape, i)->output == loss) loss_node = i;
  if (!loss->requires_grad || loss_node < 0)
    return MPT_FAIL(MPT_ESTATE, "tape_backward: the loss was not recorded on this tape (no "
                    "input needed a gradient, or gradients were disabled)");
  if (mpt_model_grads_state(tape->model) == MPT_GRADS_APPLIED)
    return MPT_FAIL(MPT_ESTATE, "tape_backward: the model's gradients were already applied by an "
                    "optimizer step (call mpt_model_zero_grad before the next forward)");
  tape->backward_done = 1;
  const mpt_model_hooks *hooks = tape->model_hooks ? mpt_model_get_hooks(tape->model) : NULL;
  if (hooks && hooks->before_backward) MPT_RETURN_IF(hooks->before_backward(hooks->user, tape));
  mpt_status st = run_backward(tape, loss, scale, hooks);
  if (hooks && hooks->after_backward) st = hooks->after_backward(hooks->user, tape, st);
  mpt__model_backward_done(tape->model, st);
  return st;
}

/* Runs the backward functions of nodes [lo, hi) in reverse, releasing their parameter uses
 * (a parameter whose last use is released fires the hooks). *t_ms: profiling's mark. */
static mpt_status walk_nodes(mpt_tape *tape, int64_t lo, int64_t hi,
                             const mpt_model_hooks *hooks, double *t_ms) {
  /* Every node, the ones after the loss too: they got no gradient, but their parameter uses
   * must be released for the hook to fire. */
  for (int64_t i = hi - 1; i >= lo; i--) {
    mpt_node *node = mpt__tape_node_at(tape, i);
    if (node->output->grad.data) {
      mpt_status st = MPT_OK;
      for (int k = 0; st == MPT_OK && hooks && hooks->param_needed && k < node->ninputs; k++)
        if (node->inputs[k] && node->inputs[k]->param_index >= 0)
          st = hooks->param_needed(hooks->user, tape, node->inputs[k]->param_index, 1);
      if (st == MPT_OK) st = node->backward(tape, node);
      if (st != MPT_OK) {
        char inner[512];
        strncpy(inner, mpt_last_error(), sizeof inner - 1);
        inner[sizeof inner - 1] = '\0';
        return MPT_FAIL(st, "tape_backward: node %lld ('%s'): %s", (long long)i, node->name,
                        inner);
      }
      if (tape->prof)
        MPT_RETURN_IF(mpt__tape_profile_backward(tape->prof, tape->stream, node->name, *t_ms,
                                                 t_ms));
    }
    int fired = 0;
    for (int k = 0; k < node->ninputs; k++) {
      const mpt_var *in = node->inputs[k];
      if (!in || in->param_index < 0) continue;
      if (--tape->remaining[in->param_index] != 0) continue;
      fired = 1;
      if (tape->hook) tape->hook(tape->hook_user, in->param_index);
      if (hooks && hooks->grad_ready) hooks->grad_ready(hooks->user, in->param_index);
    }
    if (tape->prof && fired && (tape->hook || (hooks && hooks->grad_ready)))
      MPT_RETURN_IF(mpt__tape_profile_backward(tape->prof, tape->stream, "grad-ready hooks",
                                               *t_ms, t_ms));
    else if (tape->prof)
      *t_ms = mpt_time_ms(); /* a skipped node's bookkeeping is nobody's time */
  }
  return MPT_OK;
}

/* The walk itself (mpt_tape_backward has checked its arguments and run before_backward). */
static mpt_status run_backward(mpt_tape *tape, mpt_var *loss, float scale,
                               const mpt_model_hooks *hooks) {
  float *dloss = NULL;
  MPT_RETURN_IF(mpt_var_grad_acc(tape, loss, &dloss));
  MPT_RETURN_IF(mpt_op_fill(tape->stream, dloss, 1, scale));
  for (int i = 0; i < tape->nparams; i++) tape->remaining[i] = tape->uses[i];
  double t_ms = 0; /* profiling: the end of the last timed interval */
  if (tape->prof) {
    MPT_RETURN_IF(mpt__tape_profile_mark(tape->prof, tape->stream)); /* forward's work done */
    t_ms = mpt_time_ms();
  }
  return walk_nodes(tape, 0, tape->nodes.used, hooks, &t_ms);
}

/* ---- activation checkpoints (recompute) ---- */

void mpt_tape_set_recompute(mpt_tape *tape, int enabled) {
  if (tape) tape->recompute = enabled != 0;
}

int mpt_tape_recompute(const mpt_tape *tape) { return tape ? tape->recompute : 0; }

typedef struct ckpt_ctx {
  mpt_checkpoint_fn fn;
  void *user;
  mpt_var *x;
  uint64_t seed_counter; /* at the forward: dropout draws the same masks again */
  int params_start, params_count; /* its run in tape->ckpt_params */
} ckpt_ctx;
_Static_assert(sizeof(ckpt_ctx) <= MPT_NODE_CTX_BYTES, "checkpoint context too large");

/* Releases one use of parameter p (the hooks fire at its last). */
static void release_use(mpt_tape *tape, int p, const mpt_model_hooks *hooks) {
  if (--tape->remaining[p] != 0) return;
  if (tape->hook) tape->hook(tape->hook_user, p);
  if (hooks && hooks->grad_ready) hooks->grad_ready(hooks->user, p);
}

/* Recomputes the block with gradients on, runs its nodes' backward right away, then frees its
 * nodes and arena memory. */
static mpt_status ckpt_backward(mpt_tape *tape, mpt_node *node) {
  ckpt_ctx *c = mpt_node_ctx(node);
  mpt_var *x = c->x, *r = NULL;
  const mpt_model_hooks *hooks = tape->model_hooks ? mpt_model_get_hooks(tape->model) : NULL;
  if (x->requires_grad && !x->grad.data) {
    /* x's gradient lives on after the block's memory is freed: made before the mark, and
     * written by the block's first contribution as if made then */
    float *g = NULL;
    if (((var_slot *)x)->of) {
      MPT_RETURN_IF(mpt_var_grad_acc(tape, x, &g));
    } else {
      void *data = NULL;
      MPT_RETURN_IF(mpt_tape_alloc(tape, (size_t)x->value.count * sizeof(float), &data));
      x->grad.data = data;
      x->grad_unwritten = 1;
    }
  }
  const arena_mark mark = mpt__tape_arena_mark(tape);
  const int64_t n0 = tape->nodes.used;
  const uint64_t seed_counter = tape->seed_counter;
  const int grad_enabled = tape->grad_enabled;
  tape->seed_counter = c->seed_counter;
  tape->grad_enabled = 1;
  mpt_status st = c->fn(tape, c->user, x, &r);
  tape->seed_counter = seed_counter;
  tape->grad_enabled = grad_enabled;
  if (st == MPT_OK && r && r->requires_grad) {
    int taken = 0;
    st = mpt_var_grad_take(tape, r, node->output, &taken);
    if (st == MPT_OK && !taken) {
      float *g = NULL, beta = 1.0f;
      st = mpt_var_grad_beta(tape, r, &g, &beta);
      if (st == MPT_OK && beta == 0.0f)
        st = mpt_op_memcpy(tape->stream, tape->device, g, tape->device, node->output->grad.data,
                           (size_t)r->value.count * sizeof(float));
      else if (st == MPT_OK)
        st = MPT_FAIL(MPT_ESTATE, "checkpoint: the recomputed output already has a gradient");
    }
    for (int64_t i = n0; st == MPT_OK && i < tape->nodes.used; i++) {
      const mpt_node *n = mpt__tape_node_at(tape, i);
      for (int k = 0; k < n->ninputs; k++)
        if (n->inputs[k] && n->inputs[k]->param_index >= 0)
          tape->remaining[n->inputs[k]->param_index]++;
    }
    double t_ms = tape->prof ? mpt_time_ms() : 0;
    if (st == MPT_OK) st = walk_nodes(tape, n0, tape->nodes.used, hooks, &t_ms);
  } else if (st == MPT_OK && !r) {
    st = MPT_FAIL(MPT_EINVAL, "checkpoint: the function returned no output");
  }
  if (st == MPT_OK && x->grad_unwritten) { /* the block did not reach x */
    x->grad_unwritten = 0;
    st = mpt_op_fill(tape->stream, x->grad.data, x->value.count, 0.0f);
  }
  /* the forward's placeholder use of each parameter the block used: released last, so a
   * parameter's gradient is final when the whole block's backward is */
  for (int i = 0; i < c->params_count; i++)
    release_use(tape, tape->ckpt_params[c->params_start + i], hooks);
  tape->nodes.used = n0;
  mpt__tape_arena_rewind(tape, &mark);
  return st;
}

mpt_status mpt_tape_checkpoint(mpt_tape *tape, mpt_checkpoint_fn fn, void *user, mpt_var *x,
                               mpt_var **y) {
  if (!tape || !fn || !x || !y) return MPT_FAIL(MPT_EINVAL, "tape_checkpoint: NULL argument");
  *y = NULL;
  if (!tape->grad_enabled || tape->ckpt_forward) return fn(tape, user, x, y);
  if (!mpt__tape_var_is_live(tape, x))
    return MPT_FAIL(MPT_EINVAL, "tape_checkpoint: x is not a var of this tape's current pass");
  mpt_var *out = NULL, *r = NULL;
  MPT_RETURN_IF(mpt_tape_new_var(tape, x->value.ndim, x->value.shape, x->value.dtype, &out));
  const arena_mark mark = mpt__tape_arena_mark(tape);
  const int start = tape->nckpt_params;
  const uint64_t seed_counter = tape->seed_counter;
  MPT_RETURN_IF(mpt__tape_param_arrays(tape));
  tape->ckpt_count++;
  tape->ckpt_forward = 1;
  tape->grad_enabled = 0;
  mpt_status st = fn(tape, user, x, &r);
  tape->grad_enabled = 1;
  tape->ckpt_forward = 0;
  if (st == MPT_OK && !r) st = MPT_FAIL(MPT_EINVAL, "tape_checkpoint: the function returned no "
                                        "output");
  if (st == MPT_OK) {
    int same = r->value.ndim == x->value.ndim && r->value.dtype == x->value.dtype;
    for (int d = 0; same && d < x->value.ndim; d++) same = r->value.shape[d] == x->value.shape[d];
    if (!same) {
      char a[128], b[128];
      st = MPT_FAIL(MPT_ESHAPE, "tape_checkpoint: the function maps %s to %s: a checkpointed "
                    "block keeps its input's shape and dtype",
                    mpt_shape_str(x->value.ndim, x->value.shape, a, sizeof a),
                    mpt_shape_str(r->value.ndim, r->value.shape, b, sizeof b));
    }
  }
  if (st == MPT_OK)
    st = mpt_op_memcpy(tape->stream, tape->device, out->value.data, tape->device, r->value.data,
                       (size_t)x->value.count * mpt_dtype_size(x->value.dtype));
  mpt__tape_arena_rewind(tape, &mark);
  if (st != MPT_OK) return st;
  const int count = tape->nckpt_params - start;
  if (count == 0 && !x->requires_grad) { /* nothing to differentiate */
    *y = out;
    return MPT_OK;
  }
  mpt_node *node = NULL;
  MPT_RETURN_IF(mpt_tape_record(tape, "checkpoint", ckpt_backward, &x, 1, out, &node));
  ckpt_ctx *c = mpt_node_ctx(node);
  *c = (ckpt_ctx){.fn = fn, .user = user, .x = x, .seed_counter = seed_counter,
                  .params_start = start, .params_count = count};
  for (int i = 0; i < count; i++) tape->uses[tape->ckpt_params[start + i]]++;
  *y = out;
  return MPT_OK;
}

/* ---- op profiling (tape_profile.c) ---- */

mpt_status mpt_tape_set_profiling(mpt_tape *tape, int on) {
  if (!tape) return MPT_FAIL(MPT_EINVAL, "tape_set_profiling: NULL tape");
  if (!on) {
    mpt__tape_profile_free(tape->prof);
    tape->prof = NULL;
    return MPT_OK;
  }
  if (!tape->prof) MPT_RETURN_IF(mpt__tape_profile_init(&tape->prof));
  return MPT_OK;
}

void mpt_tape_clear_op_times(mpt_tape *tape) {
  if (tape && tape->prof) mpt__tape_profile_clear(tape->prof);
}

int mpt_tape_op_times(const mpt_tape *tape, mpt_op_time *rows, int max_rows) {
  return tape && tape->prof ? mpt__tape_profile_rows(tape->prof, rows, max_rows) : 0;
}

mpt_status mpt__tape_profile_start_forward(mpt_tape *tape) {
  return tape->prof ? mpt__tape_profile_mark(tape->prof, tape->stream) : MPT_OK;
}

/* ---- the public op API's accessors (include/mpitrain/autograd.h) ---- */

int mpt_var_requires_grad(const mpt_var *var) { return var ? var->requires_grad : 0; }
int mpt_var_param_index(const mpt_var *var) { return var ? var->param_index : -1; }
int mpt_node_num_inputs(const mpt_node *node) { return node ? node->ninputs : 0; }
mpt_var *mpt_node_input(const mpt_node *node, int index) {
  return node && index >= 0 && index < node->ninputs ? node->inputs[index] : NULL;
}
mpt_var *mpt_node_output(const mpt_node *node) { return node ? node->output : NULL; }
const float *mpt_node_grad_output(const mpt_node *node) {
  return node ? node->output->grad.data : NULL;
}
const char *mpt_node_name(const mpt_node *node) { return node ? node->name : NULL; }
void *mpt_node_ctx(mpt_node *node) { return node ? node->ctx : NULL; }
