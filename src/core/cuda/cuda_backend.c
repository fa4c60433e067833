/* The CUDA device backend table (DESIGN.md "Backends are tables of functions"), the device
 * count, the check-macro failure recorders of cuda_check.h, pinned host memory, and the polled
 * wait with a deadline that every host-side wait of the backend goes through.
 *
 * Without a GPU (or a driver) cudaGetDeviceCount fails (error 35 with no driver) and leaves its
 * output unwritten: the count starts at 0 and a failure means 0 devices. The count is probed
 * once per process (devices do not come and go). */
#include "config.h"

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "core/cuda/cuda_internal.h"
#include "core/error.h"

static pthread_once_t count_once = PTHREAD_ONCE_INIT;
static int device_count;

static void count_probe(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
  (void)cudaGetLastError(); /* leave no error behind for later launch checks */
  device_count = n;
}

int mpt__cuda_count(void) {
  pthread_once(&count_once, count_probe);
  return device_count;
}

mpt_status mpt__cuda_use(int index) {
  const int n = mpt__cuda_count();
  if (index < 0 || index >= n)
    return MPT_FAIL(n == 0 ? MPT_EDEVICE : MPT_EINVAL,
                    "cuda:%d is not present (%d CUDA device%s visible)", index, n,
                    n == 1 ? "" : "s");
  MPT_CUDA_RETURN_IF(cudaSetDevice(index), index);
  return MPT_OK;
}

mpt_status mpt__cuda_device_uid(int index, uint8_t uid[16]) {
  memset(uid, 0, 16);
  MPT_RETURN_IF(mpt__cuda_use(index));
  struct cudaDeviceProp p;
  MPT_CUDA_RETURN_IF(cudaGetDeviceProperties(&p, index), index);
  memcpy(uid, p.uuid.bytes, 16);
  for (int i = 0; i < 16; i++)
    if (uid[i]) return MPT_OK;
  memcpy(uid, "pci", 3); /* no UUID: the PCI location is as unique on a host */
  for (int i = 0; i < 4; i++) uid[3 + i] = (uint8_t)((unsigned)p.pciDomainID >> (8 * i));
  uid[7] = (uint8_t)p.pciBusID;
  uid[8] = (uint8_t)p.pciDeviceID;
  return MPT_OK;
}

mpt_status mpt__cuda_fail(cudaError_t err, const char *stmt, const char *file, int line,
                          int device) {
  (void)cudaGetLastError(); /* clears err if it is not sticky */
  const mpt_status st = err == cudaErrorMemoryAllocation ? MPT_ENOMEM : MPT_EDEVICE;
  return mpt__error(st, file, line, "%s failed on cuda:%d: %s (%s)", stmt, device,
                    cudaGetErrorName(err), cudaGetErrorString(err));
}

mpt_status mpt__cublas_fail(cublasStatus_t err, const char *stmt, const char *file, int line,
                            int device) {
  const mpt_status st = err == CUBLAS_STATUS_ALLOC_FAILED ? MPT_ENOMEM : MPT_EDEVICE;
  return mpt__error(st, file, line, "%s failed on cuda:%d: %s (%s)", stmt, device,
                    cublasGetStatusName(err), cublasGetStatusString(err));
}

/* Spins (yielding) for the first polls, which catches the short waits of a training step
 * without sleeping, then sleeps with a growing period up to 1 ms. */
int mpt__cuda_enable_peer_access(int from, int to) {
  const int n = mpt__cuda_count();
  if (from < 0 || to < 0 || from >= n || to >= n || from == to) return 0;
  int can = 0, saved = -1;
  if (cudaDeviceCanAccessPeer(&can, from, to) != cudaSuccess || !can) {
    (void)cudaGetLastError();
    return 0;
  }
  (void)cudaGetDevice(&saved);
  cudaError_t e = cudaSetDevice(from);
  if (e == cudaSuccess) e = cudaDeviceEnablePeerAccess(to, 0);
  if (e == cudaErrorPeerAccessAlreadyEnabled) e = cudaSuccess;
  (void)cudaGetLastError(); /* the "already enabled" answer is sticky in the last error */
  if (saved >= 0) (void)cudaSetDevice(saved);
  return e == cudaSuccess;
}

void mpt__cuda_clear_not_ready(void) {
  if (cudaPeekAtLastError() == cudaErrorNotReady) (void)cudaGetLastError();
}

mpt_status mpt__cuda_poll_event(cudaEvent_t ev, int device, double timeout_ms,
                                const char *what) {
  const double start = mpt_time_ms();
  long sleep_ns = 2000;
  for (int polls = 0;; polls++) {
    const cudaError_t e = cudaEventQuery(ev);
    if (polls > 0 || e == cudaErrorNotReady) mpt__cuda_clear_not_ready();
    if (e == cudaSuccess) return MPT_OK;
    if (e != cudaErrorNotReady) return mpt__cuda_fail(e, what, __FILE__, __LINE__, device);
    if (timeout_ms >= 0 && mpt_time_ms() - start > timeout_ms)
      return MPT_FAIL(MPT_ETIMEOUT, "%s on cuda:%d did not complete within %.0f ms", what,
                      device, timeout_ms);
    if (polls < 200) {
      sched_yield();
    } else {
      const struct timespec ts = {0, sleep_ns};
      nanosleep(&ts, NULL);
      if (sleep_ns < 1000000) sleep_ns *= 2;
    }
  }
}

