/* Optimizers over one flat parameter buffer: SGD (momentum, dampening, Nesterov, L2 weight decay)
 * and AdamW, as declared in include/mpitrain/optim.h.
 *
 * Invariants: the state buffers exist exactly when the kind needs them (SGD with momentum > 0:
 * one; AdamW: two), hold `count` floats on `device`, and are zero until the first step; the
 * config was validated at init and never changes; step_count counts the steps whose kernel
 * returned MPT_OK. The arithmetic is in the device kernels (mpt_op_sgd_step,
 * mpt_op_adamw_step); this file keeps the state and the step count, and runs on the caller's
 * thread, enqueuing on the stream it is given. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "mpitrain/ops.h"
#include "mpitrain/optim.h"

/* How long init waits for the zero fill of the state on a device stream. */
#define OPTIM_INIT_TIMEOUT_MS 60000.0

struct mpt_optimizer {
  mpt_optimizer_config cfg;
  mpt_device device;
  int64_t count;
  int nbuffers;
  float *buffers[MPT_OPTIM_MAX_STATE]; /* each [count] on device; see the state names */
  int64_t step_count;
};

mpt_optimizer_config mpt_optimizer_config_default(void) {
  mpt_optimizer_config c;
  memset(&c, 0, sizeof c);
  c.kind = MPT_OPTIM_SGD;
  c.lr = 0.01f;
  c.momentum = 0.0f;
  c.dampening = 0.0f;
  c.nesterov = 0;
  c.weight_decay = 0.0f;
  c.beta1 = 0.9f;
  c.beta2 = 0.999f;
  c.eps = 1e-8f;
  return c;
}

static int beta_ok(float b) { return isfinite(b) && b >= 0.0f && b < 1.0f; }

mpt_status mpt_optimizer_config_validate(const mpt_optimizer_config *cfg) {
  if (!cfg) return MPT_FAIL(MPT_EINVAL, "NULL optimizer config");
  if (!(isfinite(cfg->lr) && cfg->lr >= 0.0f))
    return MPT_FAIL(MPT_EINVAL, "optimizer lr must be >= 0 and finite (got %g)", (double)cfg->lr);
  if (!(isfinite(cfg->weight_decay) && cfg->weight_decay >= 0.0f))
    return MPT_FAIL(MPT_EINVAL, "optimizer weight_decay must be >= 0 and finite (got %g)",
                    (double)cfg->weight_decay);
  switch (cfg->kind) {
    case MPT_OPTIM_SGD:
      if (!(isfinite(cfg->momentum) && cfg->momentum >= 0.0f))
        return MPT_FAIL(MPT_EINVAL, "SGD momentum must be >= 0 and finite (got %g)",
                        (double)cfg->momentum);
      if (!(isfinite(cfg->dampening) && cfg->dampening >= 0.0f && cfg->dampening <= 1.0f))
        return MPT_FAIL(MPT_EINVAL, "SGD dampening must be in [0, 1] (got %g)",
                        (double)cfg->dampening);
      if (cfg->nesterov && !(cfg->momentum > 0.0f && cfg->dampening == 0.0f))
        return MPT_FAIL(MPT_EINVAL,
                        "nesterov momentum requires momentum > 0 and dampening == 0 "
                        "(got momentum %g, dampening %g)",
                        (double)cfg->momentum, (double)cfg->dampening);
      return MPT_OK;
    case MPT_OPTIM_ADAMW:
      if (!beta_ok(cfg->beta1))
        return MPT_FAIL(MPT_EINVAL, "AdamW beta1 must be in [0, 1) (got %g)", (double)cfg->beta1);
      if (!beta_ok(cfg->beta2))
        return MPT_FAIL(MPT_EINVAL, "AdamW beta2 must be in [0, 1) (got %g)", (double)cfg->beta2);
      if (!(isfinite(cfg->eps) && cfg->eps > 0.0f))
        return MPT_FAIL(MPT_EINVAL, "AdamW eps must be > 0 and finite (got %g)",
                        (double)cfg->eps);
      return MPT_OK;
  }
  return MPT_FAIL(MPT_EINVAL, "unknown optimizer kind %d (expected sgd or adamw)",
                  (int)cfg->kind);
}

