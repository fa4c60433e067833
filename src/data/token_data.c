/* Language-model data over llm.c token shards (include/mpitrain/data.h): the windows of B T + 1
 * tokens, the data source that hands them to the loader, and a per-rank loader (sampler +
 * loader) that yields inputs and targets as [B, T].
 *
 * Invariants: shards are opened once at init (header and size checked, descriptors kept);
 * first_window[i] is the number of windows in shards [0, i), so window w lives in the shard i
 * with first_window[i] <= w < first_window[i + 1] (binary search) at token
 * (w - first_window[i]) B T of it. A window is read with one pread of 2 (B T + 1) bytes at a
 * 64-bit offset into a per-call buffer, then decoded and checked against the vocabulary; no
 * state changes after init, so reads are thread-safe. */
#include <glob.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mpitrain/core.h"
#include "data/tokens_impl.h"
#include "mpitrain/data.h"

#define WINDOW_MAX_TOKENS (1LL << 28) /* B T; keeps a sample's int32 input below 2^31 bytes */

struct mpt_token_data {
  mpt_token_data_config cfg;
  char *pattern;         /* the glob as given */
  int num_shards;
  char **paths;          /* [num_shards] */
  int *fds;              /* [num_shards] */
  int64_t *counts;       /* [num_shards] tokens */
  int64_t *first_window; /* [num_shards + 1] */
  int64_t total_tokens;
};

mpt_token_data_config mpt_token_data_config_default(void) {
  mpt_token_data_config c;
  c.batch_size = 4;
  c.seq_len = 64;
  c.vocab_size = 50257;
  return c;
}

void mpt_token_data_free(mpt_token_data *d) {
  if (!d) return;
  for (int i = 0; i < d->num_shards; i++) {
    if (d->fds && d->fds[i] >= 0) close(d->fds[i]);
    if (d->paths) free(d->paths[i]);
  }
  free(d->paths);
  free(d->fds);
  free(d->counts);
  free(d->first_window);
  free(d->pattern);
  free(d);
}

mpt_status mpt_token_data_init(mpt_token_data **out, const char *pattern,
                               const mpt_token_data_config *config) {
  if (!out) return MPT_FAIL(MPT_EINVAL, "mpt_token_data_init: data is NULL");
  *out = NULL;
  if (!pattern) return MPT_FAIL(MPT_EINVAL, "mpt_token_data_init: pattern is NULL");
  mpt_token_data_config c = config ? *config : mpt_token_data_config_default();
  if (c.batch_size < 1 || c.seq_len < 1 || c.batch_size > WINDOW_MAX_TOKENS ||
      c.seq_len > WINDOW_MAX_TOKENS || c.batch_size * c.seq_len > WINDOW_MAX_TOKENS)
    return MPT_FAIL(MPT_EINVAL, "token data: batch size %lld and sequence length %lld must be "
                    ">= 1 with a product of at most %lld", (long long)c.batch_size,
                    (long long)c.seq_len, (long long)WINDOW_MAX_TOKENS);
  if (c.vocab_size < 1 || c.vocab_size > 65536)
    return MPT_FAIL(MPT_EINVAL, "token data: vocabulary size %d outside 1..65536 (uint16 ids)",
                    c.vocab_size);
  glob_t g;
  memset(&g, 0, sizeof g);
  int grc = glob(pattern, 0, NULL, &g);
  if (grc == GLOB_NOMATCH || (grc == 0 && g.gl_pathc == 0)) {
    globfree(&g);
    return MPT_FAIL(MPT_ENOENT, "token data: no file matches '%s'", pattern);
  }
  if (grc != 0) {
    globfree(&g);
    return MPT_FAIL(grc == GLOB_NOSPACE ? MPT_ENOMEM : MPT_EIO,
                    "token data: cannot expand '%s' (glob error %d)", pattern, grc);
  }
  mpt_status st = MPT_OK;
  mpt_token_data *d = calloc(1, sizeof *d);
  int n = (int)g.gl_pathc;
  if (!d || !(d->paths = calloc((size_t)n, sizeof *d->paths)) ||
      !(d->fds = malloc((size_t)n * sizeof *d->fds)) ||
      !(d->counts = calloc((size_t)n, sizeof *d->counts)) ||
      !(d->first_window = calloc((size_t)n + 1, sizeof *d->first_window)) ||
      !(d->pattern = strdup(pattern))) {
    st = MPT_FAIL(MPT_ENOMEM, "token data: out of host memory for %d shards", n);
    goto fail;
  }
  d->cfg = c;
  d->num_shards = n;
  for (int i = 0; i < n; i++) d->fds[i] = -1;
  int64_t bt = c.batch_size * c.seq_len;
  for (int i = 0; i < n; i++) {
    if (!(d->paths[i] = strdup(g.gl_pathv[i]))) {
      st = MPT_FAIL(MPT_ENOMEM, "token data: out of host memory");
      goto fail;
    }
    MPT_CHECK(mpt__shard_open(d->paths[i], &d->fds[i], &d->counts[i]), fail);
    int64_t w = d->counts[i] > bt ? (d->counts[i] - 1) / bt : 0;
    d->first_window[i + 1] = d->first_window[i] + w;
    d->total_tokens += d->counts[i];
  }
  if (d->first_window[n] == 0) {
    st = MPT_FAIL(MPT_EFORMAT, "token data '%s': no shard holds a window of B*T+1 = %lld tokens "
                  "(%d shard%s, %lld tokens in all)", pattern, (long long)(bt + 1), n,
                  n == 1 ? "" : "s", (long long)d->total_tokens);
    goto fail;
  }
  globfree(&g);
  *out = d;
  return MPT_OK;

fail:
  globfree(&g);
  mpt_token_data_free(d);
  return st;
}

