/* CUDA kernels for the optimizer steps over flat float buffers, with their extern "C"
 * launchers (kernels.h): PyTorch 1.13's torch.optim.SGD and torch.optim.AdamW (Loshchilov &
 * Hutter, 2019), element for element the formulas of src/core/cpu/optim_cpu.c (AdamW's element
 * is src/core/kernel_math.h's, which both read). The scalars derived from hyper-parameters (bias
 * corrections) arrive precomputed by the caller, rounded as the CPU rounds them. Enqueued on the
 * caller's stream. */
#include "core/cuda/kernels_common.cuh"

/* The options are uniform across the grid, so the branches do not diverge. */
__global__ void k_sgd_step(float *param, const float *grad, float *buf, int64_t n, float lr,
                           float momentum, float damp, float weight_decay, int nesterov,
                           int first) {
  MPT_CUK_FOR(i, n) {
    float d = grad[i];
    if (weight_decay != 0.0f) d = d + weight_decay * param[i];
    if (momentum != 0.0f) {
      const float b = first ? d : momentum * buf[i] + damp * d;
      buf[i] = b;
      d = nesterov ? d + momentum * b : b;
    }
    param[i] = param[i] - lr * d;
  }
}

__global__ void k_adamw_step(float *param, const float *grad, float *m, float *v, int64_t n,
                             float decay, float step_size, float bc2_sqrt, float beta1,
                             float beta2, float b1c, float b2c, float eps) {
  MPT_CUK_FOR(i, n) {
    param[i] = mpt__adamw_element(param[i] * decay, grad[i], &m[i], &v[i], beta1, b1c, beta2, b2c,
                                  bc2_sqrt, eps, step_size);
  }
}

static unsigned grid_of(int64_t n) { return mpt_cuk_grid(n, MPT_CUK_BLOCK, MPT_CUK_MAX_GRID); }

extern "C" {

cudaError_t mpt__cuk_sgd_step(cudaStream_t s, float *param, const float *grad,
                              float *momentum_buf, int64_t n, float lr, float momentum,
                              float dampening, float weight_decay, int nesterov, int first) {
  k_sgd_step<<<grid_of(n), MPT_CUK_BLOCK, 0, s>>>(param, grad, momentum_buf, n, lr, momentum,
                                                  1.0f - dampening, weight_decay, nesterov,
                                                  first);
  return cudaGetLastError();
}

cudaError_t mpt__cuk_adamw_step(cudaStream_t s, float *param, const float *grad, float *m,
                                float *v, int64_t n, float decay, float step_size,
                                float bc2_sqrt, float beta1, float beta2, float eps) {
  k_adamw_step<<<grid_of(n), MPT_CUK_BLOCK, 0, s>>>(param, grad, m, v, n, decay, step_size,
                                                    bc2_sqrt, beta1, beta2, 1.0f - beta1,
                                                    1.0f - beta2, eps);
  return cudaGetLastError();
}

} /* extern "C" */
