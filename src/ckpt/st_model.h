/* What the safetensors model mappings (GPT-2: gpt_safetensors.c, Llama: llama_safetensors.c)
 * share: config.json read into a JSON tree and its fields checked, and each tensor of the file
 * checked against the shape and dtype the config gives. Internal (mpt__); no state; the calling
 * thread. */
#ifndef MPT_CKPT_ST_MODEL_H
#define MPT_CKPT_ST_MODEL_H

#include "ckpt/json.h"
#include "mpitrain/safetensors.h"

/* Paths of a model: PATH_MAX plus room for "/model.safetensors.index.json". */
#define MPT__ST_PATH_MAX 4200

/* Reads config.json at cfg_path (of the model at `model`) into *root (mpt__json_free).
 * Errors: MPT_ENOENT "... its config '<cfg_path>' does not exist (it gives <needs>)";
 * MPT_EFORMAT (over 16 MiB; invalid JSON with its byte offset; not an object); MPT_EIO;
 * MPT_ENOMEM. */
mpt_status mpt__st_config_read(const char *cfg_path, const char *model, const char *needs,
                               mpt__json **root);

/* The integer config field `key` in [lo, hi] into *out. A missing field is an error unless
 * `fallback` is non-NULL (then *out = *fallback). Errors: MPT_EFORMAT "model config '<cfg>':
 * <key> is missing | is not an integer in [lo, hi]". */
mpt_status mpt__st_config_int(const mpt__json *root, const char *cfg_path, const char *key,
                              int64_t lo, int64_t hi, const int64_t *fallback, int64_t *out);

/* The number field `key` (finite, in [lo, hi]) into *out, *fallback when absent (NULL: an
 * error). Errors: MPT_EFORMAT as mpt__st_config_int. */
mpt_status mpt__st_config_num(const mpt__json *root, const char *cfg_path, const char *key,
                              double lo, double hi, const double *fallback, double *out);

/* The tensors' dtype config.json names ("torch_dtype", or "dtype" as newer transformers write
 * it): "F32" for float32, "BF16" for bfloat16, "F16" for float16, "" when neither key is
 * there. Errors: MPT_EFORMAT another value (named). */
mpt_status mpt__st_config_dtype(const mpt__json *root, const char *cfg_path, char dtype[12]);

/* Checks tensor t of f (found under `name`) against the shape [ndim] the config gives and the
 * config's dtype (cfg_dtype; "" for any of F32, BF16, F16). Errors: MPT_EFORMAT naming the
 * file holding it, the tensor, both shapes or both dtypes, and cfg_path. */
mpt_status mpt__st_check_tensor(const mpt_st_file *f, const mpt_st_tensor *t, int ndim,
                                const int64_t *shape, const char *cfg_dtype,
                                const char *cfg_path);

/* "float32" or "bfloat16": config.json's torch_dtype for tensors written as `dtype`. */
const char *mpt__st_torch_dtype(mpt_st_dtype dtype);

#endif
