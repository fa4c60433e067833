/* mpt_gpt_load, mpt_gpt_save (include/mpitrain/gpt_file.h) and mpt_gpt_save_safetensors
 * (safetensors.h): a GPT model's parameters from
 * and to a model file (llm.c's, or a Hugging Face model: gpt_file.c takes either), staged on
 * the host in the file's order (4 N bytes) and mapped tensor by tensor by the model's
 * mpt_gpt_params_copy (transformer.h). The model is checked against the config before the file
 * is opened, so a file that fails to read or check leaves the parameters untouched. Runs on the
 * calling thread. */
#include <math.h>
#include <stdlib.h>

#include "mpitrain/gpt_file.h"
#include "mpitrain/safetensors.h"
#include "mpitrain/transformer.h"

/* The config with a zero padded vocabulary filled in (as the model resolves it), and its
 * layout. */
static mpt_status resolve(const mpt_gpt_config *config, mpt_gpt_config *c, mpt_gpt_layout *lay) {
  *c = *config;
  MPT_RETURN_IF(mpt_gpt_layout_compute(c, lay));
  if (c->padded_vocab_size == 0) c->padded_vocab_size = (int)mpt_gpt_padded_vocab(c->vocab_size);
  return MPT_OK;
}

mpt_status mpt_gpt_load(mpt_model *model, const mpt_gpt_config *config, const char *path) {
  mpt_status st = MPT_OK;
  mpt_gpt_config c, got;
  mpt_gpt_layout lay;
  float *host = NULL;
  MPT_RETURN_IF(mpt_gpt_params_copy(model, config, NULL, 1)); /* the model is a GPT of config */
  if (!path) return MPT_FAIL(MPT_EINVAL, "gpt load: NULL path");
  MPT_RETURN_IF(resolve(config, &c, &lay));
  if (!(host = malloc((size_t)lay.total * sizeof *host)))
    return MPT_FAIL(MPT_ENOMEM, "gpt load: %lld floats of staging", (long long)lay.total);
  MPT_CHECK(mpt_gpt_file_read(path, &c, &got, host, lay.total), done);
  for (int64_t i = 0; i < lay.total; i++) /* a model to train or sample from, not to inspect */
    if (!isfinite(host[i])) {
      int k = MPT_GPT_NUM_TENSORS - 1;
      while (k > 0 && lay.offset[k] > i) k--;
      st = MPT_FAIL(MPT_EFORMAT, "model file '%s': parameter %lld (%s element %lld) is %g: the "
                    "file holds non-finite weights (saved from a run that diverged?)", path,
                    (long long)i, mpt_gpt_tensor_name(k), (long long)(i - lay.offset[k]),
                    (double)host[i]);
      goto done;
    }
  MPT_CHECK(mpt_gpt_params_copy(model, &c, host, 1), done);
done:
  free(host);
  return st;
}

mpt_status mpt_gpt_save(mpt_model *model, const mpt_gpt_config *config, const char *path) {
  return mpt_gpt_save_safetensors(model, config, path, NULL);
}

mpt_status mpt_gpt_save_safetensors(mpt_model *model, const mpt_gpt_config *config,
                                    const char *path, const mpt_st_save_options *opts) {
  mpt_status st = MPT_OK;
  mpt_gpt_config c;
  mpt_gpt_layout lay;
  float *host = NULL;
  MPT_RETURN_IF(mpt_gpt_params_copy(model, config, NULL, 0));
  if (!path) return MPT_FAIL(MPT_EINVAL, "gpt save: NULL path");
  MPT_RETURN_IF(resolve(config, &c, &lay));
  if (!(host = malloc((size_t)lay.total * sizeof *host)))
    return MPT_FAIL(MPT_ENOMEM, "gpt save: %lld floats of staging", (long long)lay.total);
  MPT_CHECK(mpt_gpt_params_copy(model, &c, host, 0), done);
  if (opts) MPT_CHECK(mpt_gpt_st_write(path, &c, host, opts), done);
  else MPT_CHECK(mpt_gpt_file_write(path, &c, host), done);
done:
  free(host);
  return st;
}
