/* mpitrain data: IDX files (the MNIST / Fashion-MNIST format), in-memory datasets, the
 * distributed sampler, and the batch loader with a prefetch thread.
 *
 * Pipeline: mpt_dataset (all samples in host memory, normalised float32 [N, C, H, W] plus int32
 * labels [N]) -> mpt_sampler (which sample indices this rank sees in an epoch, PyTorch
 * DistributedSampler semantics) -> mpt_loader (copies the sampled rows into batch buffers on a
 * background thread while the caller trains on the previous batch). A user's own data enters
 * the same pipeline as an mpt_data_source (callbacks: count, sample shape and dtype, "read
 * sample i"), which is also what the loader reads an mpt_dataset through.
 *
 * Padding and evaluation: without drop_last the sampler pads the index list so that every rank
 * gets the same number of samples (so no rank runs out of batches before the others, F03). The
 * padding positions are always at the END of a rank's list, so each rank knows how many of its
 * samples are real: mpt_sampler_num_real(), and per batch mpt_batch.num_real (rows
 * [0, num_real) are real, rows [num_real, count) are repeats). An evaluation that sums metrics
 * over only the real rows counts every sample of the dataset exactly once across the ranks
 * (docs/faults.md F01).
 *
 * Thread rules: a dataset is read-only after it is loaded and may be shared by any number of
 * threads and loaders. A sampler is not thread-safe; while a loader uses it, change its epoch
 * only through mpt_loader_start_epoch. A loader is driven by one thread. */
#ifndef MPITRAIN_DATA_H
#define MPITRAIN_DATA_H

#include "mpitrain/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------------------ */
/* IDX files                                                                                  */

/* Format (LeCun et al., "THE MNIST DATABASE of handwritten digits", file format section):
 * a big-endian 32-bit magic 0x0000TTDD (TT element type, DD number of dimensions), DD big-endian
 * 32-bit extents, then the elements in row-major order. Only type 0x08 (unsigned byte) is read:
 * images are magic 0x00000803 [N, rows, cols], labels 0x00000801 [N]. */
#define MPT_IDX_MAX_DIMS 4
/* Each extent must be in [1, MPT_IDX_MAX_EXTENT] and the data at most MPT_IDX_MAX_NBYTES, so a
 * corrupt header can never make the reader allocate more than that (memory grows with what the
 * file really holds, never ahead of it). */
#define MPT_IDX_MAX_EXTENT 1000000000LL
#define MPT_IDX_MAX_NBYTES (8LL << 30)

/* The contents of an IDX file (mpt_idx_read). */
typedef struct mpt_idx {
  int ndim;
  int64_t shape[MPT_IDX_MAX_DIMS]; /* extents, shape[0] = number of items */
  int64_t count;                   /* product of shape = data bytes */
  uint8_t *data;                   /* [count], owned (free with mpt_idx_free) */
} mpt_idx;

/* Reads an IDX file of unsigned bytes, gzip-compressed or plain (zlib's gzread reads both), in
 * chunks. `expected_ndim` is the required number of dimensions (1 for labels, 3 for images), or
 * 0 to accept any from 1 to MPT_IDX_MAX_DIMS. On success *idx owns the data.
 * Errors (the detail always names the file): MPT_ENOENT the file does not exist; MPT_EIO it
 * cannot be opened or read (not a regular file, permission, corrupt gzip stream); MPT_EFORMAT
 * empty file, short header, wrong magic / element type / number of dimensions, an extent of 0
 * or above the limits, data shorter than the header says (names expected and got bytes), bytes
 * after the data (names how many); MPT_ENOMEM; MPT_EINVAL NULL path or idx, expected_ndim
 * outside 0..MPT_IDX_MAX_DIMS. On error *idx is zeroed. */
MPT_API mpt_status mpt_idx_read(const char *path, int expected_ndim, mpt_idx *idx);
/* Frees the data and zeroes the struct. NULL or a zeroed struct is a no-op. */
MPT_API void mpt_idx_free(mpt_idx *idx);

/* ------------------------------------------------------------------------------------------ */
/* Datasets                                                                                   */

/* Fashion-MNIST training-set pixel statistics on [0, 1] pixels (Xiao et al. 2017 data,
 * computed over the 60000 training images). */