mpt_status mpt_optimizer_kind_parse(const char *text, mpt_optim_kind *kind) {
  if (!text || !kind) return MPT_FAIL(MPT_EINVAL, "no optimizer name given");
  if (strcmp(text, "sgd") == 0) {
    *kind = MPT_OPTIM_SGD;
  } else if (strcmp(text, "adamw") == 0) {
    *kind = MPT_OPTIM_ADAMW;
  } else {
    return MPT_FAIL(MPT_EINVAL, "unknown optimizer '%s' (expected sgd or adamw)", text);
  }
  return MPT_OK;
}

const char *mpt_optimizer_kind_name(mpt_optim_kind kind) {
  switch (kind) {
    case MPT_OPTIM_SGD:
      return "sgd";
    case MPT_OPTIM_ADAMW:
      return "adamw";
  }
  return "unknown";
}

static int state_buffers_for(const mpt_optimizer_config *cfg) {
  if (cfg->kind == MPT_OPTIM_ADAMW) return 2;
  return cfg->momentum != 0.0f ? 1 : 0;
}

static const char *state_name(mpt_optim_kind kind, int i) {
  if (kind == MPT_OPTIM_ADAMW) return i == 0 ? "exp_avg" : "exp_avg_sq";
  return "momentum_buffer";
}

/* Zeroes the state. The CPU runs it now on the NULL stream; another device gets a temporary
 * stream, synchronized before it is freed, so that the zeros are visible to every stream. */
static mpt_status zero_state(mpt_optimizer *o) {
  mpt_status st = MPT_OK;
  mpt_stream *stream = NULL;
  if (o->nbuffers == 0 || o->count == 0) return MPT_OK;
  if (o->device.type != MPT_DEVICE_CPU) MPT_CHECK(mpt_stream_init(&stream, o->device,
                                                                  MPT_STREAM_INLINE), done);
  for (int i = 0; i < o->nbuffers; ++i) MPT_CHECK(mpt_op_fill(stream, o->buffers[i], o->count,
                                                              0.0f), sync);
sync:
  if (stream) {
    mpt_status sst = mpt_stream_synchronize(stream, OPTIM_INIT_TIMEOUT_MS);
    if (st == MPT_OK) st = sst;
    mpt_stream_free(stream);
  }
done:
  return st;
}

mpt_status mpt_optimizer_init(mpt_optimizer **opt, const mpt_optimizer_config *cfg,
                              mpt_device device, int64_t count) {
  mpt_status st = MPT_OK;
  mpt_optimizer *o = NULL;
  if (!opt) return MPT_FAIL(MPT_EINVAL, "NULL optimizer pointer");
  *opt = NULL;
  MPT_RETURN_IF(mpt_optimizer_config_validate(cfg));
  if (count < 0) return MPT_FAIL(MPT_EINVAL, "optimizer parameter count %lld < 0",
                                 (long long)count);
  if ((uint64_t)count > SIZE_MAX / sizeof(float))
    return MPT_FAIL(MPT_EINVAL, "optimizer parameter count %lld too large", (long long)count);

  o = calloc(1, sizeof *o);
  if (!o) return MPT_FAIL(MPT_ENOMEM, "optimizer handle");
  o->cfg = *cfg;
  o->device = device;
  o->count = count;
  o->nbuffers = state_buffers_for(cfg);
  for (int i = 0; i < o->nbuffers; ++i)
    MPT_CHECK(mpt_device_alloc(device, (size_t)count * sizeof(float), (void **)&o->buffers[i]),
              fail);
  MPT_CHECK(zero_state(o), fail);
  *opt = o;
  return MPT_OK;

fail:
  mpt_optimizer_free(o);
  return st;
}

void mpt_optimizer_free(mpt_optimizer *opt) {
  if (!opt) return;
  for (int i = 0; i < MPT_OPTIM_MAX_STATE; ++i) mpt_device_free(opt->device, opt->buffers[i]);
  free(opt);
}