const char *mpt_token_data_pattern(const mpt_token_data *d) { return d ? d->pattern : NULL; }

int64_t mpt_token_data_num_windows(const mpt_token_data *d) {
  return d->first_window[d->num_shards];
}
int mpt_token_data_num_shards(const mpt_token_data *d) { return d->num_shards; }
int64_t mpt_token_data_num_tokens(const mpt_token_data *d) { return d->total_tokens; }
const char *mpt_token_data_shard_path(const mpt_token_data *d, int i) {
  return i >= 0 && i < d->num_shards ? d->paths[i] : NULL;
}
int64_t mpt_token_data_shard_tokens(const mpt_token_data *d, int i) {
  return i >= 0 && i < d->num_shards ? d->counts[i] : -1;
}
mpt_token_data_config mpt_token_data_config_get(const mpt_token_data *d) { return d->cfg; }

mpt_status mpt_token_data_read_window(const mpt_token_data *d, int64_t window, int32_t *inputs,
                                      int32_t *targets) {
  if (!d || !inputs || !targets)
    return MPT_FAIL(MPT_EINVAL, "mpt_token_data_read_window: NULL argument");
  int64_t nw = mpt_token_data_num_windows(d);
  if (window < 0 || window >= nw)
    return MPT_FAIL(MPT_EINVAL, "token data: window %lld outside [0, %lld)", (long long)window,
                    (long long)nw);
  /* The last shard whose first window is <= window. */
  int lo = 0, hi = d->num_shards - 1;
  while (lo < hi) {
    int mid = lo + (hi - lo + 1) / 2;
    if (d->first_window[mid] <= window) lo = mid;
    else hi = mid - 1;
  }
  int64_t bt = d->cfg.batch_size * d->cfg.seq_len;
  int64_t first = (window - d->first_window[lo]) * bt; /* token index in the shard */
  uint8_t *buf = malloc(2 * (size_t)(bt + 1));
  if (!buf) return MPT_FAIL(MPT_ENOMEM, "token data: out of host memory for a window");
  mpt_status st;
  const char *path = d->paths[lo];
  MPT_CHECK(mpt__shard_pread(d->fds[lo], path, buf, 2 * (bt + 1),
                             MPT_SHARD_HEADER_NBYTES + 2 * first), out);
  /* Inputs are tokens [0, BT), targets [1, BT]: check and decode the first BT into inputs,
   * then the last one, and shift. */
  MPT_CHECK(mpt__shard_check_tokens(path, buf, bt, first, d->cfg.vocab_size, NULL, inputs), out);
  int32_t last;
  MPT_CHECK(mpt__shard_check_tokens(path, buf + 2 * bt, 1, first + bt, d->cfg.vocab_size, NULL,
                                    &last), out);
  memcpy(targets, inputs + 1, (size_t)(bt - 1) * sizeof *targets);
  targets[bt - 1] = last;
out:
  free(buf);
  return st;
}

enum { CHECK_CHUNK_TOKENS = 1 << 21 }; /* 4 MiB a pread */

mpt_status mpt_token_data_check_ids(const mpt_token_data *d, int part, int nparts) {
  if (!d) return MPT_FAIL(MPT_EINVAL, "mpt_token_data_check_ids: data is NULL");
  if (nparts < 1 || part < 0 || part >= nparts)
    return MPT_FAIL(MPT_EINVAL, "mpt_token_data_check_ids: part %d outside [0, %d)", part,
                    nparts);
  uint8_t *buf = malloc(2 * (size_t)CHECK_CHUNK_TOKENS);
  if (!buf) return MPT_FAIL(MPT_ENOMEM, "token data: out of host memory for the id check");
  mpt_status st = MPT_OK;
  const int64_t bt = d->cfg.batch_size * d->cfg.seq_len;
  for (int i = part; i < d->num_shards; i += nparts) {
    const int64_t windows = d->first_window[i + 1] - d->first_window[i];
    const int64_t end = windows > 0 ? windows * bt + 1 : 0; /* the tokens windows read */
    for (int64_t t = 0; t < end; t += CHECK_CHUNK_TOKENS) {
      const int64_t m = end - t < CHECK_CHUNK_TOKENS ? end - t : CHECK_CHUNK_TOKENS;
      MPT_CHECK(mpt__shard_pread(d->fds[i], d->paths[i], buf, 2 * m,
                                 MPT_SHARD_HEADER_NBYTES + 2 * t), out);
      MPT_CHECK(mpt__shard_check_tokens(d->paths[i], buf, m, t, d->cfg.vocab_size, NULL, NULL),
                out);
    }
  }
out:
  free(buf);
  return st;
}

