/* mpitrain ckpt: checkpoints. A versioned, checksummed binary file holding a model's parameters
 * and buffers, an optimizer's state, and the training position (epoch, step, RNG and sampler
 * state), written atomically; plus the directory management (keep the last K, find the latest)
 * and the collective wrappers a data-parallel job uses (rank 0 writes, every rank loads).
 *
 * File format, version 2 (version 1 is version 2 without the "resume" block; both are read).
 * Every integer is little-endian of the stated width; floats are raw IEEE-754 float32 in
 * little-endian byte order. Offsets in bytes.
 *
 *   preamble   0  8   magic "MPTCKPT\0"
 *              8  4   u32 format version (MPT_CKPT_VERSION)
 *             12  4   u32 flags (0; reserved)
 *             16  8   u64 file size in bytes, the trailing CRC included
 *   meta      24  8   i64 epoch
 *                 8   i64 global_step
 *                 8   i64 step_in_epoch
 *                 8   i64 sampler_epoch
 *                 8   u64 seed
 *                 4   i32 world_size
 *                 4   u32 num_rngs (<= MPT_CKPT_MAX_RNGS)
 *                32n  u64 s[4] of each mpt_rng
 *   resume        8   i64 global_batch    (version 2; absent in version 1: the fields read as 0)
 *                 8   i64 epoch_cursor
 *                 8   i64 epoch_samples
 *                 8   i64 dataset_count
 *                 8   i64 batch_size
 *                 4   i32 accumulate
 *                 4   u32 reserved (0)
 *   signature     4   u32 number of parameters P
 *                 4   u32 number of buffers B
 *                 P+B entries, parameters then buffers, in registration order:
 *                     u32 name length L (1..MPT_CKPT_MAX_NAME), L name bytes (no NUL),
 *                     u32 dtype (mpt_dtype), u32 ndim (0..MPT_MAX_DIMS), i64 shape[ndim]
 *                 8   u64 parameter element count (sum over the parameters)
 *                 8   u64 buffer element count (sum over the buffers)
 *   optimizer     4   u32 kind (mpt_optim_kind; 0xFFFFFFFF: no optimizer state)
 *                 4   u32 number of state buffers S (<= MPT_OPTIM_MAX_STATE)
 *                 8   i64 step count
 *                 8   u64 elements per state buffer C
 *                 S   names: u32 length L, L bytes ("momentum_buffer", "exp_avg", ...)
 *   data              float32 parameters [parameter count], flat, in registration order
 *                     float32 buffers [buffer count]
 *                     float32 state buffer s [C], for s = 0..S-1
 *   trailer       4   u32 CRC-32 (zlib crc32, ISO-HDLC polynomial) of every byte before it
 *
 * A reader checks, in this order and before it touches the model: the file is at least as long
 * as the preamble; the magic; the version (newer than this build: an error naming both
 * versions); the file's real length against the size in the preamble (truncation: an error
 * naming the expected and the actual byte counts); the CRC; every length field against the
 * bytes that remain (nothing is allocated from a length read from the file: staging memory is
 * sized from the model and optimizer, after the file was found to describe exactly those); the
 * signature against the model (an error naming the first parameter or buffer that differs and
 * how); the optimizer kind, state names and sizes. Only then are the values copied to the
 * model's and optimizer's device. A corrupt file is an error, never a crash or garbage.
 *
 * Writing: mpt_ckpt_save writes "<path>.tmp.<pid>", flushes and fsyncs it, renames it over
 * <path>, then fsyncs the directory, so <path> is always either the old complete checkpoint or
 * the new complete one, whatever happens to the process (or the node) during the write. A stale
 * temporary file from a killed writer is harmless: readers and mpt_ckpt_find_latest ignore it.
 *
 * Fault injection (for the kill tests; only in a library configured with
 * --enable-fault-injection, which `./setup.sh check` uses: other builds ignore the variable):
 * when the environment variable MPT_TEST_CKPT_KILL is "mid-write" the writer sends itself
 * SIGKILL after writing half of the data to the temporary file; "before-rename" does so after
 * the temporary file is complete and fsynced, just before the rename. The trainer's background
 * writes (--checkpoint-async on) also stop at "snapshot" (rank 0's copy into host memory
 * taken), "before-fsync" (the temporary file written, not flushed) and "after-rename"; and
 * MPT_TEST_CKPT_FAIL=rename makes their rename fail with MPT_EIO.
 *
 * Devices and streams: the model's and optimizer's memory is read and written with
 * mpt_op_memcpy through host staging, on a temporary inline stream of their device that is
 * synchronized before the call returns (CPU: the calling thread). The caller must make sure no
 * work that touches the parameters, buffers or optimizer state is still pending on its own
 * streams (synchronize the compute stream and finish the DDP step first).
 *
 * Thread rules: the calls are independent of each other and keep no global state; one model or
 * optimizer must not be used by another thread during a save or load. */
