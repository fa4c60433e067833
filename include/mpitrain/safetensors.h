/* Hugging Face safetensors files (https://huggingface.co/docs/safetensors): a generic reader
 * and fp32 writer, and the GPT-2 mapping (the tensor names of transformers' GPT2LMHeadModel,
 * with config.json) onto mpitrain's GPT parameters (gpt_file.h).
 *
 * Format: an 8-byte little-endian header length N, then N bytes of JSON
 *   {"<name>": {"dtype": "F32", "shape": [d0, d1, ...], "data_offsets": [begin, end]}, ...,
 *    "__metadata__": {"<key>": "<string>", ...}}     (__metadata__ optional)
 * then the tensors' bytes, little-endian, row-major; offsets count bytes from the end of the
 * header. The reader refuses (MPT_EFORMAT, naming the file): a file shorter than 8 bytes, N past
 * the end of the file or above MPT_ST_MAX_HEADER_NBYTES, invalid JSON (json with a byte offset),
 * a name given twice, an entry that is not {dtype, shape, data_offsets}, an unknown dtype, more
 * than MPT_ST_MAX_DIMS dimensions, a negative size, shape x dtype size != end - begin, offsets
 * past the end of the data (a truncated file) or overlapping another tensor's, __metadata__ with
 * a value that is not a string. Runs on the calling thread; a mpt_st_file is used by one thread
 * at a time. */
#ifndef MPITRAIN_SAFETENSORS_H
#define MPITRAIN_SAFETENSORS_H

#include "mpitrain/core.h"
#include "mpitrain/gpt_file.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MPT_ST_MAX_DIMS 8
#define MPT_ST_MAX_HEADER_NBYTES (100 << 20) /* 100 MiB, the reference implementation's limit */

/* One tensor of an open file. */
typedef struct mpt_st_tensor {
  const char *name;              /* owned by the file */
  char dtype[12];                /* "F32", "BF16", "F16", "F64", "I64", ..., "BOOL", "F8_E4M3" */
  int dtype_nbytes;              /* bytes per element: 1, 2, 4 or 8 */
  int ndim;                      /* 0 (a scalar) to MPT_ST_MAX_DIMS */
  int64_t shape[MPT_ST_MAX_DIMS];
  int64_t count;                 /* elements: the product of shape (1 for a scalar) */
  int64_t begin, end;            /* byte offsets in the data section, end - begin = count x size */
} mpt_st_tensor;

/* An open, validated file (mpt_st_open): its descriptor, the parsed header and metadata. */
typedef struct mpt_st_file mpt_st_file;

/* Opens `path` and validates its header (all the checks above; no tensor data is read).
 * Errors: MPT_ENOENT missing; MPT_EIO unreadable or not a regular file; MPT_EFORMAT as above;
 * MPT_ENOMEM; MPT_EINVAL NULL arguments. *out is NULL on error. */
MPT_API mpt_status mpt_st_open(const char *path, mpt_st_file **out);
/* Closes the file and frees it; NULL is a no-op. */
MPT_API void mpt_st_close(mpt_st_file *f);
/* The number of tensors, and tensor i (0 <= i < count, in the header's order; NULL outside). */
MPT_API int mpt_st_num_tensors(const mpt_st_file *f);
MPT_API const mpt_st_tensor *mpt_st_tensor_at(const mpt_st_file *f, int i);
/* The tensor called `name`, or NULL. */
MPT_API const mpt_st_tensor *mpt_st_find(const mpt_st_file *f, const char *name);
/* The __metadata__ value of `key`, or NULL when absent. Owned by the file. */
MPT_API const char *mpt_st_metadata(const mpt_st_file *f, const char *key);
/* Reads tensor t (of f) into dst[t->count] as fp32: F32 as is, BF16 and F16 converted exactly
 * (every value of both is a float). Errors: MPT_ENOTSUP another dtype (named); MPT_ESHAPE
 * capacity < t->count; MPT_EIO a read that fails or comes short; MPT_EINVAL NULL arguments. */
MPT_API mpt_status mpt_st_read_f32(mpt_st_file *f, const mpt_st_tensor *t, float *dst,
                                   int64_t capacity);

/* A tensor to write: its data comes from fill(ctx, index, dst) with dst[count] (fp32). */
typedef struct mpt_st_write_tensor {
  const char *name; /* unique, non-empty, not "__metadata__" */
  int ndim;         /* 0..MPT_ST_MAX_DIMS */
  int64_t shape[MPT_ST_MAX_DIMS];
} mpt_st_write_tensor;
/* Writes tensor `index`'s count floats into dst (the writer's buffer); an error aborts the
 * write and is returned by mpt_st_write_f32. */
