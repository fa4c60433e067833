/* bf16 gradient communication of the DDP engine (ddp.h, mpt_ddp_grad_comm): names, and the
 * widening of a bucket's bfloat16 sums back into the float32 gradients. Internal to src/ddp. */
#ifndef MPT_DDP_GRAD_COMM_H
#define MPT_DDP_GRAD_COMM_H

#include <stdint.h>

/* g[i] = widen(sum[i]) / world_size, for i < count (float32 division: the engine's one division
 * by the world size). Runs on the comm worker. */
void mpt__ddp_bf16_widen_avg(const uint16_t *sum, float *g, int64_t count, int world_size);

#endif
