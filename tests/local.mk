# tests of the program (the unit tests are listed in each layer's local.mk)
TESTS += tests/test_cli.sh tests/test_kill_rank.sh tests/test_preempt.sh tests/test_resume.sh tests/test_ckpt_info.sh tests/test_ckpt_async.sh tests/test_resume_world.sh tests/test_nonfinite.sh tests/test_usage.sh tests/test_readme.sh
EXTRA_DIST += tests/expect.sh tests/test_cli.sh tests/test_kill_rank.sh tests/test_preempt.sh tests/test_resume.sh tests/test_ckpt_info.sh tests/test_ckpt_async.sh tests/test_resume_world.sh tests/test_nonfinite.sh tests/test_usage.sh tests/test_readme.sh
# the collective checkpoint tests of tests/test_ckpt.c (save by rank 0, load on every rank,
# errors reaching every rank) with 2 ranks
if HAVE_CHECK
TESTS += tests/test_ckpt_np2.mpi
endif
# --accumulate equals one step on the combined batch (remainder and short micro-batches)
TESTS += tests/test_accumulate.sh
EXTRA_DIST += tests/test_accumulate.sh
# ranks must load the same data (mpirun MPMD with -wdir)
TESTS += tests/test_data_agree.sh
EXTRA_DIST += tests/test_data_agree.sh
# --timeout covers MPI initialisation (a process of the job that never starts MPI)
TESTS += tests/test_init_timeout.sh
EXTRA_DIST += tests/test_init_timeout.sh
# a timeout names the rank that held the collective up (SIGSTOP of 1 of 3 ranks)
TESTS += tests/test_stall_culprit.sh
EXTRA_DIST += tests/test_stall_culprit.sh
TESTS += tests/test_cli_groups.sh
EXTRA_DIST += tests/test_cli_groups.sh
# --grad-comm fp32|bf16 (refusal, no-effect warning, 2-rank bf16 run against fp32)
TESTS += tests/test_grad_comm.sh
EXTRA_DIST += tests/test_grad_comm.sh
TESTS += tests/test_gemm_tune_run.sh
EXTRA_DIST += tests/test_gemm_tune_run.sh
# the trainer's --zero (ZeRO-1)
TESTS += tests/test_zero_cli.sh tests/test_recompute.sh tests/test_zero3_cli.sh
EXTRA_DIST += tests/test_zero_cli.sh tests/test_recompute.sh tests/test_zero3_cli.sh
# mpitrain tokenize (byte-level llm.c token shards from text)
TESTS += tests/test_tokenize.sh
EXTRA_DIST += tests/test_tokenize.sh
# mpitrain train --model gpt (1 and 2 ranks, --save-model / --init-from, bad inputs)
TESTS += tests/test_train_gpt.sh
EXTRA_DIST += tests/test_train_gpt.sh
# the one training loop: a GPT through every feature of the loop, every option with every model
TESTS += tests/test_train_loop_gpt.sh tests/test_options_models.sh tests/test_same_results.sh
EXTRA_DIST += tests/test_train_loop_gpt.sh tests/test_options_models.sh tests/test_same_results.sh
# the GPT trainer gives the same bits with --threads 1, 2 and 3 (the CPU ops' threads)
TESTS += tests/test_train_gpt_threads.sh
EXTRA_DIST += tests/test_train_gpt_threads.sh
# the GPT trainer on the GPU against the CPU (SKIP without a GPU; bench/gpu-check.sh)
TESTS += tests/test_train_gpt_cuda.sh
EXTRA_DIST += tests/test_train_gpt_cuda.sh
# bench/gpu-check.sh parses; its GPT stages and PyTorch side run on the CPU
TESTS += tests/test_gpu_check.sh
EXTRA_DIST += tests/test_gpu_check.sh
# mpitrain generate (a hand-made model file with a known output: greedy, top-k, seeds)
TESTS += tests/test_generate.sh
EXTRA_DIST += tests/test_generate.sh
# --precision fp32|bf16 (refusals, fp32 vs bf16 losses for mlp, cnn and a tiny GPT,
# 2-rank replicas)
TESTS += tests/test_precision.sh
EXTRA_DIST += tests/test_precision.sh
# bad inputs and misuse of tokenize, token shards, model files, train --model gpt, generate
TESTS += tests/test_gpt_bad_input.sh
EXTRA_DIST += tests/test_gpt_bad_input.sh
# Hugging Face safetensors models through train --init-from / --save-model and generate,
# against tests/st_oracle.py (a file written from the format alone)
TESTS += tests/test_safetensors_cli.sh
EXTRA_DIST += tests/test_safetensors_cli.sh tests/st_oracle.py
# every MPT_API declaration in include/ has a comment block directly above it
TESTS += tests/test_header_docs.sh
EXTRA_DIST += tests/test_header_docs.sh
# bad inputs and misuse of the mlp/cnn trainer and the shared command line (faults.md F44-)
TESTS += tests/test_bad_input.sh
EXTRA_DIST += tests/test_bad_input.sh
# SIGUSR1 / SIGTERM at random moments of the first steps, under load, every run exits
# 75 (a signal handled inside oneDNN's GEMMs corrupted the heap: docs/faults.md F52);
# MPT_PREEMPT_RUNS runs (default 20)
TESTS += tests/test_preempt_stress.sh
EXTRA_DIST += tests/test_preempt_stress.sh
# the hang report on hand-made flight-recorder dumps: agreeing, diverging, missing, cut short,
# garbage (docs/hangs.md)
TESTS += tests/test_hang_report.sh
EXTRA_DIST += tests/test_hang_report.sh
# the flight recorder on 2-rank jobs: a skipped step named by hang-report and by checked mode, a
# stopped rank's timeout dump, SIGUSR2 dumps of a live job that goes on (docs/hangs.md)
TESTS += tests/test_flight.sh
EXTRA_DIST += tests/test_flight.sh
# stragglers: a rank slowed by fault injection is named by rank 0's line and in the metrics JSON
TESTS += tests/test_straggler.sh
EXTRA_DIST += tests/test_straggler.sh
