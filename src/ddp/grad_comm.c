/* bf16 gradient communication of the DDP engine: the mode's names and the widening step
 * (grad_comm.h). The rounding step is mpt_bf16_round_array (core.h); the collective in between
 * is a bfloat16 sum (comm.h). Pure functions; the widening runs on the comm worker thread. */
#include <string.h>

#include "ddp/grad_comm.h"
#include "mpitrain/ddp.h"

mpt_status mpt_ddp_grad_comm_parse(const char *text, mpt_ddp_grad_comm *mode) {
  if (!text || !mode) return MPT_FAIL(MPT_EINVAL, "NULL argument");
  if (strcmp(text, "fp32") == 0)
    *mode = MPT_DDP_GRAD_FP32;
  else if (strcmp(text, "bf16") == 0)
    *mode = MPT_DDP_GRAD_BF16;
  else
    return MPT_FAIL(MPT_EINVAL, "unknown gradient communication '%s' (fp32 or bf16)", text);
  return MPT_OK;
}

const char *mpt_ddp_grad_comm_name(mpt_ddp_grad_comm mode) {
  switch (mode) {
    case MPT_DDP_GRAD_FP32:
      return "fp32";
    case MPT_DDP_GRAD_BF16:
      return "bf16";
  }
  return "unknown";
}

void mpt__ddp_bf16_widen_avg(const uint16_t *sum, float *g, int64_t count, int world_size) {
  const float w = (float)world_size;
  for (int64_t i = 0; i < count; i++) g[i] = mpt_bf16_to_f32(sum[i]) / w;
}

mpt_status mpt_ddp_allreduce_algo_parse(const char *text, mpt_ddp_allreduce_algo *algo) {
  if (!text || !algo) return MPT_FAIL(MPT_EINVAL, "NULL argument");
  if (strcmp(text, "native") == 0)
    *algo = MPT_DDP_ALLREDUCE_NATIVE;
  else if (strcmp(text, "rs-ag") == 0)
    *algo = MPT_DDP_ALLREDUCE_RS_AG;
  else
    return MPT_FAIL(MPT_EINVAL, "unknown all-reduce algorithm '%s' (native or rs-ag)", text);
  return MPT_OK;
}

const char *mpt_ddp_allreduce_algo_name(mpt_ddp_allreduce_algo algo) {
  switch (algo) {
    case MPT_DDP_ALLREDUCE_NATIVE:
      return "native";
    case MPT_DDP_ALLREDUCE_RS_AG:
      return "rs-ag";
  }
  return "unknown";
}
