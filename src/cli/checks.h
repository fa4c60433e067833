/* The program's checks before a model is built (src/cli/checks.c). */
#ifndef MPT_CLI_CHECKS_H
#define MPT_CLI_CHECKS_H

#include "cli/options.h"
#include "mpitrain/comm.h"
#include "mpitrain/transformer.h"

/* An mlp or cnn on the CPU: parameters, gradients and optimizer state, per DataParallel
 * replica (ndev), within the host's available memory shared by its ranks. Errors: MPT_ENOMEM
 * naming both sizes. */
mpt_status mpt_cli_check_model_fits(const mpt_cli_options *o, mpt_comm *comm, int ndev);
/* A GPT on the CPU: MPT_ENOMEM (naming the sizes, the bound and the host's memory) when a lower
 * bound of one rank's memory times `local_ranks` exceeds the host's memory limit; MPT_OK when it
 * fits or the limit is unknown; MPT_EINVAL for an invalid config. `windows`: the training and
 * validation windows (the samplers hold 8 bytes for each). */
mpt_status mpt_cli_gpt_check_memory(const mpt_cli_options *o, const mpt_gpt_config *cfg,
                                    int world, int local_ranks, int64_t windows);
/* The same lower bound for a Llama (llama.h) of `cfg`: its parameters, gradients and optimizer
 * state, and per token and layer the 11 C + 2 KV hd + 3 F values its forward keeps. */
mpt_status mpt_cli_llama_check_memory(const mpt_cli_options *o, const mpt_llama_config *cfg,
                                      int world, int local_ranks, int64_t windows);
/* mpitrain generate, before the model's allocations: MPT_ENOMEM (naming the file, the sizes,
 * the bound and the host's memory) when a lower bound of what sampling from `cfg` with a context
 * of `context` tokens takes exceeds the host's memory limit; MPT_EINVAL for a bad config. */
mpt_status mpt_cli_gpt_check_generate_memory(const char *path, const mpt_gpt_config *cfg,
                                             int64_t context);
/* The same for a Llama of `cfg` (its parameters, gradients, one tensor's staging, logits). */
mpt_status mpt_cli_llama_check_generate_memory(const char *path, const mpt_llama_config *cfg,
                                               int64_t context);
/* --save-model's path, if it exists, must hold an llm.c model file (or nothing), and the
 * writer's temporary file can be created beside it: MPT_EINVAL naming what it holds (a token
 * shard, a checkpoint, anything else), so that a slip of the path does not replace the data. */
mpt_status mpt_cli_gpt_check_save_model(const char *path);

#endif
