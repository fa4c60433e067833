/* The CPU device backend table: memory from the C heap, inline and worker streams, and the
 * reference op kernels every other backend is tested against. */
#include "config.h"

#include <stdlib.h>

#include "core/cpu/cpu.h"
#include "mpitrain/core.h"

int mpt__cpu_count(void) { return 1; }

mpt_status mpt__cpu_alloc(int index, size_t nbytes, void **ptr) {
  (void)index;
  /* A bad MPT_CPU_ISA stops the program at its first CPU memory (isa.c). */
  MPT_RETURN_IF(mpt_cpu_isa_init());
  /* Round up to the alignment, as aligned_alloc requires. */
  size_t rounded = (nbytes + 63) & ~(size_t)63;
  *ptr = aligned_alloc(64, rounded);
  if (!*ptr) return MPT_FAIL(MPT_ENOMEM, "cannot allocate %zu bytes on the CPU", nbytes);
  return MPT_OK;
}

void mpt__cpu_free(int index, void *ptr) {
  (void)index;
  free(ptr);
}

const mpt__device_backend mpt__cpu_backend = {
    .name = "cpu",
    .count = mpt__cpu_count,
    .alloc = mpt__cpu_alloc,
    .free = mpt__cpu_free,
    .stream_init = mpt__cpu_stream_init,
    .stream_free = mpt__cpu_stream_free,
    .stream_abandon = mpt__cpu_stream_abandon,
    .stream_launch_host = mpt__cpu_stream_launch_host,
    .stream_launch_host_kept = mpt__cpu_stream_launch_host_kept,
    .stream_synchronize = mpt__cpu_stream_synchronize,
    .stream_error = mpt__cpu_stream_error,
    .stream_wait_event = mpt__cpu_stream_wait_event,
    .event_init = mpt__cpu_event_init,
    .event_free = mpt__cpu_event_free,
    .event_record = mpt__cpu_event_record,
    .event_synchronize = mpt__cpu_event_synchronize,
    .event_query = mpt__cpu_event_query,
    .event_elapsed_ms = mpt__cpu_event_elapsed_ms,
    .event_capture = mpt__cpu_event_capture,
    .event_wait_captured = mpt__cpu_event_wait_captured,
    .memcpy = mpt__cpu_memcpy,
    .gemm = mpt__cpu_gemm,
    .fill = mpt__cpu_fill,
    .copy = mpt__cpu_copy,
    .axpy = mpt__cpu_axpy,
    .scale = mpt__cpu_scale,
    .mul = mpt__cpu_mul,
    .mul_backward = mpt__cpu_mul_backward,
    .sum = mpt__cpu_sum,
    .sum_backward = mpt__cpu_sum_backward,
    .bias_add = mpt__cpu_bias_add,
    .bias_backward = mpt__cpu_bias_backward,
    .relu = mpt__cpu_relu,
    .relu_backward = mpt__cpu_relu_backward,
    .im2col = mpt__cpu_im2col,
    .col2im = mpt__cpu_col2im,
#ifdef MPT_HAVE_ONEDNN
    .conv2d_forward = mpt__cpu_conv2d_forward,
    .conv2d_backward_data = mpt__cpu_conv2d_backward_data,
    .conv2d_backward_weights = mpt__cpu_conv2d_backward_weights,
    .bf16_check = mpt__cpu_bf16_check,
    .gemm_bf16 = mpt__cpu_gemm_bf16,
    .bf16_round = mpt__cpu_bf16_round,
    .gemm_bf16_batched = mpt__cpu_gemm_bf16_batched,
    .heads_split_bf16 = mpt__cpu_heads_split_bf16,
    .heads_merge = mpt__cpu_heads_merge,
    .conv2d_forward_bf16 = mpt__cpu_conv2d_forward_bf16,
    .conv2d_backward_data_bf16 = mpt__cpu_conv2d_backward_data_bf16,
    .conv2d_backward_weights_bf16 = mpt__cpu_conv2d_backward_weights_bf16,
#endif
    .maxpool = mpt__cpu_maxpool,
    .maxpool_backward = mpt__cpu_maxpool_backward,
    .batchnorm_train = mpt__cpu_batchnorm_train,
    .batchnorm_eval = mpt__cpu_batchnorm_eval,
    .batchnorm_backward = mpt__cpu_batchnorm_backward,
    .softmax_xent = mpt__cpu_softmax_xent,
    .softmax_xent_backward = mpt__cpu_softmax_xent_backward,
    .count_correct = mpt__cpu_count_correct,
    .dropout = mpt__cpu_dropout,
    .sgd_step = mpt__cpu_sgd_step,
    .adamw_step = mpt__cpu_adamw_step,
    .check_finite = mpt__cpu_check_finite,
    .embedding_gpt = mpt__cpu_embedding_gpt,
    .embedding_gpt_backward = mpt__cpu_embedding_gpt_backward,
    .layernorm = mpt__cpu_layernorm,
    .layernorm_backward = mpt__cpu_layernorm_backward,
    .rmsnorm = mpt__cpu_rmsnorm,
    .rmsnorm_backward = mpt__cpu_rmsnorm_backward,
    .rope = mpt__cpu_rope,
    .swiglu = mpt__cpu_swiglu,
    .swiglu_backward = mpt__cpu_swiglu_backward,
    .gelu = mpt__cpu_gelu,
    .gelu_backward = mpt__cpu_gelu_backward,
    .gelu_backward_write = mpt__cpu_gelu_backward_write,
    .add_layernorm = mpt__cpu_add_layernorm,
    .bias_gelu = mpt__cpu_bias_gelu,
    .bias_gelu_backward = mpt__cpu_bias_gelu_backward,
    .causal_softmax = mpt__cpu_causal_softmax,
    .causal_softmax_backward = mpt__cpu_causal_softmax_backward,
    .xent_vocab = mpt__cpu_xent_vocab,
    .xent_vocab_backward = mpt__cpu_xent_vocab_backward,
    .xent_vocab_backward_write = mpt__cpu_xent_vocab_backward_write,
    .causal_attention = mpt__cpu_causal_attention,
    .causal_attention_backward = mpt__cpu_causal_attention_backward,
};
