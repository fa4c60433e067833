/* The mpitrain side of the PyTorch oracle (tests/test_gpt_torch.sh, tests/gpt_torch.py).
 *
 * Usage: gpt_torch_helper DIR
 * Builds a tiny GPT (L 2, H 2, C 16, T 8, V 23 -> Vp 128) from seed 3, adds U(-0.05, 0.05) to
 * every parameter (so that biases and LayerNorm parameters are not 0 and 1, and the file must
 * carry them right), and writes into DIR (all little-endian, raw):
 *   model.bin      the llm.c model file (mpt_gpt_save)
 *   tokens.bin     int32 [B, T + 1], B = 2: inputs are [:, :T], targets [:, 1:]
 *   logits.bin     float32 [B, T, Vp] of the first forward
 *   loss.bin       float32 [1] the first loss
 *   grads.bin      float32 [N] the first gradients: the flat buffer, in the model's
 *                  registration order (layer-major, as PyTorch's model.parameters(); not the
 *                  file's order)
 *   norms.bin      float32 [STEPS] the global gradient norm before clipping at each step
 *   losses.bin     float32 [STEPS] the loss at each step
 *   params.bin     float32 [N] the flat parameter buffer (the model's order) after STEPS
 *                  steps of: zero_grad, forward, loss, backward, mpt_clip_grad_norm(MAX_NORM),
 *                  AdamW (lr 1e-2, betas 0.9 / 0.95, eps 1e-8, weight decay 0.1 on the >= 2-D
 *                  weights only) on the same batch.
 * Exit status 0, or 1 with the error on stderr. */
#include <stdio.h>

#include "mpitrain/gpt_file.h"
#include "mpitrain/transformer.h"

#define TORCH_HELPER_NAME "gpt_torch_helper"
#include "torch_helper.h"

enum { T = 8 };

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: gpt_torch_helper DIR\n");
    return 2;
  }
  const char *dir = argv[1];
  mpt_gpt_config cfg = {.max_seq_len = T, .vocab_size = 23, .num_layers = 2, .num_heads = 2,
                        .channels = 16, .padded_vocab_size = 0};
  mpt_model *m = NULL;
  mpt_rng rng;
  CHECK(mpt_model_init_gpt(&m, mpt_device_cpu(), &cfg, 3));
  if (torch_helper_perturb(m, &rng)) return 1;
  char path[1024];
  snprintf(path, sizeof path, "%s/model.bin", dir);
  CHECK(mpt_gpt_save(m, &cfg, path));
  const int failed = torch_helper_train(dir, m, &rng, T, cfg.vocab_size);
  mpt_model_free(m);
  return failed;
}