#define MPT_FASHION_MNIST_MEAN 0.2860f
#define MPT_FASHION_MNIST_STD 0.3530f
#define MPT_FASHION_MNIST_CLASSES 10

/* A dataset held in host memory. A plain struct: read its fields, do not change them. */
typedef struct mpt_dataset {
  mpt_tensor images; /* F32 [N, C, H, W] on the CPU, (pixel / 255 - mean) / std */
  mpt_tensor labels; /* I32 [N] on the CPU, each in [0, num_classes) */
  int64_t count;     /* N */
  int channels, height, width;
  int num_classes;
  float mean, std; /* the normalisation that was applied */
} mpt_dataset;

/* mpt_dataset_load_idx's settings: start from mpt_dataset_config_default(). */
typedef struct mpt_dataset_config {
  float mean;      /* subtracted from pixel / 255 (default MPT_FASHION_MNIST_MEAN) */
  float std;       /* then divided by this, > 0 (default MPT_FASHION_MNIST_STD) */
  int num_classes; /* labels must be below this (default 10) */
  int64_t limit;   /* keep only the first `limit` samples; 0 = all (default 0). The whole
                      file is still read and validated. */
} mpt_dataset_config;

/* The defaults noted on each field (Fashion-MNIST normalisation, 10 classes, all samples). */
MPT_API mpt_dataset_config mpt_dataset_config_default(void);

/* Loads an images file (IDX ubyte, [N, H, W] giving C = 1, or [N, C, H, W]) and a labels file
 * (IDX ubyte [N]). `config` NULL means the defaults. On success *ds owns its tensors.
 * Errors: those of mpt_idx_read; MPT_ESHAPE the two files hold different numbers of items (names
 * both files and counts); MPT_EFORMAT a label >= num_classes (names the file, the index and the
 * value), or an images file of other than 3 or 4 dimensions; MPT_EINVAL bad config (std <= 0,
 * num_classes < 1, limit < 0) or NULL arguments; MPT_ENOMEM.
 * On error *ds is zeroed. */
MPT_API mpt_status mpt_dataset_load_idx(const char *images_path, const char *labels_path,
                                        const mpt_dataset_config *config, mpt_dataset *ds);

/* Loads a Fashion-MNIST split from `dir`: split "train" reads train-images-idx3-ubyte and
 * train-labels-idx1-ubyte, "test" the t10k-* files; each name is tried with ".gz" first, then
 * without. `dir` NULL means mpt_data_default_dir(). Errors: MPT_ENOENT the folder or a file is
 * missing (the message names the path and says "install Debian's dataset-fashion-mnist package
 * (apt-get install dataset-fashion-mnist) or pass --data DIR"); MPT_EINVAL an unknown or NULL
 * split, a NULL ds, a folder path too long; everything mpt_dataset_load_idx returns. */
MPT_API mpt_status mpt_dataset_load_fashion_mnist(const char *dir, const char *split,
                                                  const mpt_dataset_config *config,
                                                  mpt_dataset *ds);

/* The folder of Debian's dataset-fashion-mnist package (/usr/share/datasets/fashion-mnist) if
 * all four of its files are there and readable, else NULL. A static string; thread-safe. */
MPT_API const char *mpt_data_default_dir(void);

/* Makes a dataset of `count` random samples for benchmarks and tests: images uniform in
 * [-1, 1), labels uniform in [0, num_classes), both drawn from an mpt_rng seeded with `seed`
 * (the same seed gives the same data). mean = 0, std = 1 are recorded. The caller may
 * overwrite images.data / labels.data afterwards (labels must stay in range).
 * Errors: MPT_EINVAL count < 0 or a non-positive extent or num_classes; MPT_ENOMEM. */
MPT_API mpt_status mpt_dataset_init_synthetic(mpt_dataset *ds, int64_t count, int channels,
                                              int height, int width, int num_classes,
                                              uint64_t seed);

/* Frees the tensors and zeroes the struct. NULL or a zeroed struct is a no-op. */
MPT_API void mpt_dataset_free(mpt_dataset *ds);

/* Floats per sample: C * H * W. */
MPT_API int64_t mpt_dataset_sample_count(const mpt_dataset *ds);

/* ------------------------------------------------------------------------------------------ */
/* Distributed sampler                                                                        */