#ifndef MPITRAIN_CKPT_H
#define MPITRAIN_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "mpitrain/comm.h"
#include "mpitrain/core.h"
#include "mpitrain/nn.h"
#include "mpitrain/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The format version this build writes, and the newest it reads. */
#define MPT_CKPT_VERSION 2u
/* Most RNG states a checkpoint carries. */
#define MPT_CKPT_MAX_RNGS 8
/* Longest parameter, buffer or state name in bytes (a longer name is refused when saving). */
#define MPT_CKPT_MAX_NAME 1024
/* The optimizer kind stored when a checkpoint has no optimizer state. */
#define MPT_CKPT_NO_OPTIMIZER 0xFFFFFFFFu

/* The training position saved next to the tensors. The library stores and returns these
 * values; it checks their ranges (below) but gives them no meaning: the trainer does. */
typedef struct mpt_ckpt_meta {
  int64_t epoch;         /* the epoch in progress, from 0; >= 0 */
  int64_t global_step;   /* optimizer steps taken since the start of training; >= 0 */
  int64_t step_in_epoch; /* steps of `epoch` already taken (0: at its start); >= 0 */
  int64_t sampler_epoch; /* mpt_sampler_epoch of the training sampler; >= 0 */
  uint64_t seed;         /* the run's seed */
  int32_t world_size;    /* ranks that trained; >= 1 */
  int32_t num_rngs;      /* rngs[0..num_rngs) are stored; 0..MPT_CKPT_MAX_RNGS */
  mpt_rng rngs[MPT_CKPT_MAX_RNGS];
  /* Version 2: what a resume on another number of ranks needs (docs/checkpoints.md). A
   * version-1 file reads as 0 in each (not recorded); every field >= 0. */
  int64_t global_batch;  /* G: data samples per optimizer step over all ranks (world size x
                            samples per micro-batch x accumulate) */
  int64_t epoch_cursor;  /* data samples of `epoch` consumed: step_in_epoch x G, at most
                            epoch_samples */
  int64_t epoch_samples; /* real data samples an epoch trains on (the data set, less what
                            drop_last drops) */
  int64_t dataset_count; /* training samples in the data set */
  int64_t batch_size;    /* rows per micro-batch per rank (the trainer's batch_size) */
  int32_t accumulate;    /* micro-batches per optimizer step */
  uint32_t format_version; /* set by the readers to the file's version; the writer ignores it
                              and writes MPT_CKPT_VERSION */
} mpt_ckpt_meta;

/* The meta of a run that has not started: all zero, world_size 1. */
MPT_API mpt_ckpt_meta mpt_ckpt_meta_default(void);

/* ---- one file --------------------------------------------------------------------------- */

/* Writes a checkpoint of `model` (finalised; its parameters and buffers), `optimizer` (may be
 * NULL: the file then has no optimizer state) and `meta` (NULL: mpt_ckpt_meta_default()) to
 * `path`, atomically (see "Writing" above); the directory must exist.
 * Errors: MPT_EINVAL (NULL path or model, a meta field out of range, a name longer than
 * MPT_CKPT_MAX_NAME, an optimizer whose state is not on the model's device); MPT_ESTATE (model
 * not finalised); MPT_EIO naming the file and the system error (open, write, fsync, rename);
 * MPT_ENOMEM; errors of the device copy. On error <path> is unchanged and the temporary file is
 * removed (unless the process was killed). */
