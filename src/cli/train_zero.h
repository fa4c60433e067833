/* ZeRO-1, the GPU gradient communicator and the memory report in the trainers
 * (src/cli/train_zero.c). */
#ifndef MPT_CLI_TRAIN_ZERO_H
#define MPT_CLI_TRAIN_ZERO_H

#include "cli/options.h"
#include "mpitrain/comm.h"
#include "mpitrain/ddp.h"
#include "mpitrain/optim.h"

/* The trainer's optimizer: through the DDP engine when there is one (a shard of the state with
 * --zero 1), else of the whole model. Errors: the optimizer's. */
mpt_status trainer_opt_init(mpt_ddp *ddp, mpt_model *model, const mpt_optimizer_config *cfg,
                            mpt_device device, mpt_optimizer **opt);
/* For a checkpoint: *whole = opt without ZeRO; with ZeRO-1 a new whole host optimizer of the
 * same config, filled with every rank's shard when `gather` (collective) or left zero (to load
 * into); on a rank that does not `need` it (not the writer) *whole is NULL and the rank only
 * takes part in the gather. Give it back with trainer_opt_whole_done, which with `scatter`
 * first copies this rank's shard of it into opt. Errors: MPT_ENOMEM, those of the gather. */
mpt_status trainer_opt_whole(mpt_ddp *ddp, mpt_model *model, mpt_optimizer *opt, int gather,
                             int need, mpt_optimizer **whole);
mpt_status trainer_opt_whole_done(mpt_ddp *ddp, mpt_optimizer *opt, mpt_optimizer *whole,
                                  int scatter);
/* Collective: rank 0 logs one line per rank: bytes of parameters, gradients and optimizer
 * state (the shard with ZeRO-1), peak resident memory (VmHWM), and bytes sent per step by the
 * DDP engine (ring model, ddp.h mpt_ddp_sent_bytes): planned (steps 0) or counted over the
 * `steps` steps run. `when`: "at start" / "at the end". Errors: comm errors, MPT_ENOMEM. */
mpt_status trainer_memory_report(mpt_comm *comm, const char *when, mpt_model *model,
                                 mpt_optimizer *opt, mpt_ddp *ddp, int64_t steps);

/* Collective: the communicator of a GPU model's gradients, bound to `device`: NCCL, or, where
 * NCCL is not available (MPT_ENOTSUP, with a warning), MPI staged in host memory; deadline and
 * --check-collectives from the options. Errors: those of mpt_comm_init. */
mpt_status trainer_grad_comm_init(const mpt_cli_options *o, mpt_device device, mpt_comm **out);

#endif
