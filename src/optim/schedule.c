/* Learning-rate schedules (include/mpitrain/optim.h): constant, step and cosine main schedules
 * after an optional linear warm-up, composed like torch SequentialLR([LinearLR, main], [W]).
 *
 * Everything here is a pure function of its arguments, computed in closed form in double and
 * rounded to float once at the end; no state, safe from any thread. mpt_lr_at never divides by
 * zero, even for a schedule that failed validation. */
#include <math.h>
#include <string.h>

#include "mpitrain/core.h"
#include "mpitrain/optim.h"

#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif

mpt_lr_schedule mpt_lr_schedule_default(void) {
  mpt_lr_schedule s;
  memset(&s, 0, sizeof s);
  s.kind = MPT_LR_CONSTANT;
  s.step_size = 1;
  s.gamma = 0.1f;
  s.total_steps = 1;
  s.min_lr = 0.0f;
  s.warmup_steps = 0;
  s.warmup_start_factor = 1.0f / 3.0f;
  return s;
}

mpt_status mpt_lr_schedule_validate(const mpt_lr_schedule *s) {
  if (!s) return MPT_FAIL(MPT_EINVAL, "NULL lr schedule");
  if (s->warmup_steps < 0)
    return MPT_FAIL(MPT_EINVAL, "lr warmup_steps must be >= 0 (got %lld)",
                    (long long)s->warmup_steps);
  if (s->warmup_steps > 0 && !(isfinite(s->warmup_start_factor) &&
                               s->warmup_start_factor >= 0.0f && s->warmup_start_factor <= 1.0f))
    return MPT_FAIL(MPT_EINVAL, "lr warmup_start_factor must be in [0, 1] (got %g)",
                    (double)s->warmup_start_factor);
  switch (s->kind) {
    case MPT_LR_CONSTANT:
      return MPT_OK;
    case MPT_LR_STEP:
      if (s->step_size < 1)
        return MPT_FAIL(MPT_EINVAL, "step lr schedule: step_size must be >= 1 (got %lld)",
                        (long long)s->step_size);
      if (!(isfinite(s->gamma) && s->gamma > 0.0f))
        return MPT_FAIL(MPT_EINVAL, "step lr schedule: gamma must be > 0 and finite (got %g)",
                        (double)s->gamma);
      return MPT_OK;
    case MPT_LR_COSINE:
      if (s->total_steps <= s->warmup_steps)
        return MPT_FAIL(MPT_EINVAL,
                        "cosine lr schedule: total_steps (%lld) must exceed warmup_steps (%lld)",
                        (long long)s->total_steps, (long long)s->warmup_steps);
      if (!(isfinite(s->min_lr) && s->min_lr >= 0.0f))
        return MPT_FAIL(MPT_EINVAL, "cosine lr schedule: min_lr must be >= 0 and finite (got %g)",
                        (double)s->min_lr);
      return MPT_OK;
  }
  return MPT_FAIL(MPT_EINVAL, "unknown lr schedule kind %d (expected constant, step or cosine)",
                  (int)s->kind);
}

/* The main schedule at its own step t >= 0 (counted from the end of the warm-up). */
static double main_lr(const mpt_lr_schedule *s, double base, int64_t t) {
  switch (s->kind) {
    case MPT_LR_CONSTANT:
      return base;
    case MPT_LR_STEP:
      if (s->step_size < 1) return base;
      return base * pow((double)s->gamma, (double)(t / s->step_size));
    case MPT_LR_COSINE: {
      int64_t span = s->total_steps - s->warmup_steps;
      double lo = (double)s->min_lr;
      if (t >= span) return lo; /* also covers span <= 0: no division below */
      return lo + (base - lo) * (1.0 + cos(M_PI * (double)t / (double)span)) / 2.0;
    }
  }
  return base;
}

float mpt_lr_at(const mpt_lr_schedule *s, float base_lr, int64_t step) {
  if (!s) return base_lr;
  if (step < 0) step = 0;
  double base = (double)base_lr;
  int64_t w = s->warmup_steps > 0 ? s->warmup_steps : 0;
  if (step < w) {
    double f0 = (double)s->warmup_start_factor;
    if (!(f0 >= 0.0 && f0 <= 1.0)) f0 = 1.0; /* invalid (or NaN): no warm-up scaling */
    return (float)(base * (f0 + (1.0 - f0) * (double)step / (double)w));
  }
  return (float)main_lr(s, base, step - w);
}

mpt_status mpt_lr_kind_parse(const char *text, mpt_lr_kind *kind) {
  if (!text || !kind) return MPT_FAIL(MPT_EINVAL, "no lr schedule name given");
  if (strcmp(text, "constant") == 0) {
    *kind = MPT_LR_CONSTANT;
  } else if (strcmp(text, "step") == 0) {
    *kind = MPT_LR_STEP;
  } else if (strcmp(text, "cosine") == 0) {
    *kind = MPT_LR_COSINE;
  } else {
    return MPT_FAIL(MPT_EINVAL, "unknown lr schedule '%s' (expected constant, step or cosine)",
                    text);
  }
  return MPT_OK;
}

const char *mpt_lr_kind_name(mpt_lr_kind kind) {
  switch (kind) {
    case MPT_LR_CONSTANT:
      return "constant";
    case MPT_LR_STEP:
      return "step";
    case MPT_LR_COSINE:
      return "cosine";
  }
  return "unknown";
}
