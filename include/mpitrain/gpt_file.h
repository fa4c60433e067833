/* mpitrain GPT model files: the llm.c format (karpathy/llm.c, train_gpt2.c
 * gpt2_build_from_checkpoint and write_model in train_gpt2.py), fp32, read and written.
 *
 * Format: a header of 256 little-endian int32 (1024 bytes): [0] magic 20240326, [1] version 3
 * (all parameters fp32), [2] max sequence length T, [3] vocabulary size V, [4] layers L,
 * [5] heads H, [6] channels C, [7] padded vocabulary Vp (>= V; llm.c rounds V up to a multiple
 * of 128); the other slots 0 (not checked when reading). Then the parameters, little-endian
 * fp32, as the 16 tensors of the GPT's layout (gpt_config.h, included here: mpt_gpt_config,
 * mpt_gpt_layout) concatenated in its order. The file is exactly 1024 + 4 * layout.total
 * bytes. The functions here read and write a flat buffer
 * in this order; the GPT model (transformer.h) registers its parameters layer by layer instead
 * (so DDP's buckets fill during backward), and mpt_gpt_load / mpt_gpt_save copy tensor by tensor
 * with the layout's offsets. Runs on the calling thread; no state.
 *
 * A path that ends in ".safetensors", or a directory (holding model.safetensors or config.json,
 * when read) is a Hugging Face model instead (safetensors.h: model.safetensors, config.json):
 * the three file functions below then call mpt_gpt_st_read_header, mpt_gpt_st_read and
 * mpt_gpt_st_write, with their errors. */
#ifndef MPITRAIN_GPT_FILE_H
#define MPITRAIN_GPT_FILE_H

#include "mpitrain/core.h"
#include "mpitrain/gpt_config.h"
#include "mpitrain/nn.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MPT_GPT_FILE_MAGIC 20240326
#define MPT_GPT_FILE_VERSION 3
#define MPT_GPT_FILE_HEADER_NBYTES 1024

/* Reads a model file's header into *config and checks it: magic, version, a valid config
 * (mpt_gpt_layout_compute) and a file size of exactly 1024 + 4 N. Reads 1024 bytes only.
 * Errors (the detail names the file): MPT_ENOENT missing; MPT_EIO unreadable or not a regular
 * file; MPT_EFORMAT shorter than the header, wrong magic (a token shard's magic is named as
 * such), wrong version (version 5, llm.c's bf16 files, is named), an invalid config, or a size
 * that does not match the header (names both sizes and the parameter count); MPT_EINVAL NULL
 * arguments. *config is zeroed first. */
MPT_API mpt_status mpt_gpt_file_read_header(const char *path, mpt_gpt_config *config);

/* Reads the header (as above) and all N parameters into params[capacity], in the order above.
 * `expect` (may be NULL) is the configuration the caller built its model for: every field must
 * match (a zero field is not checked). Errors: those of mpt_gpt_file_read_header; MPT_ESHAPE
 * the file's config differs from `expect` (names the field and both values) or N > capacity;
 * MPT_EIO a read that fails or comes short; MPT_EINVAL NULL arguments. On error params may
 * have been partly written. */
MPT_API mpt_status mpt_gpt_file_read(const char *path, const mpt_gpt_config *expect,
                                     mpt_gpt_config *config, float *params, int64_t capacity);

/* Writes a model file for `config` (checked as mpt_gpt_layout_compute; a zero Vp becomes
 * mpt_gpt_padded_vocab(V) in the header) with the N = layout.total floats of `params`,
 * atomically: a temporary file that is fsynced, renamed over `path`, and the directory
 * fsynced. Errors: MPT_EINVAL (bad config, NULL arguments); MPT_EIO naming the step;
 * MPT_ENOMEM (the write buffer). On error `path` is unchanged. */
MPT_API mpt_status mpt_gpt_file_write(const char *path, const mpt_gpt_config *config,
                                      const float *params);

/* Reads an llm.c model file (or a Hugging Face model, as mpt_gpt_file_read) into a GPT model
 * (transformer.h) built for `config`: the file's
 * header must match the config (every field; mpt_gpt_file_read's `expect`), then the whole
 * parameter array is read into a host staging buffer (4 N bytes) and copied into the model
 * tensor by tensor (mpt_gpt_params_copy: file tensor k, layer l -> parameter "h{l}.<name k>";
 * one host-to-device copy per tensor on a GPU). Does not change the model's generation (load before
 * mpt_ddp_init, or on every rank). Errors: MPT_EINVAL; MPT_ENOMEM (staging); MPT_ESHAPE (the
 * model is not a finalised GPT of `config`: its parameters' names and sizes are checked, or the
 * file's config differs: named); the errors of mpt_gpt_file_read (MPT_ENOENT, MPT_EIO,
 * MPT_EFORMAT); MPT_EFORMAT a NaN or infinite parameter (named: index, tensor and element; the
 * reader itself passes them through). A file that fails to read or check leaves the parameters
 * untouched; a failed device copy may leave them partly overwritten. */
MPT_API mpt_status mpt_gpt_load(mpt_model *model, const mpt_gpt_config *config,
                                const char *path);

/* Writes the parameters of a GPT model built for `config` as an llm.c model file, atomically
 * (mpt_gpt_file_write: temporary file, fsync, rename): gathered tensor by tensor into the
 * file's order in a host staging buffer (4 N bytes). Errors: MPT_EINVAL, MPT_ENOMEM, MPT_ESHAPE
 * (not a finalised GPT of `config`), MPT_EIO naming the step. */
MPT_API mpt_status mpt_gpt_save(mpt_model *model, const mpt_gpt_config *config,
                                const char *path);

#ifdef __cplusplus
}
#endif

#endif /* MPITRAIN_GPT_FILE_H */
