/* mpitrain GPT model files: the llm.c format (karpathy/llm.c, train_gpt2.c
 * gpt2_build_from_checkpoint and write_model in train_gpt2.py), fp32, read and written.
 *
 * Format: a header of 256 little-endian int32 (1024 bytes): [0] magic 20240326, [1] version 3
 * (all parameters fp32), [2] max sequence length T, [3] vocabulary size V, [4] layers L,
 * [5] heads H, [6] channels C, [7] padded vocabulary Vp (>= V; llm.c rounds V up to a multiple
 * of 128); the other slots 0 (not checked when reading). Then the parameters, little-endian
 * fp32, as 16 tensors concatenated in this order, each over the layers where it has L:
 *
 *   0 wte [Vp, C]       4 qkvw [L, 3C, C]     8 ln2w [L, C]       12 fcprojw [L, C, 4C]
 *   1 wpe [T, C]        5 qkvb [L, 3C]        9 ln2b [L, C]       13 fcprojb [L, C]
 *   2 ln1w [L, C]       6 attprojw [L, C, C] 10 fcw [L, 4C, C]    14 lnfw [C]
 *   3 ln1b [L, C]       7 attprojb [L, C]    11 fcb [L, 4C]       15 lnfb [C]
 *
 * (Linear weights are [out, in], as PyTorch's nn.Linear.) The file is exactly
 * 1024 + 4 * mpt_gpt_layout(...).total bytes. The functions here read and write a flat buffer
 * in this order; the GPT model (transformer.h) registers its parameters layer by layer instead
 * (so DDP's buckets fill during backward), and mpt_gpt_load / mpt_gpt_save copy tensor by tensor
 * with the layout's offsets. Runs on the calling thread; no state.
 *
 * A path that ends in ".safetensors", or a directory (holding model.safetensors or config.json,
 * when read) is a Hugging Face model instead (safetensors.h: model.safetensors, config.json): the three file functions below then
 * call mpt_gpt_st_read_header, mpt_gpt_st_read and mpt_gpt_st_write, with their errors. */
#ifndef MPITRAIN_GPT_FILE_H
#define MPITRAIN_GPT_FILE_H

#include "mpitrain/core.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MPT_GPT_FILE_MAGIC 20240326
#define MPT_GPT_FILE_VERSION 3
#define MPT_GPT_FILE_HEADER_NBYTES 1024
#define MPT_GPT_NUM_TENSORS 16
/* Limits that keep every size inside int64 (and a corrupt header from asking for exabytes). */
#define MPT_GPT_MAX_LAYERS 4096
#define MPT_GPT_MAX_CHANNELS 65536
#define MPT_GPT_MAX_SEQ_LEN (1 << 24)
#define MPT_GPT_MAX_VOCAB (1 << 24)

/* A GPT-2 configuration: the model file's header fields (transformer.h builds models of it). */
typedef struct mpt_gpt_config {
  int max_seq_len;       /* T */
  int vocab_size;        /* V */
  int num_layers;        /* L */
  int num_heads;         /* H, divides C */
  int channels;          /* C */
  int padded_vocab_size; /* Vp >= V (0 in mpt_gpt_layout's input: use mpt_gpt_padded_vocab) */
} mpt_gpt_config;

/* Where each of the 16 tensors lies in the flat parameter array (in floats). */
typedef struct mpt_gpt_layout {
  int64_t count[MPT_GPT_NUM_TENSORS];  /* elements of tensor i */
  int64_t offset[MPT_GPT_NUM_TENSORS]; /* first element of tensor i: sum of count[0..i) */
  int64_t total;                       /* all parameters, N */
  int ndim[MPT_GPT_NUM_TENSORS];       /* 1 to 3: the shapes of the table above, e.g. qkvw */
  int64_t shape[MPT_GPT_NUM_TENSORS][3]; /* {L, 3C, C}, wte {Vp, C}, lnfw {C}; unused 0 */
} mpt_gpt_layout;

/* V rounded up to a multiple of 128 (50257 -> 50304, as llm.c); -1 for V < 1. */
MPT_API int64_t mpt_gpt_padded_vocab(int64_t vocab_size);

/* The tensor sizes and offsets for `config` (the one place that computes them). A zero
 * padded_vocab_size is taken as mpt_gpt_padded_vocab(V). GPT-2 124M (T 1024, V 50257, L 12,
 * H 12, C 768, Vp 50304) has total 124,475,904. Errors: MPT_EINVAL naming the field (a value
 * < 1 or above its MPT_GPT_MAX_*, Vp < V, C not a multiple of H). */
MPT_API mpt_status mpt_gpt_layout_compute(const mpt_gpt_config *config, mpt_gpt_layout *layout);

/* "wte", "wpe", ..., "lnfb" for 0..15; "?" otherwise. A static string. */
MPT_API const char *mpt_gpt_tensor_name(int i);

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

#ifdef __cplusplus
}
#endif

#endif /* MPITRAIN_GPT_FILE_H */
