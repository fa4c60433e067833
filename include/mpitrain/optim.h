/* mpitrain optim: optimizers (SGD with momentum / Nesterov / weight decay, AdamW) over one flat
 * parameter buffer, and learning-rate schedules.
 *
 * The model keeps all its parameters in ONE contiguous float32 buffer and all gradients in
 * another of the same length (every parameter tensor is a view, nn.h "Model"), so an
 * optimizer works on `param[count]` and `grad[count]` and keeps its state (momentum buffer, or
 * AdamW's first and second moments) as flat buffers of the same length on the same device. The
 * arithmetic runs in the device kernels mpt_op_sgd_step / mpt_op_adamw_step (mpitrain/ops.h),
 * enqueued on the stream given to each step; nothing in a step blocks the host.
 *
 * Semantics follow PyTorch 1.13 (torch.optim.SGD, torch.optim.AdamW, torch.optim.lr_scheduler),
 * with the differences listed at each function.
 *
 * Thread rules: an optimizer is used by one thread at a time; different optimizers are
 * independent. mpt_lr_at and the parse/validate helpers are pure and thread-safe. */
#ifndef MPITRAIN_OPTIM_H
#define MPITRAIN_OPTIM_H

#include "mpitrain/core.h"
#include "mpitrain/nn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------------------ */
/* Optimizers                                                                                 */

/* The optimizer kinds (config.kind). */
typedef enum {
  MPT_OPTIM_SGD = 0,   /* torch.optim.SGD */
  MPT_OPTIM_ADAMW = 1, /* torch.optim.AdamW (Loshchilov & Hutter, "Decoupled Weight Decay
                          Regularization", ICLR 2019) */
} mpt_optim_kind;

/* Hyper-parameters. Fields a kind does not use are ignored (not validated) for that kind. */
typedef struct mpt_optimizer_config {
  mpt_optim_kind kind;
  float lr;           /* base learning rate (what a schedule scales); >= 0, finite */
  /* SGD */
  float momentum;     /* >= 0, finite; 0 = plain SGD (no state) */
  float dampening;    /* in [0, 1]; the momentum buffer takes (1 - dampening) * g */
  int nesterov;       /* non-zero: Nesterov momentum; needs momentum > 0 and dampening == 0 */
  /* both */
  float weight_decay; /* >= 0, finite. SGD: L2, g += wd * param. AdamW: decoupled,
                         param *= 1 - lr * wd */
  /* AdamW */
  float beta1, beta2; /* each in [0, 1) */
  float eps;          /* > 0, finite; added to sqrt(v_hat) */
} mpt_optimizer_config;

/* Defaults: kind SGD, lr 0.01, momentum 0, dampening 0, nesterov 0, weight_decay 0,
 * beta1 0.9, beta2 0.999, eps 1e-8 (PyTorch's SGD and AdamW defaults, except that PyTorch's
 * SGD has no default lr and PyTorch's AdamW defaults to lr 1e-3 and weight_decay 0.01: set
 * those yourself when choosing AdamW). */
MPT_API mpt_optimizer_config mpt_optimizer_config_default(void);

/* Checks every field the kind uses against the ranges documented in the struct. Errors:
 * MPT_EINVAL naming the field and its value (e.g. "nesterov momentum requires momentum > 0 and
 * dampening == 0 (got momentum 0, dampening 0)"), also for a NULL cfg or an unknown kind. */
MPT_API mpt_status mpt_optimizer_config_validate(const mpt_optimizer_config *cfg);

/* Parses "sgd" or "adamw" (exact, lower case). Errors: MPT_EINVAL naming the text. */
MPT_API mpt_status mpt_optimizer_kind_parse(const char *text, mpt_optim_kind *kind);
/* "sgd" / "adamw"; "unknown" for a value outside the enum. Never NULL. */
MPT_API const char *mpt_optimizer_kind_name(mpt_optim_kind kind);

/* An optimizer and its state (opaque: mpt_optimizer_init / mpt_optimizer_free). */
typedef struct mpt_optimizer mpt_optimizer;

