/* mpt_st_logits MODEL OUT TOKEN...: the logits mpitrain computes for one sequence of tokens,
 * for bench/hf_interop.sh to compare with transformers'. MODEL is a Hugging Face safetensors
 * model (a folder or X.safetensors with config.json): a Llama when its config.json says so
 * (mpt_llama_st_is_model), else a GPT-2. OUT receives the logits [T, V] as raw little-endian
 * float32 (a GPT's padded vocabulary columns left out). One process, the CPU, no gradients.
 * Exit status 0, or 1 with the error on stderr. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpitrain.h"

static int fail(mpt_status st) {
  fprintf(stderr, "mpt_st_logits: %s: %s\n", mpt_status_message(st), mpt_last_error());
  return 1;
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: mpt_st_logits MODEL OUT TOKEN...\n");
    return 2;
  }
  const char *path = argv[1];
  const int64_t T = argc - 3;
  int32_t *toks = malloc((size_t)T * sizeof *toks);
  for (int64_t i = 0; i < T; i++) toks[i] = (int32_t)atoi(argv[3 + i]);
  mpt_model *model = NULL;
  mpt_status st;
  int64_t V, Vp;
  if (mpt_llama_st_is_model(path)) {
    mpt_llama_config c;
    if ((st = mpt_llama_st_read_header(path, &c)) != MPT_OK ||
        (st = mpt_model_init_llama(&model, mpt_device_cpu(), &c, 0)) != MPT_OK ||
        (st = mpt_llama_load(model, &c, path)) != MPT_OK)
      return fail(st);
    V = Vp = c.vocab_size;
  } else {
    mpt_gpt_config c;
    if ((st = mpt_gpt_file_read_header(path, &c)) != MPT_OK ||
        (st = mpt_model_init_gpt(&model, mpt_device_cpu(), &c, 0)) != MPT_OK ||
        (st = mpt_gpt_load(model, &c, path)) != MPT_OK)
      return fail(st);
    V = c.vocab_size;
    Vp = c.padded_vocab_size;
  }
  mpt_tape *tape;
  if ((st = mpt_tape_init(&tape, model, NULL)) != MPT_OK) return fail(st);
  mpt_tape_set_grad_enabled(tape, 0);
  const int64_t shape[2] = {1, T};
  mpt_tensor x = mpt_tensor_view(toks, mpt_device_cpu(), MPT_I32, 2, shape);
  mpt_var *in, *logits;
  mpt_tape_reset(tape, 0);
  if ((st = mpt_tape_input(tape, &x, &in)) != MPT_OK ||
      (st = mpt_model_forward(model, tape, in, &logits)) != MPT_OK)
    return fail(st);
  const float *y = (const float *)mpt_var_value(logits)->data;
  FILE *f = fopen(argv[2], "wb");
  if (!f) {
    fprintf(stderr, "mpt_st_logits: cannot write %s\n", argv[2]);
    return 1;
  }
  for (int64_t t = 0; t < T; t++) fwrite(y + t * Vp, sizeof *y, (size_t)V, f);
  if (fclose(f) != 0) return 1;
  mpt_tape_free(tape);
  mpt_model_free(model);
  free(toks);
  return 0;
}