MPT_API mpt_status mpt_ckpt_save(const char *path, mpt_model *model, mpt_optimizer *optimizer,
                                 const mpt_ckpt_meta *meta);

/* Reads the checkpoint at `path` into `model` (finalised, on any device: the values are copied
 * onto the model's own device), `optimizer` (may be NULL: the file's optimizer state, if any,
 * is then ignored; otherwise it must have been created with the same kind and count, and the
 * file must hold state for it; its step count is restored too) and `meta` (may be NULL).
 * Everything is validated before anything is written (see above); on error the model,
 * optimizer and *meta are unchanged.
 * Errors: MPT_ENOENT (no such file); MPT_EIO (cannot open or read, naming the system error);
 * MPT_EFORMAT (too short, bad magic, truncated: "expected N bytes, file has M", CRC mismatch,
 * a malformed field); MPT_ENOTSUP (the file's format version is newer than this build's, or 0:
 * the detail names both); MPT_ESHAPE (the file is of a different model or optimizer: the detail
 * names the first parameter or buffer that differs and how, e.g. "parameter 2 'fc2.weight':
 * shape [10, 64] in the checkpoint, [10, 32] in the model", or the optimizer kind / state);
 * MPT_EINVAL (NULL path or model); MPT_ESTATE (model not finalised); MPT_ENOMEM; errors of the
 * device copy. */
MPT_API mpt_status mpt_ckpt_load(const char *path, mpt_model *model, mpt_optimizer *optimizer,
                                 mpt_ckpt_meta *meta);

/* Validates the whole file (everything mpt_ckpt_load checks except the fit to a model) and
 * returns its meta (meta may be NULL); *has_optimizer (may be NULL) tells whether it holds
 * optimizer state. Errors as mpt_ckpt_load, without MPT_ESHAPE and MPT_ESTATE (MPT_EINVAL:
 * NULL path). */
MPT_API mpt_status mpt_ckpt_read_meta(const char *path, mpt_ckpt_meta *meta, int *has_optimizer);

/* What a checkpoint file holds, as `mpitrain ckpt info` prints it: everything but the values. */
typedef struct mpt_ckpt_info {
  mpt_ckpt_meta meta;       /* the training position (meta.format_version: the file's version) */
  uint64_t file_nbytes;     /* the file's size, the trailing CRC included */
  uint32_t crc;             /* the CRC-32 stored in the trailer (verified equal to the bytes') */
  int32_t num_params;       /* parameter tensors */
  int32_t num_buffers;      /* buffer tensors */
  uint64_t param_count;     /* parameter elements (float32), over all parameter tensors */
  uint64_t buffer_count;    /* buffer elements */
  uint32_t optimizer_kind;  /* an mpt_optim_kind, or MPT_CKPT_NO_OPTIMIZER */
  int32_t optimizer_nbuffers; /* optimizer state buffers (momentum_buffer, exp_avg, ...) */
  int64_t optimizer_step_count;
  uint64_t optimizer_count; /* elements per optimizer state buffer */
} mpt_ckpt_info;

/* Validates the whole file like mpt_ckpt_read_meta (the CRC over every byte included) and
 * fills *info. Errors as mpt_ckpt_read_meta; MPT_EINVAL also for a NULL info. On error *info
 * is unchanged. */
MPT_API mpt_status mpt_ckpt_read_info(const char *path, mpt_ckpt_info *info);

/* ---- a directory of checkpoints ------------------------------------------------------------
 * Files are written as "ckpt-step<N>.mpt" with N = meta->global_step, zero-padded to at least
 * 8 digits (ckpt-step00001200.mpt), so that they also sort by name. Only names "ckpt-step" +
 * decimal digits + ".mpt" count as checkpoints, ordered by the number; temporary files
 * ("...mpt.tmp.<pid>") and anything else in the directory are ignored and never deleted. */

/* Writes <dir>/ckpt-step<N>.mpt with mpt_ckpt_save (creating dir, and its parents, if needed),
 * then, if keep_last_k > 0, deletes the checkpoints of the directory beyond the keep_last_k
 * with the highest steps, never the file just written (keep_last_k <= 0 keeps everything). A
 * failed deletion is logged as a warning and does not fail the call; so is a checkpoint of a
 * higher step than the one written (left by an earlier run: mpt_ckpt_find_latest would pick
 * it). path_out (may be NULL) receives the path written (path_nbytes
 * bytes, always NUL-terminated). Errors: those of mpt_ckpt_save; MPT_EIO (cannot create dir);
 * MPT_EINVAL (NULL dir, path longer than path_nbytes or PATH_MAX); MPT_ENOMEM (the listing). */
