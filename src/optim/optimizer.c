/* Optimizers over one flat parameter buffer: SGD (momentum, dampening, Nesterov, L2 weight decay)
 * and AdamW, as declared in include/mpitrain/optim.h.
 *
 * Invariants: the state buffers exist exactly when the kind needs them (SGD with momentum > 0:
 * one; AdamW: two), hold `count` floats on `device`, and are zero until the first step; the
 * config was validated at init and never changes; step_count counts the steps whose kernel
 * returned MPT_OK. The arithmetic is in the device kernels (mpt_op_sgd_step,
 * mpt_op_adamw_step); this file keeps the state and the step count, and runs on the caller's
 * thread, enqueuing on the stream it is given.
 * Groups (mpt_optimizer_set_groups) are kept as given and as `segs`: a partition of [0, count)
 * into runs sorted by offset, adjacent runs with equal settings merged, elements outside every
 * group carrying the config's weight_decay and lr_scale 1. The kernels are elementwise, so a
 * step over the runs equals one step over the buffer with per-element settings.
 * Ranges (mpt_optimizer_init_ranges, ZeRO-1): the state covers only the elements of `ranges`,
 * sorted by offset and disjoint, stored one after the other (state_count elements); a step
 * intersects each run with each range, so elements outside every range are never read or
 * written. Without ranges, nranges is 0 and state_count == count. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mpitrain/core.h"
#include "mpitrain/ops.h"
#include "mpitrain/optim.h"

/* How long init waits for the zero fill of the state on a device stream. */
#define OPTIM_INIT_TIMEOUT_MS 60000.0

struct mpt_optimizer {
  mpt_optimizer_config cfg;
  mpt_device device;
  int64_t count;
  int64_t state_count;                 /* elements of each state buffer */
  int nranges;                         /* 0: the whole buffer */
  mpt_optim_range *ranges;             /* [nranges] sorted, disjoint; state_offset filled */
  int nbuffers;
  float *buffers[MPT_OPTIM_MAX_STATE]; /* each [state_count] on device; see the state names */
  int64_t step_count;
  int ngroups;
  mpt_param_group *groups; /* [ngroups] as given */
  int nsegs;               /* 0 without groups */
  mpt_param_group *segs;   /* [nsegs] the partition of [0, count) the step walks */
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
  if (o->nbuffers == 0 || o->state_count == 0) return MPT_OK;
  if (o->device.type != MPT_DEVICE_CPU) MPT_CHECK(mpt_stream_init(&stream, o->device,
                                                                  MPT_STREAM_INLINE), done);
  for (int i = 0; i < o->nbuffers; ++i)
    MPT_CHECK(mpt_op_fill(stream, o->buffers[i], o->state_count, 0.0f), sync);
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
  return mpt_optimizer_init_ranges(opt, cfg, device, count, NULL, 0);
}

/* Ranges sorted by offset, disjoint, inside [0, count); *total receives their elements. */
static mpt_status check_ranges(const mpt_optim_range *ranges, int nranges, int64_t count,
                               int64_t *total) {
  int64_t end = 0;
  *total = 0;
  if (nranges < 0 || (nranges > 0 && !ranges))
    return MPT_FAIL(MPT_EINVAL, "optimizer ranges: %d ranges at %p", nranges,
                    (const void *)ranges);
  for (int i = 0; i < nranges; ++i) {
    const mpt_optim_range *r = &ranges[i];
    if (r->offset < end || r->count < 0 || r->offset > count - r->count)
      return MPT_FAIL(MPT_EINVAL, "optimizer range %d: [%lld, %lld + %lld) is outside the %lld "
                      "parameters or not after the previous range (ranges must be sorted and "
                      "disjoint)", i, (long long)r->offset, (long long)r->offset,
                      (long long)r->count, (long long)count);
    end = r->offset + r->count;
    *total += r->count;
  }
  return MPT_OK;
}

