/* --precision (issue 14): the arithmetic of the tape's GEMMs and convolutions, for the mlp/cnn
 * trainer (train.c; with --mode dp the replicas' tapes get it through mpt_dp_config) and the
 * GPT trainer (train_gpt.c). mpt_tape_set_precision checks that the
 * device runs bf16 natively, so a CPU without AVX-512 BF16, or a build without oneDNN, stops the
 * run at start with the reason (never a slow emulation). Runs on the training thread. */
#include "cli/train_impl.h"
#include "mpitrain.h"

mpt_status trainer_set_precision(mpt_tape *tape, mpt_precision precision) {
  if (precision == MPT_PRECISION_FP32) return MPT_OK;
  MPT_RETURN_IF(mpt_tape_set_precision(tape, precision));
  mpt_log(MPT_LOG_INFO, "precision %s: GEMMs and convolutions take bf16 inputs and accumulate in "
          "fp32; parameters, gradients and the optimizer stay fp32", mpt_precision_name(precision));
  return MPT_OK;
}

mpt_status trainer_tape_init(trainer *t) {
  MPT_RETURN_IF(mpt_tape_init(&t->tape, t->model, t->stream));
  return trainer_set_precision(t->tape, t->o->precision);
}

mpt_dp_config trainer_dp_config(const mpt_cli_options *o) {
  mpt_dp_config pc = mpt_dp_config_default();
  pc.timeout_ms = o->timeout_s * 1e3;
  pc.precision = o->precision; /* every replica's tape */
  return pc;
}
