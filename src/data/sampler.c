/* The distributed sampler: PyTorch DistributedSampler semantics (see include/mpitrain/data.h).
 *
 * Invariants: `order` holds a permutation of 0..N-1 for the current epoch (the identity without
 * shuffle), drawn from (seed, epoch) alone so every rank holds the same one. Nothing else is
 * stored: position i of rank r's list is padded position p = r + i * W, whose index is
 * order[p mod N] (wrapping covers both "pad from the front" and "repeat the list when the
 * padding exceeds N"), and p is padding iff p >= N. Not thread-safe; O(N) memory allocated once
 * at init. */
#include <stdlib.h>
#include <string.h>

#include "mpitrain/core.h"
#include "mpitrain/data.h"

struct mpt_sampler {
  mpt_sampler_config cfg;
  int64_t n;           /* dataset size N */
  int64_t num_samples; /* per rank */
  int64_t num_real;    /* leading real positions of this rank's list */
  int64_t epoch;
  int64_t *order; /* [N] the epoch's order */
};

mpt_sampler_config mpt_sampler_config_default(void) {
  mpt_sampler_config c;
  c.num_replicas = 1;
  c.rank = 0;
  c.shuffle = 1;
  c.seed = 0;
  c.drop_last = 0;
  return c;
}

/* The epoch's generator seed: splitmix64-style finalisers over seed and epoch, so that nearby
 * (seed, epoch) pairs give unrelated streams (PyTorch uses seed + epoch, which makes
 * (s, e + 1) and (s + 1, e) identical). */
static uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

static uint64_t epoch_seed(uint64_t seed, int64_t epoch) {
  return mix64(mix64(seed + 0x9e3779b97f4a7c15ULL) ^ ((uint64_t)epoch * 0xd1b54a32d192ed03ULL));
}

/* Identity, then (with shuffle) Fisher-Yates from the back (Knuth, TAOCP vol. 2, Algorithm P). */
static void sampler_build_order(mpt_sampler *s) {
  for (int64_t i = 0; i < s->n; i++) s->order[i] = i;
  if (!s->cfg.shuffle || s->n < 2) return;
  mpt_rng rng;
  mpt_rng_seed(&rng, epoch_seed(s->cfg.seed, s->epoch));
  for (int64_t i = s->n - 1; i > 0; i--) {
    int64_t j = (int64_t)mpt_rng_below(&rng, (uint64_t)(i + 1));
    int64_t t = s->order[i];
    s->order[i] = s->order[j];
    s->order[j] = t;
  }
}

mpt_status mpt_sampler_init(mpt_sampler **sampler, int64_t dataset_count,
                            const mpt_sampler_config *config) {
  if (!sampler) return MPT_FAIL(MPT_EINVAL, "mpt_sampler_init: sampler is NULL");
  *sampler = NULL;
  mpt_sampler_config cfg = config ? *config : mpt_sampler_config_default();
  if (cfg.num_replicas < 1 || cfg.rank < 0 || cfg.rank >= cfg.num_replicas)
    return MPT_FAIL(MPT_EINVAL,
                    "sampler: rank %d with num_replicas %d; need num_replicas >= 1 and 0 <= rank "
                    "< num_replicas",
                    cfg.rank, cfg.num_replicas);
  if (dataset_count < 0)
    return MPT_FAIL(MPT_EINVAL, "sampler: dataset count %lld is negative",
                    (long long)dataset_count);
  mpt_sampler *s = calloc(1, sizeof *s);
  if (!s) return MPT_FAIL(MPT_ENOMEM, "sampler: out of memory");
  s->cfg = cfg;
  s->n = dataset_count;
  if (dataset_count > 0) {
    s->order = malloc((size_t)dataset_count * sizeof *s->order);
    if (!s->order) {
      free(s);
      return MPT_FAIL(MPT_ENOMEM, "sampler: cannot allocate %lld indices",
                      (long long)dataset_count);
    }
  }
  const int64_t w = cfg.num_replicas, n = dataset_count;
  if (cfg.drop_last) {
    s->num_samples = n / w;
    s->num_real = s->num_samples;
  } else {
    s->num_samples = (n + w - 1) / w;
    int64_t real = n > cfg.rank ? (n - cfg.rank + w - 1) / w : 0;
    s->num_real = real < s->num_samples ? real : s->num_samples;
  }
  s->epoch = 0;
  sampler_build_order(s);
  *sampler = s;
  return MPT_OK;
}

void mpt_sampler_free(mpt_sampler *sampler) {
  if (!sampler) return;
  free(sampler->order);
  free(sampler);
}

mpt_status mpt_sampler_set_epoch(mpt_sampler *sampler, int64_t epoch) {
  if (!sampler) return MPT_FAIL(MPT_EINVAL, "mpt_sampler_set_epoch: sampler is NULL");
  if (epoch < 0) return MPT_FAIL(MPT_EINVAL, "sampler: epoch %lld is negative", (long long)epoch);
  if (epoch == sampler->epoch) return MPT_OK;
  sampler->epoch = epoch;
  sampler_build_order(sampler);
  return MPT_OK;
}

int64_t mpt_sampler_epoch(const mpt_sampler *sampler) { return sampler->epoch; }
int64_t mpt_sampler_num_samples(const mpt_sampler *sampler) { return sampler->num_samples; }
int64_t mpt_sampler_num_real(const mpt_sampler *sampler) { return sampler->num_real; }
int64_t mpt_sampler_dataset_count(const mpt_sampler *sampler) { return sampler->n; }
mpt_sampler_config mpt_sampler_config_get(const mpt_sampler *sampler) { return sampler->cfg; }

int64_t mpt_sampler_total_size(const mpt_sampler *sampler) {
  return sampler->num_samples * sampler->cfg.num_replicas;
}

int64_t mpt_sampler_index(const mpt_sampler *sampler, int64_t i) {
  if (i < 0 || i >= sampler->num_samples) return -1;
  int64_t p = sampler->cfg.rank + i * sampler->cfg.num_replicas;
  return sampler->order[p % sampler->n];
}

int mpt_sampler_is_padding(const mpt_sampler *sampler, int64_t i) {
  if (i < 0 || i >= sampler->num_samples) return -1;
  return i >= sampler->num_real;
}

mpt_status mpt_sampler_fill(const mpt_sampler *sampler, int64_t start, int64_t count,
                            int64_t *indices) {
  if (!sampler) return MPT_FAIL(MPT_EINVAL, "mpt_sampler_fill: sampler is NULL");
  if (start < 0 || count < 0 || start > sampler->num_samples ||
      count > sampler->num_samples - start)
    return MPT_FAIL(MPT_EINVAL, "sampler: positions [%lld, %lld) outside this rank's %lld",
                    (long long)start, (long long)(start + count),
                    (long long)sampler->num_samples);
  if (count > 0 && !indices) return MPT_FAIL(MPT_EINVAL, "mpt_sampler_fill: indices is NULL");
  const int64_t w = sampler->cfg.num_replicas, n = sampler->n;
  int64_t p = sampler->cfg.rank + start * w;
  for (int64_t i = 0; i < count; i++, p += w) indices[i] = sampler->order[p % n];
  return MPT_OK;
}
