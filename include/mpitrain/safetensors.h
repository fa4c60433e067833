/* Hugging Face safetensors files (https://huggingface.co/docs/safetensors): a generic reader
 * and fp32 / bf16 writer, sharded models (model.safetensors.index.json) as transformers writes
 * them, and the GPT-2 mapping (the tensor names of transformers' GPT2LMHeadModel,
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
  int shard;                     /* the file holding it: 0, or its shard of an index */
} mpt_st_tensor;

/* An open, validated file (mpt_st_open): its descriptor, the parsed header and metadata. */
typedef struct mpt_st_file mpt_st_file;

/* Opens `path` and validates its header (all the checks above; no tensor data is read).
 * Errors: MPT_ENOENT missing; MPT_EIO unreadable or not a regular file; MPT_EFORMAT as above;
 * MPT_ENOMEM; MPT_EINVAL NULL arguments. *out is NULL on error. */
MPT_API mpt_status mpt_st_open(const char *path, mpt_st_file **out);
/* Opens a sharded model's index (transformers' model.safetensors.index.json:
 * {"metadata": {...}, "weight_map": {"<tensor>": "<file>", ...}}) and every shard it names (a
 * file name in the index's folder), each as mpt_st_open, as one file whose tensors are those
 * of the shards, in shard order (the shards' first mention in the map), each with its shard.
 * __metadata__ is the first shard's. Errors (MPT_EFORMAT, naming the index and, where there is
 * one, the tensor and the shards): the index's errors as mpt_st_open's for a header (size,
 * invalid JSON), no weight_map object, a value that is not a plain file name, a shard that
 * does not exist, a tensor in two shards, a shard's tensor the map does not list or puts in
 * another shard, a listed tensor its shard does not hold; a shard's, as mpt_st_open; MPT_ENOENT
 * the index missing; MPT_EIO; MPT_ENOMEM; MPT_EINVAL NULL arguments. *out is NULL on error. */
MPT_API mpt_status mpt_st_open_index(const char *path, mpt_st_file **out);
/* The number of files of f (1 for mpt_st_open's), and the path of file `shard` (NULL outside);
 * a tensor's file is mpt_st_shard_path(f, t->shard). */
MPT_API int mpt_st_num_shards(const mpt_st_file *f);
MPT_API const char *mpt_st_shard_path(const mpt_st_file *f, int shard);
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

/* The dtypes written: IEEE float32, or bfloat16 rounded to nearest even (mpt_bf16_from_f32:
 * NaN stays a quiet NaN, a value past the largest bf16 rounds to infinity). */
typedef enum mpt_st_dtype { MPT_ST_F32 = 0, MPT_ST_BF16 = 1 } mpt_st_dtype;

/* Writes a safetensors file of the n tensors as `dtype` (F32 or BF16), otherwise as
 * mpt_st_write_f32 (fill still gives floats). Errors: those of mpt_st_write_f32; MPT_EINVAL
 * another dtype. */
MPT_API mpt_status mpt_st_write(const char *path, const mpt_st_write_tensor *tensors, int n,
                                const char *const *meta, int nmeta, mpt_st_dtype dtype,
                                mpt_st_fill_fn fill, void *ctx);

/* Writes an F32 safetensors file of the n tensors (data in that order, contiguous, the header
 * padded with spaces to a multiple of 8 bytes) and the metadata pairs meta[0..2*nmeta) (key,
 * value; may be NULL when nmeta is 0), atomically (temporary file, fsync, rename). fill is
 * called once per tensor, in order, with a buffer of the tensor's count floats; its error
 * aborts the write. Errors: MPT_EINVAL (NULL arguments, a bad name or shape, a name twice);
 * MPT_ENOMEM; MPT_EIO naming the step; fill's. On error `path` is unchanged. */
MPT_API mpt_status mpt_st_write_f32(const char *path, const mpt_st_write_tensor *tensors, int n,
                                    const char *const *meta, int nmeta, mpt_st_fill_fn fill,
                                    void *ctx);

/* ---- models: a folder or a file, one file or shards, with config.json ----
 * A model is a folder holding config.json and either model.safetensors or a sharded
 * model.safetensors.index.json with the shards it names; or a file X.safetensors (or
 * X.safetensors.index.json) with config.json in the same folder. */

/* transformers' default shard size, "5GB" (save_pretrained's max_shard_size). */
#define MPT_ST_DEFAULT_SHARD_NBYTES INT64_C(5000000000)

/* How mpt_st_write_model writes. */
typedef struct mpt_st_save_options {
  mpt_st_dtype dtype;   /* MPT_ST_F32 (default) or MPT_ST_BF16 */
  int64_t shard_nbytes; /* a folder's largest shard, in tensor bytes (>= 1; default 5e9) */
} mpt_st_save_options;