/* Creates an optimizer for `count` parameters on `device`. Allocates the state with
 * mpt_device_alloc and zeroes it with mpt_op_fill (on a temporary stream of the device, which is
 * synchronized before return, so the state is ready for any stream):
 *   SGD, momentum == 0: no state;  SGD, momentum > 0: momentum_buffer[count];
 *   AdamW: exp_avg[count] (m) and exp_avg_sq[count] (v).
 * count == 0 is allowed (every step is then a no-op that still counts). The step count starts
 * at 0. Errors: MPT_EINVAL (NULL arguments, count < 0, a bad config: see validate), MPT_ENOMEM,
 * MPT_EDEVICE / MPT_ENOTSUP from the device; *opt is NULL on failure. */
MPT_API mpt_status mpt_optimizer_init(mpt_optimizer **opt, const mpt_optimizer_config *cfg,
                                      mpt_device device, int64_t count);
/* A slice [offset, offset + count) of the flat parameter buffer whose optimizer state this
 * optimizer holds (mpt_optimizer_init_ranges). state_offset: where its state starts in the state
 * buffers (filled by the optimizer: the sum of the counts of the ranges before it). */
typedef struct mpt_optim_range {
  int64_t offset, count;
  int64_t state_offset;
} mpt_optim_range;

/* A sharded optimizer (ZeRO-1, Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training
 * Trillion Parameter Models", SC 2020; the DDP engine makes one: ddp.h
 * mpt_ddp_optimizer_init): it steps the `count` parameters of a flat buffer, but holds state
 * and updates only the elements of `ranges` (sorted by offset, disjoint, inside [0, count);
 * state_offset is ignored on input). The state buffers hold the ranges' elements one after the
 * other: sum of the counts, not `count` (mpt_optimizer_state.count says so). A step reads and
 * writes param and grad only inside the ranges; groups (mpt_optimizer_set_groups) still refer
 * to offsets of the whole buffer, so a range may cut a group or a parameter anywhere. nranges 0
 * (ranges NULL) is mpt_optimizer_init. Checkpoints (ckpt.h) refuse a sharded optimizer: gather
 * it first (mpt_ddp_optimizer_gather). Errors: those of mpt_optimizer_init; MPT_EINVAL naming a
 * range that is outside [0, count), overlaps or precedes the one before it. */
MPT_API mpt_status mpt_optimizer_init_ranges(mpt_optimizer **opt, const mpt_optimizer_config *cfg,
                                             mpt_device device, int64_t count,
                                             const mpt_optim_range *ranges, int nranges);
/* Number of ranges (0: an optimizer of the whole buffer) and range i (NULL out of range). */
MPT_API int mpt_optimizer_num_ranges(const mpt_optimizer *opt);
MPT_API const mpt_optim_range *mpt_optimizer_range(const mpt_optimizer *opt, int i);

/* Frees the state and the handle. NULL is a no-op. The caller makes sure no step is still
 * running on a stream (synchronize it first). */
MPT_API void mpt_optimizer_free(mpt_optimizer *opt);

/* One optimizer step with learning rate `lr` (normally mpt_lr_at(schedule, cfg.lr, step count)),
 * enqueued on `stream` (NULL = the CPU, run now; otherwise a stream of the optimizer's device:
 * the same type, and for CUDA the same ordinal; CPU replicas share memory, so any CPU stream).
 * param[count] is updated in place from grad[count]; both are on the optimizer's device. On
 * success the step count goes up by one.
 *   SGD   (torch.optim.SGD): g = grad + wd*param; with momentum: buf = g on the first step
 *         (step count 0), else buf = momentum*buf + (1-dampening)*g; g = nesterov ? g +
 *         momentum*buf : buf; param -= lr*g.
 *   AdamW (torch.optim.AdamW, amsgrad off): t = step count + 1; param *= 1 - lr*wd;
 *         m = beta1 m + (1-beta1) g; v = beta2 v + (1-beta2) g^2;
 *         param -= lr * (m / (1-beta1^t)) / (sqrt(v / (1-beta2^t)) + eps).
 * Errors: MPT_EINVAL (NULL opt, NULL param/grad with count > 0, lr negative or not finite, a
 * stream of another device), or the kernel's status; the step count is unchanged then. */
