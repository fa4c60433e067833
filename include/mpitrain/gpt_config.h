/* mpitrain GPT-2 configurations and the parameter layout: the shape of a GPT model, which the
 * model (transformer.h) is built from and the file formats (gpt_file.h, safetensors.h) read
 * and write. No I/O here.
 *
 * The layout is llm.c's (karpathy/llm.c, train_gpt2.c): 16 tensors, concatenated in this
 * order, each over the layers where it has L (T max sequence length, Vp padded vocabulary,
 * L layers, C channels):
 *
 *   0 wte [Vp, C]       4 qkvw [L, 3C, C]     8 ln2w [L, C]       12 fcprojw [L, C, 4C]
 *   1 wpe [T, C]        5 qkvb [L, 3C]        9 ln2b [L, C]       13 fcprojb [L, C]
 *   2 ln1w [L, C]       6 attprojw [L, C, C] 10 fcw [L, 4C, C]    14 lnfw [C]
 *   3 ln1b [L, C]       7 attprojb [L, C]    11 fcb [L, 4C]       15 lnfb [C]
 *
 * (Linear weights are [out, in], as PyTorch's nn.Linear.) The GPT model registers its
 * parameters layer by layer instead (so DDP's buckets fill during backward: transformer.h);
 * mpt_gpt_load / mpt_gpt_save map between the two with the layout's offsets. Pure functions,
 * any thread. */
#ifndef MPITRAIN_GPT_CONFIG_H
#define MPITRAIN_GPT_CONFIG_H

#include "mpitrain/core.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MPT_GPT_NUM_TENSORS 16
/* Limits that keep every size inside int64 (and a corrupt header from asking for exabytes). */
#define MPT_GPT_MAX_LAYERS 4096
#define MPT_GPT_MAX_CHANNELS 65536
#define MPT_GPT_MAX_SEQ_LEN (1 << 24)
#define MPT_GPT_MAX_VOCAB (1 << 24)

/* A GPT-2 configuration (the llm.c model file's header fields; transformer.h builds models of
 * it). */
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

#ifdef __cplusplus
}
#endif

#endif /* MPITRAIN_GPT_CONFIG_H */