/* The defaults: F32, MPT_ST_DEFAULT_SHARD_NBYTES. */
MPT_API mpt_st_save_options mpt_st_save_options_default(void);

/* Parses a size: a whole number >= 1 with an optional unit, B, KB, MB, GB, TB (powers of
 * 1000, as transformers' "5GB") or KiB, MiB, GiB, TiB (powers of 1024), any case: "5GB" is
 * 5,000,000,000. Errors: MPT_EINVAL (the text named; overflow, 0, junk). */
MPT_API mpt_status mpt_st_parse_size(const char *text, int64_t *nbytes);

/* 1 when `path` names a safetensors model: ends in ".safetensors" or
 * ".safetensors.index.json", or is a folder holding model.safetensors,
 * model.safetensors.index.json or config.json. */
MPT_API int mpt_st_is_model_path(const char *path);

/* The tensors' file (model.safetensors, or the index) and config.json of the model at `path`,
 * into buffers of cap bytes. Errors: MPT_ENOENT a folder with neither file; MPT_EFORMAT a
 * folder with both (a stale one left by another writer); MPT_EINVAL a path too long. */
MPT_API mpt_status mpt_st_model_paths(const char *path, char *tensors_path, char *config_path,
                                      size_t cap);

/* Opens the tensors of the model at `path` (mpt_st_model_paths): mpt_st_open_index for an
 * index, else mpt_st_open; their errors. */
MPT_API mpt_status mpt_st_open_model(const char *path, mpt_st_file **out);

/* Writes the n tensors (fill as mpt_st_write_f32) as a model at `path`, and config_json (when
 * not NULL) as its config.json. A file path: that one file, whatever its size. An existing
 * folder: path/model.safetensors when the tensors' bytes fit opts->shard_nbytes; otherwise
 * shards as transformers' save_pretrained: tensors in order, each in the current shard unless
 * it would pass the size (then the next; a larger tensor alone), named
 * model-00001-of-0000K.safetensors, then model.safetensors.index.json ({"metadata":
 * {"total_size": <tensor bytes>}, "weight_map": {...}}), then the files of the model it
 * replaces are removed (model.safetensors, or the index and shards of another count). Every
 * file atomically; each shard carries meta. opts NULL: the defaults. Errors: those of
 * mpt_st_write; MPT_EINVAL more than 99999 shards, shard_nbytes < 1, a path ending in
 * ".index.json" (give the folder); MPT_EIO. */
MPT_API mpt_status mpt_st_write_model(const char *path, const mpt_st_write_tensor *tensors,
                                      int n, const char *const *meta, int nmeta,
                                      const char *config_json, const mpt_st_save_options *opts,
                                      mpt_st_fill_fn fill, void *ctx);

/* ---- GPT-2 (transformers' GPT2LMHeadModel) ----
 * A model as above (mpt_st_model_paths: one file or shards). config.json gives n_layer, n_head,
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
 * missing one, or a shape that differs is refused naming it. F32, BF16 and F16 are read; when
 * config.json names a dtype (torch_dtype, or dtype), every tensor must be of it. */

/* mpt_st_is_model_path(path). (mpt_gpt_file_write also takes any directory as a model.) */
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

/* Writes params (llm.c's order, layout.total floats) as a GPT-2 model at `path` with
 * mpt_st_write_model (a file, or a folder: model.safetensors or shards), F32 or BF16 as opts
 * says (NULL: F32, 5 GB shards), and config.json (its torch_dtype the dtype written). wte's rows
 * past V are not written. Metadata {"format": "pt"} (what transformers expects). Errors: those
 * of mpt_gpt_layout_compute and mpt_st_write_model. */
MPT_API mpt_status mpt_gpt_st_write(const char *path, const mpt_gpt_config *config,
                                    const float *params, const mpt_st_save_options *opts);

/* As mpt_gpt_save (gpt_file.h), but opts non-NULL writes a Hugging Face safetensors model at
 * `path` (a file or a folder, mpt_gpt_st_write: its dtype and shard size) whatever its name;
 * NULL is mpt_gpt_save. The model's parameters are staged on the host (4 N bytes) by
 * mpt_gpt_params_copy (transformer.h). The same errors, and mpt_gpt_st_write's. */
MPT_API mpt_status mpt_gpt_save_safetensors(mpt_model *model, const mpt_gpt_config *config,
                                            const char *path, const mpt_st_save_options *opts);

#ifdef __cplusplus
}
#endif

#endif /* MPITRAIN_SAFETENSORS_H */