MPT_API mpt_status mpt_optimizer_step(mpt_optimizer *opt, mpt_stream *stream, float *param,
                                      const float *grad, float lr);

/* The step of a training loop: mpt_optimizer_step on the model's flat parameters with its flat
 * gradients, after checking that they are complete and unused (mpt_model_consume_grads: a
 * forward without backward, a backward left out, or a second step on the same gradients is
 * MPT_ESTATE naming it, and nothing is changed). The optimizer must have been created for
 * mpt_model_param_count(model) parameters on the model's device. `stream`: as for
 * mpt_optimizer_step. Errors: those of both, MPT_EINVAL (NULL, or a count that differs). */
MPT_API mpt_status mpt_optimizer_step_model(mpt_optimizer *opt, mpt_model *model,
                                            mpt_stream *stream, float lr);

/* The configuration the optimizer was created with (never NULL for a valid opt). */
MPT_API const mpt_optimizer_config *mpt_optimizer_get_config(const mpt_optimizer *opt);

/* ---- State, for checkpoints ----
 * The state is `nbuffers` flat float32 buffers of `count` elements each on `device`, plus the
 * step count (number of successful steps). Save: read the buffers (mpt_op_memcpy to the host,
 * after synchronizing the step stream) and the step count. Restore into a fresh optimizer made
 * with the same config and count: copy the buffers in, then mpt_optimizer_set_step_count.
 * Names are PyTorch's state keys, so a checkpoint reads like a torch state_dict. */
#define MPT_OPTIM_MAX_STATE 2

/* A view of an optimizer's state (mpt_optimizer_get_state). */
typedef struct mpt_optimizer_state {
  int nbuffers;                            /* 0 (plain SGD), 1 (SGD momentum), 2 (AdamW) */
  const char *names[MPT_OPTIM_MAX_STATE];  /* "momentum_buffer"; or "exp_avg", "exp_avg_sq" */
  float *buffers[MPT_OPTIM_MAX_STATE];     /* each [count] on `device`; NULL when count == 0 */
  int64_t count; /* parameters; a sharded optimizer (mpt_optimizer_init_ranges): its ranges' */
  mpt_device device;
  int64_t step_count;
} mpt_optimizer_state;

/* Fills *state with the optimizer's buffers (owned by the optimizer; valid until
 * mpt_optimizer_free; unused slots NULL) and step count. Writing into the buffers changes the
 * optimizer's state. Errors: MPT_EINVAL on NULL arguments. */
MPT_API mpt_status mpt_optimizer_get_state(mpt_optimizer *opt, mpt_optimizer_state *state);
/* Number of successful steps so far. */
MPT_API int64_t mpt_optimizer_step_count(const mpt_optimizer *opt);
/* Sets the step count (after restoring the buffers from a checkpoint). SGD with momentum
 * treats step count 0 as "buffer not yet initialised" (the next step copies g into it, as
 * PyTorch does when its buffer is None); AdamW uses it for bias correction (t = count + 1).
 * Errors: MPT_EINVAL on NULL opt or step_count < 0. */
MPT_API mpt_status mpt_optimizer_set_step_count(mpt_optimizer *opt, int64_t step_count);

/* ------------------------------------------------------------------------------------------ */
/* Parameter groups                                                                           */

/* Per-group hyper-parameters over slices of the flat buffer, as PyTorch's param_groups: the
 * usual use is to decay weight matrices and kernels but not biases and normalisation
 * parameters (llm.c's AdamW decays only the 2-D tensors; so does nanoGPT's configure_optimizers).
 * A group is the slice [offset, offset + count) of the optimizer's flat buffer (a parameter of
 * an mpt_model is such a slice: mpt_param_info's offset and count), with its own weight decay
 * and a factor on the learning rate. Elements in no group use the config's weight_decay and
 * the step's lr, so an optimizer without groups behaves exactly as before. Groups are
 * configuration, not state: a checkpoint holds the state buffers and step count only, and a
 * resumed run sets the same groups again (mpt_optimizer_set_groups before or after restoring
 * the state: the state layout does not depend on groups). */