/* Semantics of PyTorch's torch.utils.data.DistributedSampler (v1.13), N samples, W replicas:
 * - order: 0..N-1, or with shuffle a Fisher-Yates permutation drawn from an mpt_rng seeded by a
 *   hash of (seed, epoch) alone, so every rank computes the same order for the same epoch;
 * - without drop_last: num_samples = ceil(N / W); the order is padded to num_samples * W by
 *   wrapping around to its front (repeating it whole as often as needed when W > N), so padded
 *   position p holds order[p mod N];
 * - with drop_last: num_samples = floor(N / W); the order is truncated to num_samples * W;
 * - rank r takes positions r, r + W, r + 2W, ... of the padded list.
 * Position p is padding iff p >= N; for a rank these are the last positions of its list.
 * W = 1, rank 0 is the plain sequential (shuffle 0) or random (shuffle 1) sampler.
 * Example (docs/faults.md F01), N = 10, W = 4, no shuffle: r0 {0,4,8} r1 {1,5,9} r2 {2,6,0}
 * r3 {3,7,1} (r2 and r3 have 2 real samples); with drop_last {0,4} {1,5} {2,6} {3,7}. */
typedef struct mpt_sampler mpt_sampler;

/* mpt_sampler_init's settings: start from mpt_sampler_config_default(). */
typedef struct mpt_sampler_config {
  int num_replicas; /* W, the world size, >= 1 (default 1) */
  int rank;         /* in [0, W) (default 0) */
  int shuffle;      /* non-zero: reshuffle every epoch (default 1) */
  uint64_t seed;    /* must be the same on all ranks (default 0) */
  int drop_last;    /* non-zero: drop the tail instead of padding (default 0) */
} mpt_sampler_config;

/* The defaults noted on each field (one replica, shuffled, seed 0, padded). */
MPT_API mpt_sampler_config mpt_sampler_config_default(void);

/* Creates a sampler over `dataset_count` samples (>= 0), at epoch 0. Allocates N indices once.
 * Errors: MPT_EINVAL (num_replicas < 1, rank outside [0, W), dataset_count < 0), MPT_ENOMEM. */
MPT_API mpt_status mpt_sampler_init(mpt_sampler **sampler, int64_t dataset_count,
                                    const mpt_sampler_config *config);
/* NULL is a no-op. */
MPT_API void mpt_sampler_free(mpt_sampler *sampler);

/* Sets the epoch (>= 0) and, with shuffle, redraws the order (O(N)). Call it with the same value
 * on every rank before each epoch, as with PyTorch's set_epoch. Errors: MPT_EINVAL epoch < 0
 * or NULL sampler. */
MPT_API mpt_status mpt_sampler_set_epoch(mpt_sampler *sampler, int64_t epoch);
/* The current epoch. */
MPT_API int64_t mpt_sampler_epoch(const mpt_sampler *sampler);

/* This rank's number of positions (num_samples above), the same on every rank. */
MPT_API int64_t mpt_sampler_num_samples(const mpt_sampler *sampler);
/* How many leading positions of this rank's list are real samples (not padding):
 * min(num_samples, ceil((N - rank) / W)) without drop_last, num_samples with it. Summed over
 * the ranks this is N without drop_last and num_samples * W with it. */
MPT_API int64_t mpt_sampler_num_real(const mpt_sampler *sampler);
/* num_samples * W. */
MPT_API int64_t mpt_sampler_total_size(const mpt_sampler *sampler);
/* N, as given to init. */
MPT_API int64_t mpt_sampler_dataset_count(const mpt_sampler *sampler);
/* A copy of the configuration the sampler was made with. */
MPT_API mpt_sampler_config mpt_sampler_config_get(const mpt_sampler *sampler);

/* The dataset index at position i (0 <= i < num_samples) of this rank's list in the current
 * epoch; -1 when i is out of range. */
MPT_API int64_t mpt_sampler_index(const mpt_sampler *sampler, int64_t i);
/* 1 if position i of this rank's list is padding (a repeat), 0 if real, -1 out of range. */
MPT_API int mpt_sampler_is_padding(const mpt_sampler *sampler, int64_t i);
/* Writes positions [start, start + count) of this rank's list into indices[count].
 * Errors: MPT_EINVAL the range is outside [0, num_samples) or indices is NULL with count > 0. */