mpt_status mpt__cuda_host_alloc(size_t nbytes, void **ptr) {
  if (!ptr) return MPT_FAIL(MPT_EINVAL, "cuda_host_alloc: NULL output pointer");
  *ptr = NULL;
  if (nbytes == 0) return MPT_OK;
  if (mpt__cuda_count() == 0)
    return MPT_FAIL(MPT_EDEVICE, "cuda_host_alloc: no CUDA device for %zu pinned bytes", nbytes);
  int device = 0;
  (void)cudaGetDevice(&device); /* pinned memory is portable; the device only names errors */
  MPT_CUDA_RETURN_IF(cudaMallocHost(ptr, nbytes), device);
  return MPT_OK;
}

void mpt__cuda_host_free(void *ptr) {
  if (ptr) (void)cudaFreeHost(ptr);
}

const mpt__device_backend mpt__cuda_backend = {
    .name = "cuda",
    .count = mpt__cuda_count,
    .alloc = mpt__cuda_alloc,
    .free = mpt__cuda_free,
    .set_current = mpt__cuda_use,
    .stream_init = mpt__cuda_stream_init,
    .stream_free = mpt__cuda_stream_free,
    .stream_launch_host = mpt__cuda_stream_launch_host,
    .stream_synchronize = mpt__cuda_stream_synchronize,
    .stream_error = mpt__cuda_stream_error,
    .stream_wait_event = mpt__cuda_stream_wait_event,
    .event_init = mpt__cuda_event_init,
    .event_free = mpt__cuda_event_free,
    .event_record = mpt__cuda_event_record,
    .event_synchronize = mpt__cuda_event_synchronize,
    .event_query = mpt__cuda_event_query,
    .event_elapsed_ms = mpt__cuda_event_elapsed_ms,
    .event_capture = mpt__cuda_event_capture,
    .event_wait_captured = mpt__cuda_event_wait_captured,
    .memcpy = mpt__cuda_memcpy,
    .gemm = mpt__cuda_gemm,
    .bf16_check = mpt__cuda_bf16_check,
    .gemm_bf16 = mpt__cuda_gemm_bf16,
    .fill = mpt__cuda_fill,
    .copy = mpt__cuda_copy,
    .axpy = mpt__cuda_axpy,
    .scale = mpt__cuda_scale,
    .mul = mpt__cuda_mul,
    .mul_backward = mpt__cuda_mul_backward,
    .sum = mpt__cuda_sum,
    .sum_backward = mpt__cuda_sum_backward,
    .bias_add = mpt__cuda_bias_add,
    .bias_backward = mpt__cuda_bias_backward,
    .relu = mpt__cuda_relu,
    .relu_backward = mpt__cuda_relu_backward,
    .im2col = mpt__cuda_im2col,
#ifdef MPT_HAVE_CUDNN
    .conv2d_forward = mpt__cuda_conv2d_forward,
    .conv2d_backward_data = mpt__cuda_conv2d_backward_data,
    .conv2d_backward_weights = mpt__cuda_conv2d_backward_weights,
#endif
    .col2im = mpt__cuda_col2im,
    .maxpool = mpt__cuda_maxpool,
    .maxpool_backward = mpt__cuda_maxpool_backward,
    .batchnorm_train = mpt__cuda_batchnorm_train,
    .batchnorm_eval = mpt__cuda_batchnorm_eval,
    .batchnorm_backward = mpt__cuda_batchnorm_backward,
    .softmax_xent = mpt__cuda_softmax_xent,
    .softmax_xent_backward = mpt__cuda_softmax_xent_backward,
    .count_correct = mpt__cuda_count_correct,
    .dropout = mpt__cuda_dropout,
    .sgd_step = mpt__cuda_sgd_step,
    .adamw_step = mpt__cuda_adamw_step,
    .check_finite = mpt__cuda_check_finite,
    .embedding_gpt = mpt__cuda_embedding_gpt,
    .embedding_gpt_backward = mpt__cuda_embedding_gpt_backward,
    .layernorm = mpt__cuda_layernorm,
    .layernorm_backward = mpt__cuda_layernorm_backward,
    .gelu = mpt__cuda_gelu,
    .gelu_backward = mpt__cuda_gelu_backward,
    .add_layernorm = mpt__cuda_add_layernorm,
    .bias_gelu = mpt__cuda_bias_gelu,
    .bias_gelu_backward = mpt__cuda_bias_gelu_backward,
    .causal_softmax = mpt__cuda_causal_softmax,
    .causal_softmax_backward = mpt__cuda_causal_softmax_backward,
    .xent_vocab = mpt__cuda_xent_vocab,
    .xent_vocab_backward = mpt__cuda_xent_vocab_backward,
};
