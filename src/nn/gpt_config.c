/* The GPT-2 configuration's parameter layout (include/mpitrain/gpt_config.h): the tensors'
 * names, sizes, shapes and offsets in llm.c's order, computed in one place for the model
 * (gpt.c) and the file formats (src/ckpt). Every size is checked against the MPT_GPT_MAX_*
 * limits first, so the products stay inside int64. Pure functions. */
#include <string.h>

#include "mpitrain/gpt_config.h"

static const char *const tensor_names[MPT_GPT_NUM_TENSORS] = {
    "wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
    "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"};

const char *mpt_gpt_tensor_name(int i) {
  return i >= 0 && i < MPT_GPT_NUM_TENSORS ? tensor_names[i] : "?";
}

int64_t mpt_gpt_padded_vocab(int64_t v) { return v < 1 ? -1 : (v + 127) / 128 * 128; }

mpt_status mpt_gpt_layout_compute(const mpt_gpt_config *c, mpt_gpt_layout *lay) {
  if (!c || !lay) return MPT_FAIL(MPT_EINVAL, "mpt_gpt_layout_compute: NULL argument");
  memset(lay, 0, sizeof *lay);
  const struct { const char *name; int v, max; } f[] = {
      {"max sequence length", c->max_seq_len, MPT_GPT_MAX_SEQ_LEN},
      {"vocabulary size", c->vocab_size, MPT_GPT_MAX_VOCAB},
      {"layers", c->num_layers, MPT_GPT_MAX_LAYERS},
      {"heads", c->num_heads, MPT_GPT_MAX_CHANNELS},
      {"channels", c->channels, MPT_GPT_MAX_CHANNELS}};
  for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
    if (f[i].v < 1 || f[i].v > f[i].max)
      return MPT_FAIL(MPT_EINVAL, "GPT config: %s %d outside 1..%d", f[i].name, f[i].v, f[i].max);
  int64_t vp = c->padded_vocab_size ? c->padded_vocab_size : mpt_gpt_padded_vocab(c->vocab_size);
  if (vp < c->vocab_size || vp > MPT_GPT_MAX_VOCAB)
    return MPT_FAIL(MPT_EINVAL, "GPT config: padded vocabulary %lld outside %d..%d",
                    (long long)vp, c->vocab_size, MPT_GPT_MAX_VOCAB);
  if (c->channels % c->num_heads != 0)
    return MPT_FAIL(MPT_EINVAL, "GPT config: channels %d not a multiple of heads %d",
                    c->channels, c->num_heads);
  int64_t C = c->channels, L = c->num_layers, T = c->max_seq_len;
  const int64_t count[MPT_GPT_NUM_TENSORS] = {
      vp * C,    T * C,     L * C,     L * C,          /* wte wpe ln1w ln1b */
      L * 3 * C * C, L * 3 * C, L * C * C, L * C,     /* qkvw qkvb attprojw attprojb */
      L * C,     L * C,     L * 4 * C * C, L * 4 * C, /* ln2w ln2b fcw fcb */
      L * C * 4 * C, L * C, C, C};                    /* fcprojw fcprojb lnfw lnfb */
  /* The shapes, as in the header's table; their products are the counts above. */
  const int64_t shape[MPT_GPT_NUM_TENSORS][3] = {
      {vp, C}, {T, C}, {L, C}, {L, C}, {L, 3 * C, C}, {L, 3 * C}, {L, C, C}, {L, C},
      {L, C}, {L, C}, {L, 4 * C, C}, {L, 4 * C}, {L, C, 4 * C}, {L, C}, {C}, {C}};
  for (int i = 0; i < MPT_GPT_NUM_TENSORS; i++) {
    int nd = 0;
    for (int d = 0; d < 3 && shape[i][d] > 0; d++) lay->shape[i][nd++] = shape[i][d];
    lay->ndim[i] = nd;
    lay->count[i] = count[i];
    lay->offset[i] = lay->total;
    lay->total += count[i];
  }
  return MPT_OK;
}
