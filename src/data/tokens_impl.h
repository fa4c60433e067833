/* Internal helpers shared by the token shard reader (tokens.c) and the window data
 * (token_data.c). */
#ifndef MPT_DATA_TOKENS_IMPL_H
#define MPT_DATA_TOKENS_IMPL_H

#include "mpitrain/data.h"

/* Opens a shard and checks magic, version, count and size; on success *fd is open (the caller
 * closes it) and *count = N. Errors as mpt_token_shard_read_header; *fd = -1 on error. */
mpt_status mpt__shard_open(const char *path, int *fd, int64_t *count);
/* pread of exactly nbytes at offset (64-bit), retrying short reads. Errors: MPT_EIO naming the
 * file and the offset (also when the file ends early). */
mpt_status mpt__shard_pread(int fd, const char *path, void *buf, int64_t nbytes, int64_t offset);
/* Decodes `count` little-endian uint16 tokens from bytes, checking each below vocab_size; the
 * first one is token `first_token` of the shard (for the message). Writes them to out16 and / or
 * out32 (either may be NULL). Errors: MPT_EFORMAT naming the file, token index, byte offset
 * and value. */
mpt_status mpt__shard_check_tokens(const char *path, const uint8_t *bytes, int64_t count,
                                   int64_t first_token, int vocab_size, uint16_t *out16,
                                   int32_t *out32);

#endif