/* ------------------------------------------------------------------------------------------ */
/* As a data source, and the per-rank loader                                                 */

static mpt_status window_read(void *user, int64_t index, void *input, int32_t *label) {
  return mpt_token_data_read_window(user, index, input, label);
}

mpt_status mpt_token_data_source(mpt_token_data *d, mpt_data_source **source) {
  if (!source) return MPT_FAIL(MPT_EINVAL, "mpt_token_data_source: source is NULL");
  *source = NULL;
  if (!d) return MPT_FAIL(MPT_EINVAL, "mpt_token_data_source: data is NULL");
  mpt_data_source_desc desc = mpt_data_source_desc_default();
  desc.count = mpt_token_data_num_windows(d);
  desc.input_dtype = MPT_I32;
  desc.input_ndim = 2;
  desc.input_shape[0] = d->cfg.batch_size;
  desc.input_shape[1] = d->cfg.seq_len;
  desc.label_count = d->cfg.batch_size * d->cfg.seq_len;
  desc.num_classes = 0; /* window_read checked every id against the vocabulary already */
  desc.read = window_read;
  desc.user = d;
  return mpt_data_source_init(source, &desc);
}

struct mpt_token_loader {
  mpt_token_data *data;
  mpt_data_source *source;
  mpt_sampler *sampler;
  mpt_loader *loader;
};

void mpt_token_loader_free(mpt_token_loader *tl) {
  if (!tl) return;
  mpt_loader_free(tl->loader);
  mpt_sampler_free(tl->sampler);
  mpt_data_source_free(tl->source);
  free(tl);
}

mpt_status mpt_token_loader_init(mpt_token_loader **out, mpt_token_data *data,
                                 const mpt_sampler_config *sampler_config,
                                 const mpt_loader_config *loader_config) {
  if (!out) return MPT_FAIL(MPT_EINVAL, "mpt_token_loader_init: loader is NULL");
  *out = NULL;
  if (!data) return MPT_FAIL(MPT_EINVAL, "mpt_token_loader_init: data is NULL");
  mpt_sampler_config sc = sampler_config ? *sampler_config : mpt_sampler_config_default();
  mpt_loader_config lc = loader_config ? *loader_config : mpt_loader_config_default();
  lc.batch_size = 1; /* one window per step */
  lc.drop_last = 0;
  mpt_status st;
  mpt_token_loader *tl = calloc(1, sizeof *tl);
  if (!tl) return MPT_FAIL(MPT_ENOMEM, "token loader: out of host memory");
  tl->data = data;
  MPT_CHECK(mpt_token_data_source(data, &tl->source), fail);
  MPT_CHECK(mpt_sampler_init(&tl->sampler, mpt_token_data_num_windows(data), &sc), fail);
  MPT_CHECK(mpt_loader_init_source(&tl->loader, tl->source, tl->sampler, &lc), fail);
  *out = tl;
  return MPT_OK;

fail:
  mpt_token_loader_free(tl);
  return st;
}

int mpt_token_loader_next(mpt_token_loader *tl, mpt_token_batch *b) {
  if (!tl || !b) return MPT_FAIL(MPT_EINVAL, "mpt_token_loader_next: NULL argument");
  mpt_batch batch;
  int r = mpt_loader_next(tl->loader, &batch);
  if (r != MPT_OK) return r;
  int64_t shape[2] = {tl->data->cfg.batch_size, tl->data->cfg.seq_len};
  b->inputs = mpt_tensor_view(batch.images.data, mpt_device_cpu(), MPT_I32, 2, shape);
  b->targets = mpt_tensor_view(batch.labels.data, mpt_device_cpu(), MPT_I32, 2, shape);
  b->window = batch.sample_indices[0];
  b->is_padding = batch.num_real < 1;
  b->index = batch.index;
  b->epoch = batch.epoch;
  return MPT_OK;
}

mpt_status mpt_token_loader_start_epoch(mpt_token_loader *tl, int64_t epoch) {
  if (!tl) return MPT_FAIL(MPT_EINVAL, "mpt_token_loader_start_epoch: loader is NULL");
  return mpt_loader_start_epoch(tl->loader, epoch);
}

int64_t mpt_token_loader_num_steps(const mpt_token_loader *tl) {
  return mpt_loader_num_batches(tl->loader);
}

const mpt_sampler *mpt_token_loader_sampler(const mpt_token_loader *tl) { return tl->sampler; }
