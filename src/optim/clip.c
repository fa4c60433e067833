/* Gradient clipping by the global L2 norm of a model's flat gradient buffer
 * (mpt_clip_grad_norm, optim.h), as torch.nn.utils.clip_grad_norm_ with norm_type 2.
 *
 * The norm: on the CPU a double sum of squares over the buffer (precise and the same on every
 * rank for the same gradients), as 16 lane-wise partial sums added in order at the end (a
 * loop that vectorises, with AVX-512 / AVX2 clones; the same bits at every width); on another
 * device one GEMM of the buffer as a [1, N] row with
 * itself as an [N, 1] column into a float of device memory, copied back (the stream is
 * synchronised). The scale is mpt_op_scale on the stream. */
#include <math.h>

#include "mpitrain/nn.h"
#include "mpitrain/ops.h"
#include "mpitrain/optim.h"

#define CLIP_EPS 1e-6
#define CLIP_SYNC_TIMEOUT_MS 600000.0

/* ||x||_2 of `count` floats on `device`, with `stream` a stream of it (or NULL on the CPU). */
static mpt_status l2_norm(mpt_stream *stream, mpt_device device, const float *x, int64_t count,
                          double *norm) {
  if (device.type == MPT_DEVICE_CPU) {
    *norm = sqrt(mpt_cpu_sum_squares(x, count));
    return MPT_OK;
  }
  if (!stream)
    return MPT_FAIL(MPT_EINVAL, "clip_grad_norm: the model is not on the CPU: give a stream of "
                    "its device");
  mpt_status st = MPT_OK;
  float *dot = NULL, host = 0;
  MPT_RETURN_IF(mpt_device_alloc(device, sizeof *dot, (void **)&dot));
  MPT_CHECK(mpt_op_gemm(stream, 0, 0, 1, 1, count, 1.0f, x, count, x, 1, 0.0f, dot, 1), done);
  MPT_CHECK(mpt_op_memcpy(stream, mpt_device_cpu(), &host, device, dot, sizeof host), done);
  MPT_CHECK(mpt_stream_synchronize(stream, CLIP_SYNC_TIMEOUT_MS), done);
  *norm = sqrt((double)host);
done:
  mpt_device_free(device, dot);
  return st;
}

mpt_status mpt_clip_grad_norm(mpt_model *model, mpt_stream *stream, float max_norm,
                              float *total_norm) {
  if (!model) return MPT_FAIL(MPT_EINVAL, "clip_grad_norm: NULL model");
  if (!(max_norm > 0.0f))
    return MPT_FAIL(MPT_EINVAL, "clip_grad_norm: max_norm = %g must be > 0", (double)max_norm);
  const int64_t count = mpt_model_param_count(model);
  float *g = mpt_model_grads(model);
  double norm = 0;
  if (count > 0 && !g) return MPT_FAIL(MPT_ESTATE, "clip_grad_norm: the model is not finalised");
  if (count > 0) MPT_RETURN_IF(l2_norm(stream, mpt_model_device(model), g, count, &norm));
  if (total_norm) *total_norm = (float)norm;
  if (!isfinite(norm)) return MPT_OK; /* the caller decides (skip the step) */
  const double coef = (double)max_norm / (norm + CLIP_EPS);
  if (coef < 1.0) MPT_RETURN_IF(mpt_op_scale(stream, g, count, (float)coef));
  return MPT_OK;
}