MPT_API mpt_status mpt_sampler_fill(const mpt_sampler *sampler, int64_t start, int64_t count,
                                    int64_t *indices);

/* ------------------------------------------------------------------------------------------ */
/* Batch loader                                                                               */

/* Walks a sampler's list for one epoch in batches of batch_size consecutive positions, copying
 * the samples into host buffers allocated once at init. With prefetch a background thread fills
 * batch k + 1 while the caller uses batch k (two buffers, pthread mutex + condition variable);
 * every wait on it has the config's deadline. */
typedef struct mpt_loader mpt_loader;

/* mpt_loader_init's settings: start from mpt_loader_config_default(). */
typedef struct mpt_loader_config {
  int64_t batch_size; /* rows per batch, >= 1 (default 64) */
  int drop_last;      /* non-zero: skip the last batch of the epoch if it is partial (default 0) */
  int prefetch;       /* non-zero: fill batches on a background thread (default 1); zero: fill
                         each batch inside mpt_loader_next on the calling thread */
  double timeout_ms;  /* deadline of every wait on the prefetch thread, > 0 (default 60000) */
} mpt_loader_config;

/* The defaults noted on each field (batch 64, padded last batch, prefetch, 60 s). */
MPT_API mpt_loader_config mpt_loader_config_default(void);

/* One batch: views into the loader's buffers, valid until the next mpt_loader_next,
 * mpt_loader_start_epoch, mpt_loader_reset or mpt_loader_free on the same loader. */
typedef struct mpt_batch {
  mpt_tensor images;             /* F32 [count, C, H, W], CPU (a view); from a data source:
                                    [count, input_shape...] of its input_dtype */
  mpt_tensor labels;             /* I32 [count], CPU (a view); from a data source with
                                    label_count L > 1: [count, L] */
  const int64_t *sample_indices; /* [count] the dataset index of each row */
  int64_t count;                 /* rows in this batch (batch_size, or fewer for the last) */
  int64_t num_real;              /* rows [0, num_real) are real; the rest is sampler padding */
  int64_t index;                 /* batch number within the epoch, from 0 */
  int64_t epoch;
} mpt_batch;

/* mpt_loader_next's return value at the end of an epoch. */
#define MPT_LOADER_END 1

/* Creates a loader over `ds` and `sampler` (both borrowed: they must outlive the loader; the
 * sampler's epoch must then be changed only through the loader). The loader starts at the
 * sampler's current epoch; with prefetch the thread starts filling the first batch at once.
 * Errors: MPT_EINVAL bad config or NULL arguments; MPT_ESHAPE the sampler was made for a
 * different number of samples than ds->count; MPT_ENOMEM; MPT_EIO the thread could not start. */
MPT_API mpt_status mpt_loader_init(mpt_loader **loader, const mpt_dataset *ds,
                                   mpt_sampler *sampler, const mpt_loader_config *config);
/* Stops the prefetch thread (waiting at most timeout_ms for it to finish the batch it is
 * copying) and frees everything; safe mid-epoch. NULL is a no-op. */
MPT_API void mpt_loader_free(mpt_loader *loader);

/* Hands out the next batch of the epoch. Returns MPT_OK (0) with *batch set, MPT_LOADER_END (1)
 * when the epoch has no more batches (again on every later call until a new epoch starts), or
 * a negative status: MPT_ETIMEOUT the prefetch thread did not deliver within timeout_ms, or the
 * error hit while filling this batch (a read of a data source's callback that failed, with
 * the batch and sample named), which is sticky: later calls, start_epoch and reset return it
 * too. Batches before the failing one are handed out normally, with or without prefetch.
 * MPT_EINVAL for a NULL loader or batch. */
MPT_API int mpt_loader_next(mpt_loader *loader, mpt_batch *batch);
/* Starts epoch `epoch` (>= 0): waits for the prefetch thread to go idle, calls
 * mpt_sampler_set_epoch, and restarts from the first batch. Errors: MPT_EINVAL epoch < 0,
 * MPT_ETIMEOUT, a sticky prefetch error. */
