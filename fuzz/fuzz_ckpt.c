/* libFuzzer target: the checkpoint loader (mpt_ckpt_read_meta, mpt_ckpt_load; src/ckpt/read.c).
 *
 * The input is the content of a checkpoint file. A random mutation almost never keeps the
 * file's size field and CRC-32 right, and then only the preamble checks would ever run; so each
 * input is tried twice:
 *   1. as it is: mpt_ckpt_read_meta (the preamble, size and CRC checks);
 *   2. "repaired" (inputs of at least 28 bytes): the size field (bytes 16..23) set to the real
 *      length and the trailing CRC-32 recomputed, then mpt_ckpt_read_meta and mpt_ckpt_load
 *      into a small model (fuzz_common.h) with no optimizer, an SGD-momentum one and an AdamW
 *      one, so the parser, the signature and optimizer comparisons and the staging all run.
 * Checked: no crash, hang or leak; a failed load leaves the model's parameters and buffers, the
 * optimizer's state and step count, and the caller's meta exactly as they were (memcmp with a
 * snapshot: ckpt.h promises "on error the model, optimizer and *meta are unchanged"); a
 * successful load or read_meta returns a meta within the documented ranges, and read_meta and
 * load agree on it. Nothing is written to disk (fuzz_common.h scratch files). */
#include <zlib.h>

#include "fuzz_common.h"

static fuzz_scratch ckpt_file;
static mpt_model *model;
static mpt_optimizer *opt_sgd, *opt_adamw;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  fuzz_scratch_open(&ckpt_file, "fuzz_ckpt_input");
  model = fuzz_ckpt_model();
  if (model) opt_sgd = fuzz_ckpt_optimizer(model, MPT_OPTIM_SGD);
  if (model) opt_adamw = fuzz_ckpt_optimizer(model, MPT_OPTIM_ADAMW);
  if (!model || !opt_sgd || !opt_adamw) fuzz_fail("cannot build the model and optimizers");
  return 0;
}

static void check_meta(const mpt_ckpt_meta *m, const char *who) {
  if (m->epoch < 0 || m->global_step < 0 || m->step_in_epoch < 0 || m->sampler_epoch < 0 ||
      m->world_size < 1 || m->num_rngs < 0 || m->num_rngs > MPT_CKPT_MAX_RNGS)
    fuzz_fail("%s returned a meta out of range: epoch %lld step %lld in-epoch %lld sampler "
              "%lld world %d rngs %d", who, (long long)m->epoch, (long long)m->global_step,
              (long long)m->step_in_epoch, (long long)m->sampler_epoch, m->world_size,
              m->num_rngs);
}

/* A copy of everything a load may write. */
typedef struct snapshot {
  float *params, *buffers, *state[MPT_OPTIM_MAX_STATE];
  int64_t step_count;
  mpt_ckpt_meta meta;
} snapshot;

static float *dup_floats(const float *p, int64_t n) {
  float *q = malloc((size_t)n * sizeof *q + 1);
  if (!q) fuzz_fail("out of memory");
  if (n > 0) memcpy(q, p, (size_t)n * sizeof *q);
  return q;
}

static void snapshot_take(snapshot *s, mpt_optimizer *opt, const mpt_ckpt_meta *meta) {
  memset(s, 0, sizeof *s);
  s->params = dup_floats(mpt_model_params(model), mpt_model_param_count(model));
  s->buffers = dup_floats(mpt_model_buffers(model), mpt_model_buffer_count(model));
  if (opt) {
    mpt_optimizer_state os;
    if (mpt_optimizer_get_state(opt, &os) != MPT_OK) fuzz_fail("optimizer state");
    for (int k = 0; k < os.nbuffers; k++) s->state[k] = dup_floats(os.buffers[k], os.count);
    s->step_count = os.step_count;
  }
  s->meta = *meta;
}

