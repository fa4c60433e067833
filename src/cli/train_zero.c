/* ZeRO-1 and the memory report in the two trainers (train.c for mlp/cnn, train_gpt.c): the
 * optimizer made through the DDP engine (a shard of the state with --zero 1), the whole state
 * assembled for a checkpoint and split again on resume (ddp.h "ZeRO-1": one file, so a run
 * resumes with or without ZeRO), and the per-rank report of bytes of parameters, gradients,
 * optimizer state, peak resident memory and bytes sent per step. Runs on the training thread;
 * the functions that say "collective" are called by every rank at the same point. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "cli/train_zero.h"
#include "mpitrain/core.h"
#include "mpitrain/comm.h"

mpt_status trainer_opt_init(mpt_ddp *ddp, mpt_model *model, const mpt_optimizer_config *cfg,
                            mpt_device device, mpt_optimizer **opt) {
  if (ddp) return mpt_ddp_optimizer_init(ddp, opt, cfg, device);
  return mpt_optimizer_init(opt, cfg, device, mpt_model_param_count(model));
}

mpt_status trainer_opt_whole(mpt_ddp *ddp, mpt_model *model, mpt_optimizer *opt, int gather,
                             int need, mpt_optimizer **whole) {
  *whole = opt;
  if (!ddp || !mpt_ddp_zero_stage(ddp)) return MPT_OK;
  mpt_optimizer *w = NULL;
  if (!need) { /* this rank only takes part in the gather */
    *whole = NULL;
    return gather ? mpt_ddp_optimizer_gather(ddp, opt, NULL) : MPT_OK;
  }
  MPT_RETURN_IF(mpt_optimizer_init(&w, mpt_optimizer_get_config(opt), mpt_device_cpu(),
                                   mpt_model_param_count(model)));
  mpt_status st = gather ? mpt_ddp_optimizer_gather(ddp, opt, w) : MPT_OK;
  if (st != MPT_OK) {
    mpt_optimizer_free(w);
    return st;
  }
  *whole = w;
  return MPT_OK;
}

mpt_status trainer_opt_whole_done(mpt_ddp *ddp, mpt_optimizer *opt, mpt_optimizer *whole,
                                  int scatter) {
  if (whole == opt || !whole) return MPT_OK;
  mpt_status st = scatter ? mpt_ddp_optimizer_scatter(ddp, whole, opt) : MPT_OK;
  mpt_optimizer_free(whole);
  return st;
}

/* Peak resident set of this process in bytes: VmHWM of /proc/self/status (Linux), else
 * getrusage's ru_maxrss (KiB on Linux). */
static double peak_rss_bytes(void) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  long long kib = -1;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "VmHWM: %lld kB", &kib) == 1) break;
  if (f) fclose(f);
  if (kib < 0) {
    struct rusage ru;
    kib = getrusage(RUSAGE_SELF, &ru) == 0 ? ru.ru_maxrss : 0;
  }
  return 1024.0 * (double)kib;
}

enum { REPORT_FIELDS = 5 };

mpt_status trainer_memory_report(mpt_comm *comm, const char *when, mpt_model *model,
                                 mpt_optimizer *opt, mpt_ddp *ddp, int64_t steps) {
  const int world = mpt_comm_world_size(comm), rank = mpt_comm_rank(comm);
  mpt_optimizer_state os;
  MPT_RETURN_IF(mpt_optimizer_get_state(opt, &os));
  const double pbytes = 4.0 * (double)mpt_model_param_count(model);
  double mine[REPORT_FIELDS] = {
      pbytes, pbytes, 4.0 * (double)os.nbuffers * (double)os.count, peak_rss_bytes(),
      !ddp ? 0.0 : steps > 0 ? mpt_ddp_sent_bytes(ddp) / (double)steps : mpt_ddp_step_bytes(ddp)};
  double *all = malloc(sizeof mine * (size_t)world);
  if (!all) return MPT_FAIL(MPT_ENOMEM, "memory report of %d ranks", world);
  mpt_status st = MPT_OK;
  if (world > 1)
    st = mpt_comm_allgather_sync(comm, mine, all, (int64_t)sizeof mine, MPT_U8);
  else
    memcpy(all, mine, sizeof mine);
  const double mib = 1.0 / 1048576.0;
  for (int r = 0; st == MPT_OK && rank == 0 && r < world; r++) {
    const double *v = all + (size_t)r * REPORT_FIELDS;
    mpt_log(MPT_LOG_INFO, "memory %s, rank %d: parameters %.2f MiB, gradients %.2f MiB, "
            "optimizer state %.2f MiB%s, peak resident %.1f MiB; sent per step %.2f MiB (%s, "
            "ring model)", when, r, v[0] * mib, v[1] * mib, v[2] * mib,
            ddp && mpt_ddp_zero_stage(ddp) ? " (ZeRO-1 shard)" : "", v[3] * mib, v[4] * mib,
            steps > 0 ? "counted" : "planned");
  }
  free(all);
  return st;
}

/* See train_zero.h. */
mpt_status trainer_grad_comm_init(const mpt_cli_options *o, mpt_device device, mpt_comm **out) {
  mpt_comm_config cc = mpt_comm_config_default();
  cc.backend = MPT_COMM_BACKEND_NCCL;
  cc.device = device;
  cc.timeout_ms = o->timeout_s * 1e3;
  cc.check_collectives = o->check_collectives;
  cc.configure_log = 0;
  mpt_status st = mpt_comm_init(out, &cc);
  if (st == MPT_ENOTSUP) {
    mpt_log(MPT_LOG_WARN, "NCCL is not available (%s): gradients go through MPI, staged in host "
            "memory", mpt_last_error());
    cc.backend = MPT_COMM_BACKEND_MPI;
    st = mpt_comm_init(out, &cc);
  }
  return st;
}