MPT_API mpt_status mpt_loader_start_epoch(mpt_loader *loader, int64_t epoch);
/* Restarts the current epoch from its first batch (same order). Errors as start_epoch, and
 * MPT_EINVAL for NULL. */
MPT_API mpt_status mpt_loader_reset(mpt_loader *loader);
/* Batches per epoch: ceil(num_samples / batch_size), or floor with drop_last. */
MPT_API int64_t mpt_loader_num_batches(const mpt_loader *loader);


/* ------------------------------------------------------------------------------------------ */
/* A user's dataset, given as callbacks                                                       */

/* A data source is what the loader reads from: N samples, each an input of a fixed shape and
 * dtype declared up front plus `label_count` int32 labels, read one at a time by a callback.
 * A user's own data (files of another format, data made on the fly, a memory map) goes through
 * the same DistributedSampler and prefetching loader as the built-in datasets, which are one
 * implementation of it (mpt_data_source_init_dataset; mpt_loader_init wraps its dataset so).
 * The equivalent in PyTorch is a map-style torch.utils.data.Dataset (__len__, __getitem__).
 *
 * The callback reads sample `index` (0 <= index < count): it writes the input, row-major,
 * input_nbytes bytes (mpt_data_source_input_nbytes), to `input`, and label_count labels to
 * `label`. It returns MPT_OK, or a negative status after recording a detail with
 * mpt_error_set (a positive return is treated as MPT_EIO). The loader then stops at the batch
 * that holds the sample and hands back that status with a message naming the batch, the
 * sample and the callback's detail (never a hang, see mpt_loader_next). The loader calls it
 * from its prefetch thread (or, without prefetch, from the thread calling mpt_loader_next),
 * one call at a time per loader; a source shared by several loaders gets concurrent calls. */
typedef mpt_status (*mpt_data_read_fn)(void *user, int64_t index, void *input, int32_t *label);

#define MPT_DATA_MAX_DIMS 4 /* dimensions of one sample's input (a batch adds one in front) */

/* What a data source is: start from mpt_data_source_desc_default(); mpt_data_source_init
 * copies it. */
typedef struct mpt_data_source_desc {
  int64_t count;                           /* N, >= 0 */
  mpt_dtype input_dtype;                   /* MPT_F32, MPT_I32 or MPT_U8 */
  int input_ndim;                          /* 1 .. MPT_DATA_MAX_DIMS */
  int64_t input_shape[MPT_DATA_MAX_DIMS];  /* e.g. {C, H, W} for images, {T} for tokens */
  int64_t label_count;                     /* int32 labels per sample, >= 1 */
  int num_classes;                         /* > 0: each label must be in [0, num_classes) (checked
                                              after every read); 0: not checked */
  mpt_data_read_fn read;                   /* required */
  void (*free_user)(void *user);           /* optional: called on `user` by mpt_data_source_free
                                              (also when init fails) */
  void *user;                              /* passed to the callbacks */
} mpt_data_source_desc;

/* A data source (opaque): mpt_data_source_init / mpt_data_source_free. */
typedef struct mpt_data_source mpt_data_source;

/* A zeroed description with label_count 1 and input_dtype MPT_F32: set count, input_ndim,
 * input_shape, read (and user, free_user, num_classes) yourself. */
MPT_API mpt_data_source_desc mpt_data_source_desc_default(void);

/* Creates a source from a description (copied). Errors: MPT_EINVAL naming the field (NULL
 * read, count < 0, input_ndim outside [1, MPT_DATA_MAX_DIMS], an extent < 1, label_count < 1,
 * num_classes < 0, an unsupported dtype, a sample over 2^31 bytes); MPT_ENOMEM. On error
 * *source is NULL and free_user(user) has been called (the source took ownership of user). */
MPT_API mpt_status mpt_data_source_init(mpt_data_source **source,
                                        const mpt_data_source_desc *desc);
/* The in-memory dataset `ds` (borrowed: it must outlive the source) as a source: input F32
 * [C, H, W], one label, labels not re-checked (a loaded dataset was checked when loaded).
 * Errors: MPT_EINVAL (NULL arguments, a dataset with no images tensor and count > 0). */
MPT_API mpt_status mpt_data_source_init_dataset(mpt_data_source **source, const mpt_dataset *ds);
/* Calls free_user(user) once and frees the source. Loaders reading it must be freed first.
 * NULL is a no-op. */
