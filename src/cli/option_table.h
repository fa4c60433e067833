/* The option table of the mpitrain program (src/cli/options.c reads it): each row names an
 * option, how its value is parsed and checked, the model families that take it, its section and
 * help text. Included by options.c only; the table is data, options.c the parser, the usage
 * text and the refusals built from it. */
#ifndef MPT_CLI_OPTION_TABLE_H
#define MPT_CLI_OPTION_TABLE_H

#include <stddef.h>
#include <stdint.h>

#include "cli/options.h"

/* Model families: which options a model takes (LM: the language models, GPT and Llama). */
enum { MLP = 1, CNN = 2, GPT = 4, LLAMA = 8, IMG = MLP | CNN, LM = GPT | LLAMA,
       ALL = MLP | CNN | GPT | LLAMA };

/* How a row's value is parsed: into an int64_t, int, double or float field with a range; a
 * string into a char array; a flag that sets an int to 1 or 0; or its own code (FN). */
typedef enum { P_I64, P_INT, P_F64, P_F32, P_F32D, P_STR, P_ON, P_OFF, P_FN } parse_kind;

#define FIELD(f) {offsetof(mpt_cli_options, f), sizeof(((mpt_cli_options *)0)->f)}
#define NOFIELD {0, 0}
#define BIG (INT64_C(1) << 40)

/* X(id, name, kind, field, lo, hi, families, section, argument, help, not for the others)
 * Help lines are separated by '\n'; the reason completes "--NAME does not apply to --model M:
 * ...". Sections in the order the usage prints them. */
