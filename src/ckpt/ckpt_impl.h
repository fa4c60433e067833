/* Internal interface of the checkpoint layer, shared by src/ckpt/format.c (the file format) and
 * src/ckpt/dir.c (directories and the collective wrappers).
 *
 * A load is split in two so that the collective wrapper can make every rank validate its file
 * before any rank changes its model: stage (read and validate the whole file into host memory
 * sized from the model and optimizer) then commit (copy to the devices). */
#ifndef MPT_CKPT_IMPL_H
#define MPT_CKPT_IMPL_H

#include "mpitrain/ckpt.h"

typedef struct mpt__ckpt_staged {
  float *data;            /* host: [param_count + buffer_count + opt_nbuffers * opt_count] */
  int64_t param_count;    /* = mpt_model_param_count of the model it was staged for */
  int64_t buffer_count;   /* = mpt_model_buffer_count */
  int opt_nbuffers;       /* 0 when no optimizer was given */
  int64_t opt_count;      /* elements per optimizer state buffer */
  int64_t opt_step_count;
  int has_optimizer;      /* the optimizer state was staged (an optimizer was given) */
  mpt_ckpt_meta meta;
  uint32_t crc;           /* the file's CRC-32 */
} mpt__ckpt_staged;

/* Reads and validates `path` against model and optimizer (NULL: ignore the file's optimizer
 * state) into *staged (zeroed first). Errors as mpt_ckpt_load. Nothing is written to the model
 * or optimizer. On error *staged owns nothing. */
mpt_status mpt__ckpt_stage(const char *path, mpt_model *model, mpt_optimizer *optimizer,
                           mpt__ckpt_staged *staged);
/* Copies the staged values onto the model's (and optimizer's) device, sets the optimizer's
 * step count, and fills *meta (may be NULL). Errors: the device copy's. */
mpt_status mpt__ckpt_commit(const mpt__ckpt_staged *staged, mpt_model *model,
                            mpt_optimizer *optimizer, mpt_ckpt_meta *meta);
void mpt__ckpt_staged_free(mpt__ckpt_staged *staged);

/* "<dir>/ckpt-step%08lld.mpt" into buf[nbytes]. Errors: MPT_EINVAL (does not fit, step < 0). */
mpt_status mpt__ckpt_dir_path(const char *dir, int64_t step, char *buf, size_t nbytes);

#endif