mpt_status mpt_optimizer_step(mpt_optimizer *opt, mpt_stream *stream, float *param,
                              const float *grad, float lr) {
  mpt_status st;
  if (!opt) return MPT_FAIL(MPT_EINVAL, "NULL optimizer");
  if (!(isfinite(lr) && lr >= 0.0f))
    return MPT_FAIL(MPT_EINVAL, "optimizer step lr must be >= 0 and finite (got %g)",
                    (double)lr);
  if (opt->count > 0 && (!param || !grad))
    return MPT_FAIL(MPT_EINVAL, "optimizer step: NULL %s for %lld parameters",
                    !param ? "param" : "grad", (long long)opt->count);
  mpt_device sd = mpt_stream_device(stream);
  /* CPU "devices" share memory (DP replicas), so only the type must match there. */
  if (sd.type != opt->device.type ||
      (sd.type != MPT_DEVICE_CPU && sd.index != opt->device.index)) {
    char a[32], b[32];
    return MPT_FAIL(MPT_EINVAL, "optimizer on %s stepped on a stream of %s",
                    mpt_device_str(opt->device, a, sizeof a), mpt_device_str(sd, b, sizeof b));
  }

  const mpt_optimizer_config *c = &opt->cfg;
  if (opt->count == 0) {
    st = MPT_OK;
  } else if (c->kind == MPT_OPTIM_SGD) {
    st = mpt_op_sgd_step(stream, param, grad, opt->nbuffers ? opt->buffers[0] : NULL, opt->count,
                         lr, c->momentum, c->dampening, c->weight_decay, c->nesterov ? 1 : 0,
                         opt->step_count == 0);
  } else {
    st = mpt_op_adamw_step(stream, param, grad, opt->buffers[0], opt->buffers[1], opt->count, lr,
                           c->beta1, c->beta2, c->eps, c->weight_decay, opt->step_count + 1);
  }
  if (st == MPT_OK) opt->step_count++;
  return st;
}

const mpt_optimizer_config *mpt_optimizer_get_config(const mpt_optimizer *opt) {
  return opt ? &opt->cfg : NULL;
}

mpt_status mpt_optimizer_get_state(mpt_optimizer *opt, mpt_optimizer_state *state) {
  if (!opt || !state) return MPT_FAIL(MPT_EINVAL, "NULL optimizer or state");
  memset(state, 0, sizeof *state);
  state->nbuffers = opt->nbuffers;
  for (int i = 0; i < opt->nbuffers; ++i) {
    state->names[i] = state_name(opt->cfg.kind, i);
    state->buffers[i] = opt->buffers[i];
  }
  state->count = opt->count;
  state->device = opt->device;
  state->step_count = opt->step_count;
  return MPT_OK;
}

int64_t mpt_optimizer_step_count(const mpt_optimizer *opt) { return opt ? opt->step_count : 0; }

mpt_status mpt_optimizer_set_step_count(mpt_optimizer *opt, int64_t step_count) {
  if (!opt) return MPT_FAIL(MPT_EINVAL, "NULL optimizer");
  if (step_count < 0)
    return MPT_FAIL(MPT_EINVAL, "optimizer step count %lld < 0", (long long)step_count);
  opt->step_count = step_count;
  return MPT_OK;
}

mpt_status mpt_optimizer_step_model(mpt_optimizer *opt, mpt_model *model, mpt_stream *stream,
                                    float lr) {
  if (!opt || !model) return MPT_FAIL(MPT_EINVAL, "optimizer step: NULL optimizer or model");
  if (mpt_model_param_count(model) != opt->count)
    return MPT_FAIL(MPT_EINVAL, "optimizer step: the optimizer holds %lld parameters, the model "
                    "%lld", (long long)opt->count, (long long)mpt_model_param_count(model));
  /* Refuse before touching anything (consume_grads names what is missing); count the
   * gradients as used only once the step succeeded. */
  if (mpt_model_grads_state(model) != MPT_GRADS_READY) return mpt_model_consume_grads(model);
  MPT_RETURN_IF(mpt_optimizer_step(opt, stream, mpt_model_params(model), mpt_model_grads(model),
                                   lr));
  return mpt_model_consume_grads(model);
}