#define OPTIONS(X)                                                                              \
  X(MODEL, "model", P_FN, FIELD(model), 0, 0, ALL, "model and data",                            \
    "MODEL",                                                                                    \
    "mlp (the default: 784-512-512-10), cnn, gpt,\ngpt-mini, gpt2, gpt2-medium, gpt2-large, "     \
    "llama-tiny\nor llama-mini. gpt-mini (6 layers, 6 heads, 384,\nT 256, bytes), "              \
    "gpt2 (124M),\ngpt2-medium (350M: 24 layers, 16 heads, 1024) and\ngpt2-large (774M: 36 "    \
    "layers, 20 heads, 1280)\nare GPT-2 presets, gpt is gpt-mini's sizes unless given;\n"       \
    "llama-mini (6 layers, 6 heads, 2 key/value heads,\n384, MLP 1024, T 256, bytes) and "       \
    "llama-tiny (2\nlayers, 4 heads, 2 key/value heads, 64, MLP 192, T 64)\nare Llama presets "  \
    "(RMSNorm, RoPE, SwiGLU, grouped-\nquery attention; CPU); llama is the shape of\n"           \
    "--init-from's config.json (Hugging Face)", "")                                             \
  X(HIDDEN, "hidden", P_FN, FIELD(mlp), 0, 0, MLP, "model and data", "N[,N...]",                \
    "mlp hidden sizes (default 512,512)", "it sets the mlp's hidden sizes")                     \
  X(BATCHNORM, "batchnorm", P_ON, FIELD(cnn.batchnorm), 0, 0, CNN, "model and data", "",        \
    "cnn: BatchNorm2d after each convolution", "only the cnn has convolutions to normalise")    \
  X(DROPOUT, "dropout", P_FN, NOFIELD, 0, 0.99, IMG, "model and data", "P",                     \
    "mlp and cnn: dropout probability in [0, 1) (default 0)",                                   \
    "a language model has no dropout layers")                                                            \
  X(DATA, "data", P_STR, FIELD(data_dir), 0, 0, IMG, "model and data", "DIR",                   \
    "Fashion-MNIST IDX files (default: Debian's\ndataset-fashion-mnist folder)",                \
    "a language model reads token shards (--shards)")                                           \
  X(SYNTHETIC, "synthetic", P_ON, FIELD(synthetic), 0, 0, IMG, "model and data", "",            \
    "random images of the same shape (benchmarks)",                                             \
    "a language model reads token shards (--shards)")                                           \
  X(TRAIN_LIMIT, "train-limit", P_I64, FIELD(train_limit), 0, BIG, ALL, "model and data", "N",  \
    "use the first N training samples: images, or token\nwindows (0 = all)", "")                \
  X(TEST_LIMIT, "test-limit", P_I64, FIELD(test_limit), 0, BIG, ALL, "model and data", "N",     \
    "use the first N test (GPT: validation) samples (0 = all)", "")                             \
  X(N_LAYER, "n-layer", P_FN, NOFIELD, 1, 1024, GPT, "language models (--model gpt*, llama*)", "L",     \
    "--model gpt: layers (the vocabulary is padded to a\nmultiple of 128)", "a GPT's size")     \
  X(N_HEAD, "n-head", P_FN, NOFIELD, 1, 1024, GPT, "language models (--model gpt*, llama*)", "H",       \
    "--model gpt: attention heads", "a GPT's size")                                             \
  X(N_EMBD, "n-embd", P_FN, NOFIELD, 1, 1 << 16, GPT, "language models (--model gpt*, llama*)", "C",    \
    "--model gpt: channels", "a GPT's size")                                                    \
  X(SEQ_LEN, "seq-len", P_FN, NOFIELD, 1, 1 << 20, LM, "language models (--model gpt*, llama*)", "T",  \
    "--model gpt: sequence length; a Llama: the training\nwindow (default and at most its "     \
    "T)", "a language model's size")                                                            \
  X(VOCAB_SIZE, "vocab-size", P_FN, NOFIELD, 1, 65536, GPT, "language models (--model gpt*, llama*)",   \
    "V", "--model gpt: vocabulary", "a GPT's size")                                             \
  X(SHARDS, "shards", P_STR, FIELD(shards), 0, 0, LM, "language models (--model gpt*, llama*)",        \
    "GLOB", "training token shards (llm.c format; required)",                                   \
    "the mlp and cnn train on images (--data)")                                                 \
  X(VAL_SHARDS, "val-shards", P_STR, FIELD(val_shards), 0, 0, LM,                              \
    "language models (--model gpt*, llama*)", "GLOB",                                                   \
    "validation shards: loss in nats per token",                                                \
    "the mlp and cnn are evaluated on the --data test set")                                     \
  X(INIT_FROM, "init-from", P_STR, FIELD(init_from), 0, 0, LM,                                  \
    "language models (--model gpt*, llama*)", "PATH",                                                   \
    "start from a model of the same sizes: an llm.c\nmodel file (GPT-2), or Hugging Face "        \
    "safetensors (a "                                                                           \
    "folder\nwith config.json and model.safetensors or sharded\nmodel.safetensors.index.json, "    \
    "or X.safetensors\nwith config.json beside it)",                                           \
    "llm.c model files hold GPT-2 models (checkpoints, --resume, hold any model)")              \
  X(SAVE_MODEL, "save-model", P_STR, FIELD(save_model), 0, 0, LM,                               \
    "language models (--model gpt*, llama*)", "PATH",                                                   \
    "write the final model (rank 0): X.bin, an llm.c\nmodel file (GPT-2); X.safetensors or a "     \
    "folder\n(created when missing: a path ending in / or without\n.safetensors; a GPT-2's: "    \
    "without an extension):\nHugging Face safetensors (--save-dtype,\n--save-shard-size) "      \
    "and config.json beside it",                                                                \
    "llm.c model files hold GPT-2 models (--save-params writes any model's parameters)")        \
  X(SAVE_DTYPE, "save-dtype", P_FN, NOFIELD, 0, 0, LM,                                          \
    "language models (--model gpt*, llama*)",                                                   \
    "fp32|bf16", "safetensors --save-model: the tensors' dtype; bf16\n"                          \
    "rounds to nearest even (default fp32)",                                                    \
    "llm.c model files hold GPT-2 models (--save-params writes any model's parameters)")        \
  X(SAVE_SHARD_SIZE, "save-shard-size", P_FN, NOFIELD, 0, 0, LM,                               \
    "language models (--model gpt*, llama*)", "SIZE",                                                   \
    "--save-model FOLDER: past SIZE bytes of tensors, shards\n"                                 \
    "model-0000K-of-0000N.safetensors and their\nmodel.safetensors.index.json, as transformers "  \
    "(KB, MB,\nGB: powers of 1000; KiB, MiB, GiB: of 1024; default 5GB)",                        \
    "llm.c model files hold GPT-2 models (--save-params writes any model's parameters)")        \
  X(RECOMPUTE, "recompute", P_ON, FIELD(recompute), 0, 0, LM, "language models (--model gpt*, llama*)", \
    "", "recompute each transformer block's activations in\nbackward: keeps only the blocks' "   \
    "inputs, one more\nforward per step, the same bits (llm.c's -r)",                            \
    "only the language models have transformer blocks to recompute")                                         \
  X(EPOCHS, "epochs", P_I64, FIELD(epochs), 1, 100000, ALL, "training", "N",                    \
    "epochs (default 10; GPT 1)", "")                                                           \
  X(BATCH, "batch-size", P_FN, FIELD(batch_size), 1, 1 << 20, ALL, "training", "N|auto",        \
    "samples per step PER RANK (default 64; GPT 8\nsequences of --seq-len tokens); auto: on a "   \
    "resume,\nthe one that keeps the checkpoint's global batch", "")                            \
  X(MAX_STEPS, "max-steps", P_I64, FIELD(max_steps), 0, BIG, ALL, "training", "N",              \
    "stop each epoch after N steps (0 = whole epoch)", "")                                      \
  X(ACCUMULATE, "accumulate", P_FN, FIELD(accumulate), 1, 1 << 20, ALL, "training", "K|auto",   \
    "K micro-batches per optimizer step (no_sync on K-1);\nauto: on a resume, the K that keeps "  \
    "the checkpoint's\nglobal batch (1 on a new run)", "")                                      \
  X(OPTIMIZER, "optimizer", P_FN, NOFIELD, 0, 0, ALL, "training", "sgd|adamw",                  \
    "(default sgd; GPT adamw)", "")                                                             \
  X(LR, "lr", P_F32, FIELD(optim.lr), 0, 1e3, ALL, "training", "F",                            \
    "base learning rate (default 0.05; GPT 1e-3, gpt2 6e-4,\ngpt2-medium 3e-4, gpt2-large "     \
    "2.5e-4)", "")                                                                              \
  X(MOMENTUM, "momentum", P_F32, FIELD(optim.momentum), 0, 1, ALL, "training", "F",             \
    "SGD momentum (default 0.9)", "")                                                           \
  X(NESTEROV, "nesterov", P_ON, FIELD(optim.nesterov), 0, 0, ALL, "training", "",               \
    "Nesterov momentum", "")                                                                    \
  X(WD, "weight-decay", P_F32, FIELD(optim.weight_decay), 0, 1e3, ALL, "training", "F",         \
    "weight decay (default 0.0005; GPT 0.1)", "")                                               \
  X(ADAM_BETA1, "adam-beta1", P_F32, FIELD(optim.beta1), 0, 0.999999, ALL, "training", "F",     \
    "AdamW beta1 in [0, 1) (default 0.9)", "")                                                  \
  X(ADAM_BETA2, "adam-beta2", P_F32, FIELD(optim.beta2), 0, 0.999999, ALL, "training", "F",     \
    "AdamW beta2 in [0, 1) (default 0.999; GPT 0.95)", "")                                      \
  X(ADAM_EPS, "adam-eps", P_F32, FIELD(optim.eps), 1e-30, 1, ALL, "training", "F",              \
    "AdamW epsilon (default 1e-8)", "")                                                         \
  X(NO_DECAY_BIAS_NORM, "no-decay-bias-norm", P_ON, FIELD(no_decay_bias_norm), 0, 0, ALL,       \
    "training", "", "no weight decay on biases and norm parameters (1-D;\nthe GPT's default)",  \
    "")                                                                                         \
  X(SCHEDULE, "schedule", P_FN, NOFIELD, 0, 0, ALL, "training", "constant|step|cosine",         \
    "learning-rate schedule (default cosine)", "")                                              \
  X(WARMUP, "warmup-steps", P_I64, FIELD(schedule.warmup_steps), 0, BIG, ALL, "training", "N",  \
    "linear warm-up from lr / 3 to lr over N steps, as\nPyTorch's LinearLR (default 0)", "")    \
  X(STEP_SIZE, "step-size", P_I64, FIELD(schedule.step_size), 1, BIG, ALL, "training", "N",     \
    "step schedule: steps per decay (default 1 epoch)", "")                                     \
  X(GAMMA, "gamma", P_F32, FIELD(schedule.gamma), 1e-9, 1e3, ALL, "training", "F",              \
    "step schedule: decay factor (default 0.1)", "")                                            \
  X(MIN_LR, "min-lr", P_F32, FIELD(schedule.min_lr), 0, 1e3, ALL, "training", "F",              \
    "cosine final learning rate (default 0)", "")                                               \
  X(GRAD_CLIP, "grad-clip", P_F32D, FIELD(grad_clip), 0, 1e9, ALL, "training", "F",             \
    "clip the global gradient L2 norm to F (0 = off;\ndefault 0; GPT 1.0)", "")                 \
  X(SEED, "seed", P_FN, NOFIELD, 0, 0, ALL, "training", "N",                                    \
    "seed of initialisation, shuffling, dropout (default 1)", "")                               \
  X(NO_SHUFFLE, "no-shuffle", P_OFF, FIELD(shuffle), 0, 0, ALL, "training", "",                 \
    "DistributedSampler: no reshuffling per epoch", "")                                         \
  X(DROP_LAST, "drop-last", P_ON, FIELD(drop_last), 0, 0, ALL, "training", "",                  \
    "DistributedSampler: drop the tail the ranks cannot\nshare evenly", "")                     \
  X(BUCKET_CAP, "bucket-cap-mb", P_F64, FIELD(ddp.bucket_cap_mb), 1e-6, 1e6, ALL,               \
    "distributed", "F", "gradient bucket size in MiB (default 25)", "")                         \
  X(FIRST_BUCKET_CAP, "first-bucket-cap-mb", P_F64, FIELD(ddp.first_bucket_cap_mb), 1e-6, 1e6, \
    ALL, "distributed", "F", "first bucket size in MiB (default 1)", "")                        \
  X(UNIT_BUCKETS, "unit-buckets", P_ON, FIELD(ddp.unit_buckets), 0, 0, ALL, "distributed", "",  \
    "one bucket per model unit (a GPT block, a layer),\nthe caps unused; --zero 3 always does",  \
    "")                                                                                         \
  X(NO_OVERLAP, "no-overlap", P_OFF, FIELD(ddp.overlap), 0, 0, ALL, "distributed", "",          \
    "all-reduce after backward instead of during it", "")                                       \
  X(FIND_UNUSED, "find-unused-parameters", P_ON, FIELD(ddp.find_unused_parameters), 0, 0, ALL,  \
    "distributed", "", "treat parameters the forward skipped as zero gradient", "")             \
  X(BUFFERS, "buffers", P_FN, NOFIELD, 0, 0, ALL, "distributed", "broadcast|average|none",      \
    "BatchNorm statistics across ranks", "")                                                    \
  X(GRAD_COMM, "grad-comm", P_FN, NOFIELD, 0, 0, ALL, "distributed", "fp32|bf16",               \
    "gradients on the wire: bf16 rounds each bucket to\nbfloat16, sums in fp32 steps, half "     \
    "the bytes (default\nfp32; error bound in ddp.h; CPU models)", "")                          \
  X(ZERO, "zero", P_FN, NOFIELD, 0, 0, ALL, "distributed", "0|1|2|3",                           \
    "ZeRO stage: 1 shards the optimizer state over the ranks\n(reduce-scatter + all-gather), 2 "  \
    "also the gradients\n(each bucket's memory outside the shard given back\nafter its "          \
    "reduce-scatter), 3 also the parameters\n(each unit all-gathered before its forward and\n"    \
    "backward, given back after) (default 0; CPU models)", "")                                  \
  X(NO_PREFETCH, "no-prefetch", P_OFF, FIELD(ddp.prefetch), 0, 0, ALL, "distributed", "",        \
    "--zero 3: gather each unit when it is reached instead of\nduring the previous unit's "      \
    "compute", "")                                                                              \
  X(ALLREDUCE_ALGO, "allreduce-algo", P_FN, NOFIELD, 0, 0, ALL, "distributed", "native|rs-ag",  \
    "plain DDP's all-reduce: rs-ag = ZeRO-1's\nreduce-scatter + all-gather, so --zero 0 and 1 "  \
    "train\nbit for bit alike (default native; CPU models)", "")                                \
  X(TIMEOUT, "timeout", P_F64, FIELD(timeout_s), 0.001, 1e6, ALL, "distributed", "SEC",         \
    "deadline of every collective and of start-up, MPI\ninitialisation included (at least 10 "   \
    "s) (default 300)", "")                                                                     \
  X(CHECK_COLL, "check-collectives", P_ON, FIELD(check_collectives), 0, 0, ALL, "distributed",  \
    "", "compare (op, count, dtype) across ranks first", "")                                    \
  X(MODE, "mode", P_FN, NOFIELD, 0, 0, ALL, "distributed", "ddp|dp",                            \
    "dp: DataParallel inside each rank over --devices", "")                                     \
  X(DEVICES, "devices", P_FN, FIELD(devices), 0, 0, ALL, "distributed", "cpu:K",                \
    "the devices of --mode dp (K CPU devices)", "")                                             \
  X(CKPT_DIR, "checkpoint-dir", P_STR, FIELD(checkpoint_dir), 0, 0, ALL, "checkpoints", "DIR",  \
    "write checkpoints here (rank 0; atomic rename)", "")                                       \
  X(CKPT_EVERY, "checkpoint-every", P_FN, NOFIELD, 0, 0, ALL, "checkpoints", "N|epoch",         \
    "every N optimizer steps, or per epoch (default epoch)", "")                                \
  X(CKPT_ASYNC, "checkpoint-async", P_FN, NOFIELD, 0, 0, ALL, "checkpoints", "on|off",         \
    "on: snapshot the state into host memory and write the\nfile on a background thread "       \
    "(default off)", "")                                                                        \
  X(KEEP, "keep", P_INT, FIELD(keep), 1, 1000000, ALL, "checkpoints", "K",                      \
    "keep the last K checkpoints (default 3)", "")                                              \
  X(RESUME, "resume", P_STR, FIELD(resume), 0, 0, ALL, "checkpoints", "FILE|DIR|auto",          \
    "continue from a checkpoint (DIR: its latest; auto: the\nlatest of --checkpoint-dir if it "  \
    "has one, else start)", "")                                                                 \
  X(STOP_AT, "stop-at-step", P_I64, FIELD(stop_at_step), 1, BIG, ALL, "checkpoints", "N",       \
    "stop after global step N (checkpointing if on)", "")                                       \
  X(SKIP_NONFINITE, "skip-nonfinite", P_ON, FIELD(skip_nonfinite), 0, 0, ALL, "faults", "",     \
    "skip steps whose averaged gradients are NaN/Inf (every\nrank skips the same steps); "       \
    "default: stop at the first\nnon-finite loss, naming the step and rank", "")                \
  X(CHECK_REPLICAS, "check-replicas", P_I64, FIELD(check_replicas), 1, BIG, ALL, "faults", "N", \
    "every N steps compare a CRC-32 of the parameters across\nranks and name the first rank "    \
    "whose replica diverged", "")                                                               \
  X(FLIGHT_RECORDER, "flight-recorder", P_I64, FIELD(flight_recorder), 0, 10000000, ALL,      \
    "faults", "N", "keep each rank's last N collectives for the hang\nreport (default 2000; 0 = "  \
    "off)", "")                                                                                 \
  X(DEBUG_DIR, "debug-dir", P_STR, FIELD(debug_dir), 0, 0, ALL, "faults", "DIR",                \
    "flight-recorder dumps (SIGUSR2, timeout, error, crash):\nDIR/flight-rankR.txt (default "   \
    "--checkpoint-dir,\nelse ./mpitrain-debug); read: mpitrain hang-report DIR", "")             \
  X(STRAGGLER_WARN, "straggler-warn", P_F64, FIELD(straggler_warn), 1, 1e6, ALL, "faults", "F", \
    "at each --log-every line, warn when the slowest rank's\ncompute per step is over F x the "  \
    "fastest's (default 1.2)", "")                                                              \
  X(VAL_EVERY, "val-every", P_I64, FIELD(val_every), 0, BIG, ALL, "evaluation and output", "N", \
    "evaluate every N steps too (default 0: at the end of\neach epoch; GPT also before the "     \
    "first step)", "")                                                                          \
  X(VAL_STEPS, "val-steps", P_I64, FIELD(val_steps), 0, BIG, ALL, "evaluation and output", "N", \
    "at most N evaluation batches per rank (default 0: all;\nGPT 20 windows)", "")              \
  X(LOG_EVERY, "log-every", P_I64, FIELD(log_every), 0, BIG, ALL, "evaluation and output", "N", \
    "a loss, norm, lr and throughput line every N steps\n(default 0: none; GPT 10)", "")        \
  X(PROFILE, "profile", P_ON, FIELD(profile), 0, 0, ALL, "evaluation and output", "",           \
    "at the end, each op's forward and backward time per\nstep (rank 0, steps after the first;"  \
    " docs/gpt.md)", "")                                                                        \
  X(THREADS, "threads", P_INT, FIELD(threads), 1, 1024, ALL, "evaluation and output", "N",      \
    "CPU threads per rank: BLAS, oneDNN and the other large\nops (default: the host's cores / "  \
    "its ranks, e.g. 1 with\n2 ranks on 2 cores)", "")                                          \
  X(METRICS, "metrics-json", P_STR, FIELD(metrics_json), 0, 0, ALL, "evaluation and output",    \
    "FILE", "per-epoch metrics and the run's figures as JSON", "")                              \
  X(SAVE_PARAMS, "save-params", P_STR, FIELD(save_params), 0, 0, ALL, "evaluation and output",  \
    "FILE", "final parameters as raw float32 (rank 0)", "")                                     \
  X(TRACE, "trace", P_STR, FIELD(trace), 0, 0, ALL, "evaluation and output", "FILE",            \
    "Chrome trace of forward/backward/all-reduce/optimizer", "")                                \
  X(PROGRESS, "progress", P_FN, NOFIELD, 0, 0, ALL, "evaluation and output", "",                \
    "progress bar (default: when stderr is a terminal)", "")                                    \
  X(NO_PROGRESS, "no-progress", P_FN, NOFIELD, 0, 0, ALL, "evaluation and output", "",          \
    "no progress bar", "")                                                                      \
  X(PROGRESS_INTERVAL, "progress-interval", P_F64, FIELD(progress_interval_s), 0, 1e6, ALL,     \
    "evaluation and output", "SEC", "stderr not a terminal: a progress line on rank 0 every\n"   \
    "SEC seconds (default 30; 0 = none)", "")                                                   \
  X(LOG_FILE, "log-file", P_STR, FIELD(log_file), 0, 0, ALL, "evaluation and output", "FILE",   \
    "each rank appends its output to FILE.RANK", "")                                            \
  X(QUIET, "quiet", P_ON, FIELD(quiet), 0, 0, ALL, "evaluation and output", "",                 \
    "warnings and errors only", "")                                                             \
  X(DEVICE, "device", P_FN, FIELD(device), 0, 0, ALL, "evaluation and output", "cpu|cuda",      \
    "(default: cuda when every rank sees a GPU, else cpu)", "")                                 \
  X(CONV_ALGO, "conv-algo", P_FN, NOFIELD, 0, 0, IMG, "evaluation and output",                  \
    "auto|im2col|onednn",                                                                       \
    "convolutions: oneDNN (when built with it) or\nim2col + GEMM (default auto: oneDNN when "    \
    "available)", "a language model has no convolutions")                                   \
  X(GEMM, "gemm", P_FN, NOFIELD, 0, 0, ALL, "evaluation and output",                           \
    "auto|openblas|onednn|tune",                                                                \
    "CPU fp32 GEMMs: auto (default) oneDNN with its AVX-512\nkernels; with AVX2 only, OpenBLAS "  \
    "below 2^27\nmultiply-adds and oneDNN above (measured: docs/cluster.md);\ntune: time both "  \
    "on the first step's shapes, choose\nper shape, cache per host (opt-in: a timed choice\n"     \
    "may change the last bits from run to run); the timing\ntakes at most 0.4 s a run: "         \
    "shapes it leaves\nuntimed keep the rule and are timed by later runs", "")                  \
  X(GEMM_CACHE, "gemm-cache", P_STR, FIELD(gemm_cache), 0, 0, ALL, "evaluation and output",     \
    "FILE", "--gemm tune's cache file (default $MPT_GEMM_CACHE,\nelse "                          \
    "~/.cache/mpitrain/gemm-HOST-HASH.txt)", "")                                                \
  X(PRECISION, "precision", P_FN, NOFIELD, 0, 0, ALL, "evaluation and output", "fp32|bf16",     \
    "GEMMs and convolutions: bf16 inputs, fp32 accumulation\n(oneDNN on CPUs with AVX-512 BF16,"  \
    " cuBLAS on GPUs);\nweights, gradients, optimizer stay fp32 (default fp32)", "")            \
  X(HELP, "help", P_FN, NOFIELD, 0, 0, ALL, "", "", "", "")                                     \
  X(VERSION, "version", P_FN, NOFIELD, 0, 0, ALL, "", "", "", "")

#endif /* MPT_CLI_OPTION_TABLE_H */
