/* The token check and the normal draws shared by the language models (lm_common.h). */
#include "nn/lm_common.h"

#include <math.h>

mpt_status mpt__lm_check_tokens(const char *model, const mpt_tensor *tok, int max_seq_len) {
  char xs[64];
  if (tok->dtype != MPT_I32 || tok->ndim != 2 || tok->shape[1] < 1 ||
      tok->shape[1] > max_seq_len)
    return MPT_FAIL(MPT_ESHAPE, "%s: input %s %s, want int32 tokens [B, T] with 1 <= T <= %d",
                    model, mpt_dtype_name(tok->dtype),
                    mpt_shape_str(tok->ndim, tok->shape, xs, sizeof xs), max_seq_len);
  return MPT_OK;
}

double mpt__lm_normal_draw(mpt_rng *rng, double *spare, int *has_spare) {
  if (*has_spare) {
    *has_spare = 0;
    return *spare;
  }
  double u1 = ((double)(mpt_rng_next(rng) >> 11) + 0.5) * 0x1.0p-53;
  double u2 = ((double)(mpt_rng_next(rng) >> 11) + 0.5) * 0x1.0p-53;
  double r = sqrt(-2.0 * log(u1)), th = 6.283185307179586 * u2;
  *spare = r * sin(th);
  *has_spare = 1;
  return r * cos(th);
}