MPT_API void mpt_data_source_free(mpt_data_source *source);
/* The description the source was made with (never NULL for a valid source). */
MPT_API const mpt_data_source_desc *mpt_data_source_get_desc(const mpt_data_source *source);
/* Bytes of one sample's input: product of input_shape times the dtype's size. */
MPT_API int64_t mpt_data_source_input_nbytes(const mpt_data_source *source);
/* Reads sample `index` through the callback and checks its labels, as the loader does.
 * Errors: MPT_EINVAL (index outside [0, N), NULL buffers); the callback's status with a
 * message naming the sample; MPT_EFORMAT a label outside [0, num_classes) (names sample,
 * position and value); MPT_EIO the callback returned a positive value (not a status). */
MPT_API mpt_status mpt_data_source_read(const mpt_data_source *source, int64_t index,
                                        void *input, int32_t *label);

/* A loader over a data source (borrowed: it must outlive the loader), as mpt_loader_init over
 * a dataset. Its batches: images [count, input_shape...] of input_dtype (the inputs, whatever
 * they are), labels I32 [count] when label_count is 1, else [count, label_count]. Errors: as
 * mpt_loader_init (MPT_EINVAL NULL arguments or bad config; MPT_ESHAPE the sampler covers
 * another number of samples than the source; MPT_ENOMEM, also for a batch whose size overflows;
 * MPT_EIO the prefetch thread could not start). */
MPT_API mpt_status mpt_loader_init_source(mpt_loader **loader, const mpt_data_source *source,
                                          mpt_sampler *sampler, const mpt_loader_config *config);

/* ------------------------------------------------------------------------------------------ */
/* Token shards (the llm.c format)                                                            */

/* Format (karpathy/llm.c, dev/data/data_common.py write_datafile): a header of 256
 * little-endian int32 (1024 bytes): [0] magic 20240520, [1] version 1, [2] the token count N
 * (0 <= N <= 2^31 - 1), the other slots 0 (not checked when reading); then N little-endian
 * uint16 token ids. The file is exactly 1024 + 2 N bytes. Offsets are 64-bit: a shard of up to
 * 2^31 - 1 tokens (4 GiB) is read in chunks. */
#define MPT_SHARD_MAGIC 20240520
#define MPT_SHARD_VERSION 1
#define MPT_SHARD_HEADER_NBYTES 1024
#define MPT_SHARD_MAX_TOKENS 2147483647LL

/* A whole token shard in host memory (mpt_token_shard_read). */
typedef struct mpt_token_shard {
  int64_t count;    /* N */
  uint16_t *tokens; /* [N], owned (free with mpt_token_shard_free); NULL when N is 0 */
} mpt_token_shard;

/* Reads and checks a shard's header against the file: *count = N. Reads 1024 bytes only.
 * Errors (the detail names the file): MPT_ENOENT missing; MPT_EIO cannot open or read, not a
 * regular file; MPT_EFORMAT shorter than the header, wrong magic (names it, and the model
 * file's magic 20240326 as such), wrong version, a negative count, a size other than
 * 1024 + 2 N (names both sizes: a truncated shard or bytes after the data); MPT_EINVAL NULL
 * arguments. */
MPT_API mpt_status mpt_token_shard_read_header(const char *path, int64_t *count);
/* Reads a whole shard into memory (in chunks of 1 MiB) and checks every token id against
 * `vocab_size` (1 .. 65536). Errors: those of mpt_token_shard_read_header; MPT_EFORMAT a token
 * id >= vocab_size (names the file, the token's index, its byte offset and value); MPT_EIO a
 * read that fails or comes short (the file shrank); MPT_EINVAL bad arguments; MPT_ENOMEM.
 * On error *shard is zeroed. */
MPT_API mpt_status mpt_token_shard_read(const char *path, int vocab_size, mpt_token_shard *shard);
/* Frees the tokens and zeroes the struct. NULL or a zeroed struct is a no-op. */
MPT_API void mpt_token_shard_free(mpt_token_shard *shard);
/* Writes `count` tokens (0 .. MPT_SHARD_MAX_TOKENS) as a shard, atomically: a temporary file
 * "<path>.tmp.<pid>" that is fsynced and then renamed over `path` (and the directory fsynced),
 * so `path` is never a partial shard. Errors: MPT_EINVAL (count out of range, NULL tokens with
 * count > 0, empty path); MPT_EIO naming the step that failed; MPT_ENOMEM. */