mpt_status mpt_optimizer_init_ranges(mpt_optimizer **opt, const mpt_optimizer_config *cfg,
                                     mpt_device device, int64_t count,
                                     const mpt_optim_range *ranges, int nranges) {
  mpt_status st = MPT_OK;
  mpt_optimizer *o = NULL;
  int64_t total = count;
  if (!opt) return MPT_FAIL(MPT_EINVAL, "NULL optimizer pointer");
  *opt = NULL;
  MPT_RETURN_IF(mpt_optimizer_config_validate(cfg));
  if (count < 0) return MPT_FAIL(MPT_EINVAL, "optimizer parameter count %lld < 0",
                                 (long long)count);
  if ((uint64_t)count > SIZE_MAX / sizeof(float))
    return MPT_FAIL(MPT_EINVAL, "optimizer parameter count %lld too large", (long long)count);
  if (ranges || nranges) MPT_RETURN_IF(check_ranges(ranges, nranges, count, &total));

  o = calloc(1, sizeof *o);
  if (!o) return MPT_FAIL(MPT_ENOMEM, "optimizer handle");
  o->cfg = *cfg;
  o->device = device;
  o->count = count;
  o->state_count = total;
  if (nranges > 0) {
    o->ranges = malloc((size_t)nranges * sizeof *o->ranges);
    if (!o->ranges) {
      st = MPT_FAIL(MPT_ENOMEM, "optimizer ranges");
      goto fail;
    }
    int64_t at = 0;
    for (int i = 0; i < nranges; ++i) {
      o->ranges[i] = ranges[i];
      o->ranges[i].state_offset = at;
      at += ranges[i].count;
    }
    o->nranges = nranges;
  }
  o->nbuffers = state_buffers_for(cfg);
  for (int i = 0; i < o->nbuffers; ++i)
    MPT_CHECK(mpt_device_alloc(device, (size_t)total * sizeof(float), (void **)&o->buffers[i]),
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
  free(opt->groups);
  free(opt->segs);
  free(opt->ranges);
  free(opt);
}

/* The step's kernel over elements [off, off + n) with learning rate lr and weight decay wd; their
 * state starts at element soff of the state buffers. */
static mpt_status step_kernel(mpt_optimizer *opt, mpt_stream *stream, float *param,
                              const float *grad, int64_t off, int64_t soff, int64_t n, float lr,
                              float wd) {
  const mpt_optimizer_config *c = &opt->cfg;
  if (n == 0) return MPT_OK;
  if (c->kind == MPT_OPTIM_SGD)
    return mpt_op_sgd_step(stream, param + off, grad + off,
                           opt->nbuffers ? opt->buffers[0] + soff : NULL, n, lr, c->momentum,
                           c->dampening, wd, c->nesterov ? 1 : 0, opt->step_count == 0);
  return mpt_op_adamw_step(stream, param + off, grad + off, opt->buffers[0] + soff,
                           opt->buffers[1] + soff, n, lr, c->beta1, c->beta2, c->eps, wd,
                           opt->step_count + 1);
}

/* The run [off, off + n): whole, or its intersection with each range. */
static mpt_status step_slice(mpt_optimizer *opt, mpt_stream *stream, float *param,
                             const float *grad, int64_t off, int64_t n, float lr, float wd) {
  if (opt->nranges == 0) return step_kernel(opt, stream, param, grad, off, off, n, lr, wd);
  for (int i = 0; i < opt->nranges; ++i) {
    const mpt_optim_range *r = &opt->ranges[i];
    int64_t lo = off > r->offset ? off : r->offset;
    int64_t hi = off + n < r->offset + r->count ? off + n : r->offset + r->count;
    if (hi <= lo) continue;
    MPT_RETURN_IF(step_kernel(opt, stream, param, grad, lo, r->state_offset + (lo - r->offset),
                              hi - lo, lr, wd));
  }
  return MPT_OK;
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

  if (opt->nsegs == 0) {
    st = step_slice(opt, stream, param, grad, 0, opt->count, lr, opt->cfg.weight_decay);
  } else {
    st = MPT_OK;
    for (int i = 0; i < opt->nsegs && st == MPT_OK; ++i) {
      const mpt_param_group *g = &opt->segs[i];
      st = step_slice(opt, stream, param, grad, g->offset, g->count, lr * g->lr_scale,
                      g->weight_decay);
    }
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
  state->count = opt->state_count;
  state->device = opt->device;
  state->step_count = opt->step_count;
  return MPT_OK;
}

int mpt_optimizer_num_ranges(const mpt_optimizer *opt) { return opt ? opt->nranges : 0; }

const mpt_optim_range *mpt_optimizer_range(const mpt_optimizer *opt, int i) {
  if (!opt || i < 0 || i >= opt->nranges) return NULL;
  return &opt->ranges[i];
}

int64_t mpt_optimizer_step_count(const mpt_optimizer *opt) { return opt ? opt->step_count : 0; }

mpt_status mpt_optimizer_set_step_count(mpt_optimizer *opt, int64_t step_count) {
  if (!opt) return MPT_FAIL(MPT_EINVAL, "NULL optimizer");
  if (step_count < 0)
    return MPT_FAIL(MPT_EINVAL, "optimizer step count %lld < 0", (long long)step_count);
  opt->step_count = step_count;
  return MPT_OK;
}

/* ---- Parameter groups ---- */

static int by_offset(const void *a, const void *b) {
  const mpt_param_group *x = a, *y = b;
  return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* Appends the run [off, off + n) with settings (wd, scale), merged into the previous run when
 * they are adjacent with equal settings. */
static void push_seg(mpt_param_group *segs, int *nsegs, int64_t off, int64_t n, float wd,
                     float scale) {
  if (n == 0) return;
  mpt_param_group *last = *nsegs ? &segs[*nsegs - 1] : NULL;
  if (last && last->offset + last->count == off && last->weight_decay == wd &&
      last->lr_scale == scale) {
    last->count += n;
    return;
  }
  segs[(*nsegs)++] = (mpt_param_group){off, n, wd, scale};
}

mpt_status mpt_optimizer_set_groups(mpt_optimizer *opt, const mpt_param_group *groups,
                                    int ngroups) {
  mpt_status st = MPT_OK;
  mpt_param_group *copy = NULL, *sorted = NULL, *segs = NULL;
  int nsegs = 0;
  if (!opt) return MPT_FAIL(MPT_EINVAL, "NULL optimizer");
  if (ngroups < 0 || (ngroups > 0 && !groups))
    return MPT_FAIL(MPT_EINVAL, "optimizer groups: %d groups at %p", ngroups,
                    (const void *)groups);
  for (int i = 0; i < ngroups; ++i) {
    const mpt_param_group *g = &groups[i];
    if (g->offset < 0 || g->count < 0 || g->offset > opt->count - g->count)
      return MPT_FAIL(MPT_EINVAL,
                      "optimizer group %d: slice [%lld, %lld + %lld) is outside the %lld "
                      "parameters", i, (long long)g->offset, (long long)g->offset,
                      (long long)g->count, (long long)opt->count);
    if (!(isfinite(g->weight_decay) && g->weight_decay >= 0.0f))
      return MPT_FAIL(MPT_EINVAL, "optimizer group %d: weight_decay must be >= 0 and finite "
                      "(got %g)", i, (double)g->weight_decay);
    if (!(isfinite(g->lr_scale) && g->lr_scale >= 0.0f))
      return MPT_FAIL(MPT_EINVAL, "optimizer group %d: lr_scale must be >= 0 and finite (got "
                      "%g)", i, (double)g->lr_scale);
  }
  if (ngroups > 0) {
    copy = malloc((size_t)ngroups * sizeof *copy);
    sorted = malloc((size_t)ngroups * sizeof *sorted);
    segs = malloc((size_t)(2 * ngroups + 1) * sizeof *segs);
    if (!copy || !sorted || !segs) {
      st = MPT_FAIL(MPT_ENOMEM, "optimizer groups: %d groups", ngroups);
      goto fail;
    }
    memcpy(copy, groups, (size_t)ngroups * sizeof *copy);
    memcpy(sorted, groups, (size_t)ngroups * sizeof *sorted);
    qsort(sorted, (size_t)ngroups, sizeof *sorted, by_offset);
    int64_t at = 0; /* end of the previous group */
    for (int i = 0; i < ngroups; ++i) {
      const mpt_param_group *g = &sorted[i];
      if (g->count == 0) continue;
      if (g->offset < at) {
        st = MPT_FAIL(MPT_EINVAL, "optimizer groups overlap: the slice at offset %lld (%lld "
                      "elements) starts before the end of another at %lld", (long long)g->offset,
                      (long long)g->count, (long long)at);
        goto fail;
      }
      push_seg(segs, &nsegs, at, g->offset - at, opt->cfg.weight_decay, 1.0f);
      push_seg(segs, &nsegs, g->offset, g->count, g->weight_decay, g->lr_scale);
      at = g->offset + g->count;
    }
    push_seg(segs, &nsegs, at, opt->count - at, opt->cfg.weight_decay, 1.0f);
  }
  free(sorted);
  free(opt->groups);
  free(opt->segs);
  opt->groups = copy;
  opt->ngroups = ngroups;
  opt->segs = nsegs ? segs : NULL;
  opt->nsegs = nsegs;
  if (!nsegs) free(segs);
  return MPT_OK;
fail:
  free(copy);
  free(sorted);
  free(segs);
  return st;
}

int mpt_optimizer_num_groups(const mpt_optimizer *opt) { return opt ? opt->ngroups : 0; }

const mpt_param_group *mpt_optimizer_group(const mpt_optimizer *opt, int i) {
  if (!opt || i < 0 || i >= opt->ngroups) return NULL;
  return &opt->groups[i];
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