typedef mpt_status (*mpt_st_fill_fn)(void *ctx, int index, float *dst);

/* Writes an F32 safetensors file of the n tensors (data in that order, contiguous, the header
 * padded with spaces to a multiple of 8 bytes) and the metadata pairs meta[0..2*nmeta) (key,
 * value; may be NULL when nmeta is 0), atomically (temporary file, fsync, rename). fill is
 * called once per tensor, in order, with a buffer of the tensor's count floats; its error
 * aborts the write. Errors: MPT_EINVAL (NULL arguments, a bad name or shape, a name twice);
 * MPT_ENOMEM; MPT_EIO naming the step; fill's. On error `path` is unchanged. */
MPT_API mpt_status mpt_st_write_f32(const char *path, const mpt_st_write_tensor *tensors, int n,
                                    const char *const *meta, int nmeta, mpt_st_fill_fn fill,
                                    void *ctx);

/* ---- GPT-2 (transformers' GPT2LMHeadModel) ----
 * A model is a directory holding model.safetensors and config.json, or a file whose name ends
 * in ".safetensors" with config.json in the same directory. config.json gives n_layer, n_head,
 * n_embd, n_positions (n_ctx when absent) and vocab_size (integers; other keys are ignored).
 * Tensors (an optional "transformer." prefix on every name), with mpitrain's tensor (gpt_file.h):
 *   wte.weight [V, C] wte (its first V rows; the padded rows past V read as 0)   wpe.weight [T, C]
 *   h.<l>.ln_1.{weight,bias} [C]        h.<l>.attn.c_attn.weight [C, 3C] = qkvw[l] transposed
 *   h.<l>.attn.c_attn.bias [3C]         h.<l>.attn.c_proj.weight [C, C] = attprojw[l] transposed
 *   h.<l>.ln_2.{weight,bias} [C]        h.<l>.mlp.c_fc.weight [C, 4C]  = fcw[l] transposed
 *   h.<l>.mlp.c_fc.bias [4C]            h.<l>.mlp.c_proj.weight [4C, C] = fcprojw[l] transposed
 *   h.<l>.mlp.c_proj.bias [C]           ln_f.{weight,bias} [C]
 * (transformers' Conv1D stores [in, out]; mpitrain, as nn.Linear and llm.c, [out, in].) Also
 * accepted and not read: lm_head.weight (tied to wte), h.<l>.attn.bias and
 * h.<l>.attn.masked_bias (the causal-mask buffers older files hold). Any other tensor, a
 * missing one, or a shape that differs is refused naming it. F32, BF16 and F16 are read. */

/* 1 when `path` names a safetensors model: ends in ".safetensors", or is a directory holding
 * model.safetensors or config.json. (mpt_gpt_file_write also takes any directory as one.) */
MPT_API int mpt_gpt_st_is_path(const char *path);

/* The config of the model at `path` (config.json; padded_vocab_size is
 * mpt_gpt_padded_vocab(V)), checked against the safetensors file's header (every tensor's
 * presence, dtype and shape). Errors: MPT_ENOENT (the file or config.json missing); MPT_EFORMAT
 * (config.json invalid or without a field, naming it; the header, as mpt_st_open; a tensor
 * missing, unknown or of another shape, named); MPT_EIO; MPT_ENOMEM; MPT_EINVAL. */
MPT_API mpt_status mpt_gpt_st_read_header(const char *path, mpt_gpt_config *config);

/* Reads the model at `path` into params[capacity] in llm.c's order (gpt_file.h), as
 * mpt_gpt_file_read (the same `expect` checks; the padded rows of wte are zeroed). Errors:
 * those of mpt_gpt_st_read_header and mpt_st_read_f32; MPT_ESHAPE (config differs from
 * `expect`, or N > capacity). */
MPT_API mpt_status mpt_gpt_st_read(const char *path, const mpt_gpt_config *expect,
                                   mpt_gpt_config *config, float *params, int64_t capacity);

/* Writes params (llm.c's order, layout.total floats) as an F32 GPT-2 model at `path` (an
 * existing directory: path/model.safetensors; otherwise the file itself) and config.json beside it,
 * each atomically. wte's rows past V are not written. Metadata {"format": "pt"} (what
 * transformers expects). Errors: those of mpt_gpt_layout_compute and mpt_st_write_f32. */
MPT_API mpt_status mpt_gpt_st_write(const char *path, const mpt_gpt_config *config,
                                    const float *params);

#ifdef __cplusplus
}
#endif

#endif /* MPITRAIN_SAFETENSORS_H */