MPT_API mpt_status mpt_token_shard_write(const char *path, const uint16_t *tokens, int64_t count);

/* ------------------------------------------------------------------------------------------ */
/* Language-model data: windows over token shards, for DDP                                    */

/* The shards matching a glob (sorted by name, as glob(3) returns them) read as a sequence of
 * windows of B T + 1 tokens, as in llm.c's data loader: window w of a shard starts at token
 * w B T and holds the inputs x = tokens[0 .. B T) and the next-token targets
 * y = tokens[1 .. B T + 1), each seen as [B, T] (consecutive windows share one token). A
 * shard of N tokens has floor((N - 1) / (B T)) windows (none if N <= B T); windows never
 * cross shard boundaries; windows are numbered over the shards in order. Each rank draws the
 * windows through an mpt_sampler over the window indices (DistributedSampler semantics:
 * shuffled per epoch from (seed, epoch) alone, identically on every rank, rank r taking
 * positions r, r + W, ...; one epoch is one pass over the windows), so each step every rank
 * reads its own window. Shards are opened once (headers and sizes checked) and windows are
 * read with pread(2) at 64-bit offsets when asked for; each window's token ids are checked
 * against the vocabulary as it is read (and all of them at once by mpt_token_data_check_ids).
 * Thread-safe for reads (pread on shared descriptors). */
typedef struct mpt_token_data mpt_token_data;

/* mpt_token_data_init's settings: start from mpt_token_data_config_default(). */
typedef struct mpt_token_data_config {
  int64_t batch_size; /* B, rows per window, >= 1 (default 4) */
  int64_t seq_len;    /* T, >= 1 (default 64) */
  int vocab_size;     /* token ids must be below this, 1 .. 65536 (default 50257) */
} mpt_token_data_config;

/* The defaults noted on each field (B 4, T 64, GPT-2's vocabulary of 50257). */
MPT_API mpt_token_data_config mpt_token_data_config_default(void);

/* Opens every shard matching `pattern` (a glob(3) pattern, or one file name) and checks its
 * header and size (mpt_token_shard_read_header). B T must be at most 2^28.
 * Errors: MPT_EINVAL bad config or NULL arguments; MPT_ENOENT nothing matches the pattern
 * (names it); the errors of mpt_token_shard_read_header (naming the shard); MPT_EFORMAT the
 * shards together hold no window (names the pattern, the total tokens and B T + 1);
 * MPT_ENOMEM; MPT_EIO the glob itself failed. On error *data is NULL. */
MPT_API mpt_status mpt_token_data_init(mpt_token_data **data, const char *pattern,
                                       const mpt_token_data_config *config);
/* Closes the shards. NULL is a no-op. */
MPT_API void mpt_token_data_free(mpt_token_data *data);
/* The number of windows over all shards. */
MPT_API int64_t mpt_token_data_num_windows(const mpt_token_data *data);
/* The number of shards, the total token count, and shard i's path and token count (NULL / -1
 * for i out of range). */
MPT_API int mpt_token_data_num_shards(const mpt_token_data *data);
/* The glob the data was made from, as given (NULL for NULL data). */
MPT_API const char *mpt_token_data_pattern(const mpt_token_data *data);
MPT_API int64_t mpt_token_data_num_tokens(const mpt_token_data *data);
MPT_API const char *mpt_token_data_shard_path(const mpt_token_data *data, int i);
MPT_API int64_t mpt_token_data_shard_tokens(const mpt_token_data *data, int i);
/* A copy of the configuration the data was opened with. */
MPT_API mpt_token_data_config mpt_token_data_config_get(const mpt_token_data *data);
/* Reads window `window` into inputs[B T] and targets[B T] (int32, row-major [B, T]).
 * Errors: MPT_EINVAL window outside [0, num_windows) or NULL buffers; MPT_EIO the read failed
 * or came short (names the shard and the byte offset); MPT_EFORMAT a token id >= vocab_size
 * (names the shard, the token's index in the shard, its byte offset and its value);
 * MPT_ENOMEM (a window's read buffer). Any thread. */