static void snapshot_check_unchanged(const snapshot *s, mpt_optimizer *opt,
                                     const mpt_ckpt_meta *meta, mpt_status st) {
  if (memcmp(s->params, mpt_model_params(model),
             (size_t)mpt_model_param_count(model) * sizeof(float)) != 0 ||
      memcmp(s->buffers, mpt_model_buffers(model),
             (size_t)mpt_model_buffer_count(model) * sizeof(float)) != 0)
    fuzz_fail("failed load (%s) changed the model", mpt_status_name(st));
  if (opt) {
    mpt_optimizer_state os;
    if (mpt_optimizer_get_state(opt, &os) != MPT_OK) fuzz_fail("optimizer state");
    for (int k = 0; k < os.nbuffers; k++)
      if (memcmp(s->state[k], os.buffers[k], (size_t)os.count * sizeof(float)) != 0)
        fuzz_fail("failed load (%s) changed optimizer state %d", mpt_status_name(st), k);
    if (os.step_count != s->step_count)
      fuzz_fail("failed load (%s) changed the optimizer step count", mpt_status_name(st));
  }
  if (memcmp(&s->meta, meta, sizeof *meta) != 0)
    fuzz_fail("failed load (%s) changed the caller's meta", mpt_status_name(st));
}

static void snapshot_free(snapshot *s) {
  free(s->params);
  free(s->buffers);
  for (int k = 0; k < MPT_OPTIM_MAX_STATE; k++) free(s->state[k]);
}

/* One load with `opt` (may be NULL); `file_meta` and `has_opt` are what read_meta returned
 * (has_meta 0: it failed, so the load must fail too). */
static void try_load(mpt_optimizer *opt, int has_meta, const mpt_ckpt_meta *file_meta,
                     int has_opt) {
  mpt_ckpt_meta meta;
  memset(&meta, 0xA5, sizeof meta);
  snapshot s;
  snapshot_take(&s, opt, &meta);
  mpt_status st = mpt_ckpt_load(ckpt_file.path, model, opt, &meta);
  if (st == MPT_OK) {
    if (!has_meta) fuzz_fail("load succeeded where read_meta failed");
    check_meta(&meta, "mpt_ckpt_load");
    if (memcmp(&meta, file_meta, sizeof meta) != 0)
      fuzz_fail("load and read_meta return different metas");
    if (opt && !has_opt) fuzz_fail("load restored an optimizer from a file without its state");
  } else {
    snapshot_check_unchanged(&s, opt, &meta, st);
  }
  snapshot_free(&s);
}

static void try_file(const uint8_t *data, size_t size, int full) {
  fuzz_scratch_write(&ckpt_file, data, size);
  mpt_ckpt_meta meta;
  memset(&meta, 0, sizeof meta);
  int has_opt = -1;
  mpt_status st = mpt_ckpt_read_meta(ckpt_file.path, &meta, &has_opt);
  if (st == MPT_OK) {
    check_meta(&meta, "mpt_ckpt_read_meta");
    if (has_opt != 0 && has_opt != 1) fuzz_fail("has_optimizer is %d", has_opt);
  }
  if (!full) return;
  try_load(NULL, st == MPT_OK, &meta, has_opt);
  try_load(opt_sgd, st == MPT_OK, &meta, has_opt);
  try_load(opt_adamw, st == MPT_OK, &meta, has_opt);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  try_file(data, size, 0);
  if (size < 28) return 0;
  uint8_t *fixed = malloc(size);
  if (!fixed) fuzz_fail("out of memory");
  memcpy(fixed, data, size);
  for (int i = 0; i < 8; i++) fixed[16 + i] = (uint8_t)((uint64_t)size >> (8 * i));
  uint32_t crc = (uint32_t)crc32(0L, fixed, (uInt)(size - 4));
  for (int i = 0; i < 4; i++) fixed[size - 4 + i] = (uint8_t)(crc >> (8 * i));
  try_file(fixed, size, 1);
  free(fixed);
  return 0;
}
