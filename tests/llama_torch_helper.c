/* The mpitrain side of the Llama's PyTorch oracle (tests/test_llama_torch.sh,
 * tests/llama_torch.py).
 *
 * Usage: llama_torch_helper DIR gqa|tied|llama3
 *   gqa   V 23, C 32, L 2, H 4, KV 2 (two query heads per key/value head), F 48, T 8,
 *         rope_theta 10000, eps 1e-5, an output head of its own;
 *   tied  V 19, C 24, L 1, H 3, KV 1 (multi-query), F 40, T 8, rope_theta 500000, eps 1e-6,
 *         the head tied to the token embedding;
 *   llama3  gqa's shape with Llama 3's RoPE scaling: factor 8, low_freq_factor 1,
 *         high_freq_factor 4, original_max_position_embeddings 1024, so that of the head's
 *         frequencies 1, 0.1, 0.01, 0.001 (wavelengths 6.3, 63, 628, 6283 against the bands'
 *         256 and 1024) two are kept, one smoothed and one divided by 8.
 * Builds the model from seed 3, adds U(-0.05, 0.05) to every parameter (so that the norm
 * weights are not all 1 and a swapped tensor shows), and writes into DIR (little-endian, raw):
 *   config.txt   "V C L H KV F T rope_theta norm_eps tied", one line, then for llama3
 *                " factor low_freq_factor high_freq_factor original_max_position_embeddings"
 *   names.txt    one line per parameter tensor, in the model's registration order: its name,
 *                then its extents
 *   params0.bin  float32 [N] the flat parameter buffer before training (registration order)
 *   tokens.bin   int32 [B, T + 1], B = 2: inputs are [:, :T], targets [:, 1:]
 *   logits.bin   float32 [B, T, V] of the first forward
 *   loss.bin     float32 [1] the first loss
 *   grads.bin    float32 [N] the first gradients (the flat buffer)
 *   norms.bin    float32 [STEPS] the global gradient norm before clipping at each step
 *   losses.bin   float32 [STEPS] the loss at each step
 *   params.bin   float32 [N] the parameters after STEPS steps of: zero_grad, forward, loss,
 *                backward, mpt_clip_grad_norm(MAX_NORM), AdamW (lr 1e-2, betas 0.9 / 0.95,
 *                eps 1e-8, weight decay 0.1 on the >= 2-D weights only) on the same batch.
 * Exit status 0, or 1 with the error on stderr. */
#include <stdio.h>
#include <string.h>

#include "mpitrain/llama.h"
#include "mpitrain/transformer.h"

#define TORCH_HELPER_NAME "llama_torch_helper"
#include "torch_helper.h"

int main(int argc, char **argv) {
  if (argc != 3 || (strcmp(argv[2], "gqa") != 0 && strcmp(argv[2], "tied") != 0 &&
                    strcmp(argv[2], "llama3") != 0)) {
    fprintf(stderr, "usage: llama_torch_helper DIR gqa|tied|llama3\n");
    return 2;
  }
  const char *dir = argv[1];
  const int tied = strcmp(argv[2], "tied") == 0;
  const int scaled = strcmp(argv[2], "llama3") == 0;
  mpt_llama_config cfg =
      tied ? (mpt_llama_config){.vocab_size = 19, .dim = 24, .n_layers = 1, .n_heads = 3,
                                .n_kv_heads = 1, .ffn_dim = 40, .max_seq_len = 8,
                                .rope_theta = 500000.0f, .norm_eps = 1e-6f,
                                .tied_embeddings = 1}
           : (mpt_llama_config){.vocab_size = 23, .dim = 32, .n_layers = 2, .n_heads = 4,
                                .n_kv_heads = 2, .ffn_dim = 48, .max_seq_len = 8,
                                .rope_theta = 10000.0f, .norm_eps = 1e-5f,
                                .tied_embeddings = 0};
  if (scaled) cfg.rope_scaling = (mpt_rope_scaling){MPT_ROPE_LLAMA3, 8.0f, 1.0f, 4.0f, 1024};
  const int T = cfg.max_seq_len, V = cfg.vocab_size;
  mpt_model *m = NULL;
  mpt_rng rng;
  CHECK(mpt_model_init_llama(&m, mpt_device_cpu(), &cfg, 3));
  if (torch_helper_perturb(m, &rng)) return 1;
  const int64_t n = mpt_model_param_count(m);

  char path[1024];
  snprintf(path, sizeof path, "%s/config.txt", dir);
  FILE *f = fopen(path, "w");
  if (!f) return 1;
  fprintf(f, "%d %d %d %d %d %d %d %.9g %.9g %d", cfg.vocab_size, cfg.dim, cfg.n_layers,
          cfg.n_heads, cfg.n_kv_heads, cfg.ffn_dim, cfg.max_seq_len, (double)cfg.rope_theta,
          (double)cfg.norm_eps, cfg.tied_embeddings);
  if (scaled)
    fprintf(f, " %.9g %.9g %.9g %d", (double)cfg.rope_scaling.factor,
            (double)cfg.rope_scaling.low_freq_factor, (double)cfg.rope_scaling.high_freq_factor,
            cfg.rope_scaling.original_max_position_embeddings);
  fprintf(f, "\n");
  fclose(f);
  snprintf(path, sizeof path, "%s/names.txt", dir);
  if (!(f = fopen(path, "w"))) return 1;
  for (int i = 0; i < mpt_model_num_params(m); i++) {
    const mpt_param_info *pi = mpt_model_param_info(m, i);
    fprintf(f, "%s", pi->name);
    for (int d = 0; d < pi->ndim; d++) fprintf(f, " %lld", (long long)pi->shape[d]);
    fprintf(f, "\n");
  }
  fclose(f);
  if (write_raw(dir, "params0.bin", mpt_model_params(m), (size_t)n * sizeof(float))) return 1;
  const int failed = torch_helper_train(dir, m, &rng, T, V);
  mpt_model_free(m);
  return failed;
}
