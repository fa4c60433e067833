/* The usual parameter-group split of a model (mpt_param_groups_split_decay): weights with two or
 * more dimensions decay, biases and normalisation parameters do not.
 *
 * This is the one file of src/optim that reads a model, and only through nn's public
 * parameter table (mpt_model_param_info); the optimizer itself knows flat slices only. Pure:
 * runs on the caller's thread, allocates nothing. */
#include <math.h>

#include "mpitrain/nn.h"
#include "mpitrain/optim.h"

mpt_status mpt_param_groups_split_decay(const mpt_model *model, float weight_decay,
                                        mpt_param_group *groups, int max_groups, int *ngroups) {
  if (!model || !ngroups)
    return MPT_FAIL(MPT_EINVAL, "mpt_param_groups_split_decay: NULL model or ngroups");
  *ngroups = 0;
  if (!(isfinite(weight_decay) && weight_decay >= 0.0f))
    return MPT_FAIL(MPT_EINVAL, "mpt_param_groups_split_decay: weight_decay must be >= 0 and "
                    "finite (got %g)", (double)weight_decay);
  /* First pass counts the runs, the second (when they fit) writes them. */
  int n = 0, last_decay = -1;
  int64_t end = 0;
  for (int pass = 0; pass < 2; ++pass) {
    n = 0;
    last_decay = -1;
    for (int i = 0; i < mpt_model_num_params(model); ++i) {
      const mpt_param_info *p = mpt_model_param_info(model, i);
      int decay = p->ndim >= 2;
      if (decay == last_decay && p->offset == end) {
        if (pass == 1) groups[n - 1].count += p->count;
      } else {
        if (pass == 1)
          groups[n] = (mpt_param_group){p->offset, p->count, decay ? weight_decay : 0.0f, 1.0f};
        n++;
        last_decay = decay;
      }
      end = p->offset + p->count;
    }
    if (pass == 0) {
      *ngroups = n;
      if (!groups) return MPT_OK;
      if (max_groups < n)
        return MPT_FAIL(MPT_EINVAL, "mpt_param_groups_split_decay: the model needs %d groups, "
                        "room for %d", n, max_groups);
    }
  }
  return MPT_OK;
}