MPT_API mpt_status mpt_ckpt_save_dir(const char *dir, int keep_last_k, mpt_model *model,
                                     mpt_optimizer *optimizer, const mpt_ckpt_meta *meta,
                                     char *path_out, size_t path_nbytes);

/* The path of the checkpoint with the highest step in `dir`, into buf[nbytes]. It is not
 * opened: mpt_ckpt_load validates it. Errors: MPT_ENOENT (dir missing or without a
 * checkpoint); MPT_EIO (cannot read dir); MPT_EINVAL (NULL arguments, buf too small);
 * MPT_ENOMEM. */
MPT_API mpt_status mpt_ckpt_find_latest(const char *dir, char *buf, size_t nbytes);

/* For --resume FILE|DIR: a directory gives mpt_ckpt_find_latest, anything else is copied as
 * is. Errors: those of mpt_ckpt_find_latest; MPT_ENOENT (path does not exist); MPT_EIO (stat
 * failed otherwise); MPT_EINVAL (NULL arguments, nbytes 0, a path longer than buf). */
MPT_API mpt_status mpt_ckpt_resolve(const char *path, char *buf, size_t nbytes);

/* ---- data-parallel wrappers (collective: every rank of comm calls them, in the same order) --
 * Both use the comm's synchronous collectives (mpt_comm_*_sync), so they block and have the
 * comm's deadline. The model, optimizer and meta are every rank's own (replicas are identical
 * under DDP, so rank 0's are the job's). */

/* Rank 0 runs mpt_ckpt_save_dir; its status and error detail are then broadcast from rank 0,
 * followed by a barrier, so that every rank returns the same status: on success every rank
 * knows the file is complete and renamed; when the write failed every rank returns rank 0's
 * status with the detail "rank 0 could not write the checkpoint: <rank 0's detail>". path_out
 * (may be NULL) receives the path on every rank. Errors: rank 0's save errors (on every rank);
 * the comm's errors (MPT_ECOMM, MPT_ETIMEOUT: e.g. rank 0 died); MPT_EINVAL (NULL comm; on
 * other ranks, a path longer than path_nbytes). */
MPT_API mpt_status mpt_ckpt_save_collective(mpt_comm *comm, const char *dir, int keep_last_k,
                                            mpt_model *model, mpt_optimizer *optimizer,
                                            const mpt_ckpt_meta *meta, char *path_out,
                                            size_t path_nbytes);

/* For --resume FILE|DIR under mpirun. Every rank resolves `path` (mpt_ckpt_resolve: a
 * directory means its latest checkpoint), then reads and validates that file as mpt_ckpt_load
 * does, WITHOUT changing its model yet; the ranks then all-gather their
 * status and the file's CRC-32. If any rank failed, no rank touches its model and every rank
 * returns the first failing rank's status, with the detail "rank R could not load the
 * checkpoint: <its detail>" on rank R and "rank R could not load the checkpoint <path>
 * (<status name>; its own log has the detail)" on the others. If the ranks read different
 * files (different CRCs: a directory that is not shared by every host), every rank returns
 * MPT_EMISMATCH naming rank 0's and the other rank's CRC, models untouched. Otherwise every
 * rank copies the values to its device, and a last all-reduce makes sure every copy worked
 * (if one failed, every rank returns its status and must not train: the replicas may then
 * differ). Errors: the above (a rank's own: those of mpt_ckpt_resolve and mpt_ckpt_load);
 * the comm's errors; MPT_EINVAL (NULL comm), MPT_ENOMEM. */
MPT_API mpt_status mpt_ckpt_load_collective(mpt_comm *comm, const char *path, mpt_model *model,
                                            mpt_optimizer *optimizer, mpt_ckpt_meta *meta);

#ifdef __cplusplus
}
#endif

#endif /* MPITRAIN_CKPT_H */