typedef struct mpt_param_group {
  int64_t offset;     /* first element of the slice, >= 0 */
  int64_t count;      /* elements, >= 0; offset + count <= the optimizer's count */
  float weight_decay; /* >= 0, finite: replaces the config's weight_decay in this slice */
  float lr_scale;     /* >= 0, finite: this slice steps with lr * lr_scale (also in AdamW's
                         decoupled decay, param *= 1 - lr * lr_scale * weight_decay) */
} mpt_param_group;

/* Sets the optimizer's groups (copied; ngroups 0 removes them all). Groups must not overlap;
 * they need not be sorted nor cover the whole buffer. A step then runs the kernel once per
 * maximal run of elements with the same settings, in offset order, on the same stream.
 * Errors: MPT_EINVAL naming the group (NULL opt, NULL groups with ngroups > 0, ngroups < 0, a
 * slice outside [0, count), two overlapping groups, a bad weight_decay or lr_scale); the
 * previous groups stay then. MPT_ENOMEM. */
MPT_API mpt_status mpt_optimizer_set_groups(mpt_optimizer *opt, const mpt_param_group *groups,
                                            int ngroups);
/* Number of groups set, and group i as given (NULL when out of range). */
MPT_API int mpt_optimizer_num_groups(const mpt_optimizer *opt);
MPT_API const mpt_param_group *mpt_optimizer_group(const mpt_optimizer *opt, int i);

/* The usual split of a model's parameters: those with ndim >= 2 (Linear weights [out, in],
 * Conv2d kernels [O, C, kh, kw]) decay with `weight_decay`, those with ndim < 2 (biases,
 * BatchNorm/LayerNorm weight and bias) do not; lr_scale 1 everywhere. Consecutive parameters
 * with the same decision are merged into one group, so the groups cover the flat buffer
 * [0, mpt_model_param_count) exactly, in order. *ngroups receives the number of groups the
 * split needs; `groups` (may be NULL to ask only that) receives them when max_groups is
 * enough. Pass the result to mpt_optimizer_set_groups. Errors: MPT_EINVAL (NULL model or
 * ngroups, weight_decay negative or not finite, groups non-NULL and max_groups smaller than
 * the number needed: the message says how many). */
MPT_API mpt_status mpt_param_groups_split_decay(const mpt_model *model, float weight_decay,
                                                mpt_param_group *groups, int max_groups,
                                                int *ngroups);

/* ------------------------------------------------------------------------------------------ */
/* Learning-rate schedules                                                                    */

/* The main learning-rate schedules (mpt_lr_schedule.kind). */
typedef enum {
  MPT_LR_CONSTANT = 0, /* lr = base_lr */
  MPT_LR_STEP = 1,     /* torch StepLR: base_lr * gamma^floor(t / step_size) */
  MPT_LR_COSINE = 2,   /* torch CosineAnnealingLR, held at min_lr after its end */
} mpt_lr_kind;

/* A schedule: a main schedule, optionally preceded by a linear warm-up. Plain data, no state.
 *
 * Let W = warmup_steps, s = warmup_start_factor, k = the step count (number of optimizer steps
 * already taken; the lr for the first step is at k = 0). Then
 *   k <  W:  lr = base_lr * (s + (1 - s) * k / W)       (torch LinearLR(start_factor = s,
 *                                                        end_factor = 1, total_iters = W))
 *   k >= W:  lr = main(t) with t = k - W                (the main schedule starts at its own
 *                                                        step 0 when the warm-up ends)
 * which is torch SequentialLR([LinearLR, main], milestones = [W]) with scheduler.step() called
 * once after every optimizer step. The main schedules, at t >= 0:
 *   constant: base_lr
 *   step:     base_lr * gamma^floor(t / step_size)
 *   cosine:   T = total_steps - W (the cosine spans the steps after the warm-up, so the whole
 *             schedule lasts total_steps and reaches min_lr at k == total_steps);
 *             t <  T: min_lr + (base_lr - min_lr) * (1 + cos(pi * t / T)) / 2
 *             t >= T: min_lr   (PyTorch's closed form would rise again; we hold the minimum)
 * Differences from PyTorch: s = 0 is allowed (LinearLR rejects it); the cosine is held at
 * min_lr past its end; values are computed in closed form in double, not recursively. */
