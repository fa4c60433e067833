/* Llama models as Hugging Face safetensors + config.json (transformers' LlamaForCausalLM):
 * the config read into an mpt_llama_config, the tensors checked and read into a Llama model
 * (llama.h), and the model written back, one file or shards, fp32 or bf16 (safetensors.h).
 *
 * A model is a folder holding config.json and model.safetensors (or a sharded
 * model.safetensors.index.json and its shards), or a file X.safetensors (or
 * X.safetensors.index.json) with config.json beside it (mpt_st_model_paths).
 *
 * config.json (transformers' LlamaConfig keys; mpitrain's field):
 *   hidden_size (dim), intermediate_size (ffn_dim), num_hidden_layers (n_layers),
 *   num_attention_heads (n_heads), num_key_value_heads (n_kv_heads; absent: n_heads, as
 *   transformers), vocab_size, max_position_embeddings (max_seq_len), rope_theta (absent:
 *   10000; or rope_parameters' rope_theta, as transformers 5 writes it, the two equal when both
 *   are given), RoPE's scaling (rope_scaling): rope_scaling (transformers 4) when given and not
 *   null, else rope_parameters (transformers 5), each with rope_type (or "type") absent or
 *   "default" (none) or "llama3" (Llama 3.1 / 3.2's, with factor, low_freq_factor,
 *   high_freq_factor and original_max_position_embeddings, all required and in
 *   mpt_rope_scaling_check's ranges), rms_norm_eps (absent: 1e-6), tie_word_embeddings
 *   (absent: false), and, checked: head_dim (absent, null or hidden_size /
 *   num_attention_heads), the other RoPE types ("linear", "dynamic", "yarn", ...: not
 *   implemented, refused, named), hidden_act (absent or "silu"),
 *   attention_bias and mlp_bias (absent or false), model_type (absent or "llama"), torch_dtype
 *   or dtype (when given, every tensor's). Refused too, naming the key: a missing required key,
 *   a value of the wrong type or range, num_attention_heads not a multiple of
 *   num_key_value_heads, and a config mpt_llama_config_check refuses (its message).
 *
 * Tensors: the names and shapes of llama.h (model.embed_tokens.weight [V, C],
 * model.layers.<l>.self_attn.{q,k,v,o}_proj.weight, ..., model.norm.weight [C],
 * lm_head.weight [V, C] when untied). Hugging Face's Linear weights are [out, in] as
 * mpitrain's: no transposes. A tied model's file has no lm_head.weight (save_pretrained drops
 * it); one there is accepted and not read. The rotary_emb.inv_freq buffers older files hold are
 * accepted and not read. Any other tensor, a missing one, a shape or dtype that differs is
 * refused naming it. F32, BF16 and F16 are read. Runs on the calling thread. */
#ifndef MPITRAIN_LLAMA_FILE_H
#define MPITRAIN_LLAMA_FILE_H

#include "mpitrain/core.h"
#include "mpitrain/llama.h"
#include "mpitrain/safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when `path` is a safetensors model (mpt_st_is_model_path) whose config.json says it is a
 * Llama: model_type "llama", or architectures naming LlamaForCausalLM; 0 otherwise (also when
 * config.json cannot be read: the reader then says why). */
MPT_API int mpt_llama_st_is_model(const char *path);

/* The config of the Llama at `path` (config.json, as above), checked against its safetensors
 * header(s): every tensor's presence, dtype and shape, no unknown tensor. Reads no tensor data.
 * Errors: MPT_ENOENT (config.json or the tensors' file missing); MPT_EFORMAT (config.json or a
 * header invalid, naming the key or the tensor and the file); MPT_EIO; MPT_ENOMEM; MPT_EINVAL
 * (NULL arguments). */
MPT_API mpt_status mpt_llama_st_read_header(const char *path, mpt_llama_config *config);

/* Writes config.json's text for `config` into buf[cap] (transformers' LlamaConfig keys, the
 * RoPE both as rope_theta (transformers 4) and rope_parameters (5), its scaling both as
 * rope_scaling (4; null when unscaled) and in rope_parameters (5), architectures
 * ["LlamaForCausalLM"], torch_dtype of `dtype`; floats printed with the fewest
 * digits that read back as the same float). Errors: MPT_EINVAL (NULL, a bad config, cap too
 * small). */
MPT_API mpt_status mpt_llama_st_config_json(const mpt_llama_config *config, mpt_st_dtype dtype,
                                            char *buf, size_t cap);

/* Reads the Llama at `path` into `model`, a finalised Llama of `config`
 * (mpt_llama_check_model): the file's config must equal `config` (every field, rope_scaling's
 * too; rope_theta and norm_eps as floats), then each parameter is read by name. Non-finite values are refused
 * (naming the tensor). Errors: those of
 * mpt_llama_st_read_header; MPT_ESHAPE (the model or the file's config differs from `config`,
 * naming the field); MPT_EFORMAT (a non-finite weight); MPT_ENOMEM; errors of the copy. */
MPT_API mpt_status mpt_llama_load(mpt_model *model, const mpt_llama_config *config,
                                  const char *path);

/* Writes `model` (a finalised Llama of `config`) as safetensors at `path` with
 * mpt_st_write_model (a file, or a folder: model.safetensors or shards; opts NULL: F32, 5 GB
 * shards) and config.json beside it, each atomically. Metadata {"format": "pt"}. The tensors in
 * the model's order; a tied model writes no lm_head.weight. Errors: MPT_EINVAL, MPT_ESHAPE (not
 * a Llama of `config`), errors of mpt_st_write_model. */
MPT_API mpt_status mpt_llama_save(mpt_model *model, const mpt_llama_config *config,
                                  const char *path, const mpt_st_save_options *opts);

#ifdef __cplusplus
}
#endif

#endif /* MPITRAIN_LLAMA_FILE_H */