MPT_API mpt_status mpt_token_data_read_window(const mpt_token_data *data, int64_t window,
                                              int32_t *inputs, int32_t *targets);
/* Checks every token id that a window can read (tokens [0, windows B T + 1) of each shard)
 * against vocab_size, up front, so that bad data stops a run at start-up instead of when the
 * window holding it comes up, possibly hours in. Checks the shards i with i % nparts == part
 * (a rank checks its share: part = rank, nparts = world size; the caller then agrees on the
 * result across ranks), reading each in 4 MiB preads (the cost is one sequential read of
 * those shards). Tokens after a shard's last window are never read, so they are not checked.
 * Errors: MPT_EINVAL NULL data or part outside [0, nparts); MPT_EIO a read failed or came
 * short; MPT_EFORMAT the first bad id (as mpt_token_data_read_window: shard, token index, byte
 * offset, value); MPT_ENOMEM. Thread-safe with reads. */
MPT_API mpt_status mpt_token_data_check_ids(const mpt_token_data *data, int part, int nparts);
/* The windows as a data source (for mpt_loader_init_source): sample i is window i, its input
 * I32 [B, T] (the inputs) and its B T labels the targets (num_classes = vocab_size). `data`
 * is borrowed and must outlive the source. Errors: MPT_EINVAL, MPT_ENOMEM. */
MPT_API mpt_status mpt_token_data_source(mpt_token_data *data, mpt_data_source **source);

/* A per-rank loader of windows: an mpt_sampler over the windows + an mpt_loader (batch size 1,
 * one window per step) over mpt_token_data_source, handing out inputs and targets as I32
 * [B, T] tensors. */
typedef struct mpt_token_loader mpt_token_loader;

/* One step of a token loader: a window as inputs and targets. */
typedef struct mpt_token_batch {
  mpt_tensor inputs;  /* I32 [B, T], CPU (a view, valid until the next call on the loader) */
  mpt_tensor targets; /* I32 [B, T], CPU (a view) */
  int64_t window;     /* the window's index in the data */
  int is_padding;     /* 1: a sampler repeat (the last step of an epoch when W does not divide
                         the window count); evaluation should skip it */
  int64_t index;      /* step within the epoch, from 0 */
  int64_t epoch;
} mpt_token_batch;

/* Creates the loader over `data` (borrowed) with a sampler from `sampler_config` (NULL: the
 * defaults, i.e. one rank, shuffled, seed 0) and loader settings from `loader_config` (NULL:
 * the defaults; batch_size and drop_last are ignored: one window per step). Starts at epoch 0.
 * Errors: MPT_EINVAL NULL loader or data; MPT_ENOMEM; those of mpt_sampler_init,
 * mpt_data_source_init and mpt_loader_init_source. */
MPT_API mpt_status mpt_token_loader_init(mpt_token_loader **loader, mpt_token_data *data,
                                         const mpt_sampler_config *sampler_config,
                                         const mpt_loader_config *loader_config);
/* NULL is a no-op. */
MPT_API void mpt_token_loader_free(mpt_token_loader *loader);
/* The next window of the epoch: MPT_OK with *batch set, MPT_LOADER_END at the end of the
 * epoch, or a negative status (as mpt_loader_next; a bad token names shard and offset;
 * MPT_EINVAL for NULL). */
MPT_API int mpt_token_loader_next(mpt_token_loader *loader, mpt_token_batch *batch);
/* Starts epoch `epoch` (>= 0) on this rank: the same call with the same value on every rank.
 * Errors: as mpt_loader_start_epoch (MPT_EINVAL also for NULL). */
MPT_API mpt_status mpt_token_loader_start_epoch(mpt_token_loader *loader, int64_t epoch);
/* Steps (windows) per epoch on each rank: ceil(windows / W), or floor with drop_last. */
MPT_API int64_t mpt_token_loader_num_steps(const mpt_token_loader *loader);
/* The loader's sampler (read-only use: its epoch changes only through the loader). */
MPT_API const mpt_sampler *mpt_token_loader_sampler(const mpt_token_loader *loader);

#ifdef __cplusplus
}
#endif

#endif /* MPITRAIN_DATA_H */