typedef struct mpt_lr_schedule {
  mpt_lr_kind kind;
  int64_t step_size;         /* step: steps per decay, >= 1 */
  float gamma;               /* step: decay factor, > 0, finite */
  int64_t total_steps;       /* cosine: length of warm-up + cosine, > warmup_steps */
  float min_lr;              /* cosine: final lr (absolute, like eta_min), >= 0, finite */
  int64_t warmup_steps;      /* >= 0; 0 = no warm-up */
  float warmup_start_factor; /* in [0, 1]: the lr at step 0 is this times base_lr */
} mpt_lr_schedule;

/* Defaults: constant, step_size 1, gamma 0.1, total_steps 1, min_lr 0, no warm-up
 * (warmup_steps 0, warmup_start_factor 1/3, PyTorch LinearLR's default). */
MPT_API mpt_lr_schedule mpt_lr_schedule_default(void);

/* Checks the fields the kind uses, and the warm-up fields. Errors: MPT_EINVAL naming the field
 * and value, also for NULL s or an unknown kind. */
MPT_API mpt_status mpt_lr_schedule_validate(const mpt_lr_schedule *s);

/* The learning rate for the optimizer step taken after `step` steps (see the formulas above).
 * Pure; computed in double, rounded to float once. A negative step is treated as 0. `s` should
 * have passed mpt_lr_schedule_validate; otherwise it never crashes or divides by zero: NULL s
 * gives base_lr, a warm-up factor outside [0, 1] means no warm-up scaling, a step schedule with
 * step_size < 1 does not decay, a cosine with total_steps <= warmup_steps is min_lr after the
 * warm-up. */
MPT_API float mpt_lr_at(const mpt_lr_schedule *s, float base_lr, int64_t step);

/* Parses "constant", "step" or "cosine". Errors: MPT_EINVAL naming the text. */
MPT_API mpt_status mpt_lr_kind_parse(const char *text, mpt_lr_kind *kind);
/* "constant" / "step" / "cosine"; "unknown" outside the enum. Never NULL. */
MPT_API const char *mpt_lr_kind_name(mpt_lr_kind kind);

/* ------------------------------------------------------------------------------------------ */
/* Gradient clipping                                                                          */

/* Clips the model's gradients by their global L2 norm, as torch.nn.utils.clip_grad_norm_
 * (norm_type 2) over all parameters: total = ||flat gradient buffer||_2; when
 * max_norm / (total + 1e-6) < 1 every gradient is multiplied by that factor. *total_norm (may
 * be NULL) receives total, before clipping. Under DDP call it after backward, on the averaged
 * gradients: every rank then computes the same norm and applies the same scale, as llm.c and
 * PyTorch DDP do. A non-finite norm is returned and nothing is scaled (the caller skips the
 * step). CPU: the sum of squares in double, on the calling thread (stream may be NULL). Other
 * devices: `stream` (a stream of the model's device) carries a GEMM dot product and the scale,
 * and is synchronised to read the norm. Errors: MPT_EINVAL (NULL model, max_norm not > 0 (NaN
 * included), no stream off the CPU), MPT_ESTATE (not finalised), device errors. */
MPT_API mpt_status mpt_clip_grad_norm(mpt_model *model, mpt_stream *stream, float max_norm,
                                      float *total_norm);

#ifdef __cplusplus
}
#endif

#endif /* MPITRAIN_OPTIM_H */
