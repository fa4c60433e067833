/* mpitrain: data-parallel training (DDP, DP) over MPI and NCCL. The umbrella header. */
#ifndef MPITRAIN_H
#define MPITRAIN_H

#include "mpitrain/core.h"
#include "mpitrain/ops.h"
#include "mpitrain/ops_gpt.h"
#include "mpitrain/ops_bf16.h"
#include "mpitrain/ops_llama.h"
#include "mpitrain/nn.h"
#include "mpitrain/autograd.h"
#include "mpitrain/gpt_config.h"
#include "mpitrain/transformer.h"
#include "mpitrain/llama.h"
#include "mpitrain/llama_file.h"
#include "mpitrain/data.h"
#include "mpitrain/optim.h"
#include "mpitrain/comm.h"
#include "mpitrain/ddp.h"
#include "mpitrain/ckpt.h"
#include "mpitrain/gpt_file.h"
#include "mpitrain/safetensors.h"
#include "mpitrain/dp.h"
#include "mpitrain/trainer.h"

#endif
