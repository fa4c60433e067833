/* Command-line parsing for `mpitrain train` with getopt_long, from one table (OPTIONS below):
 * a row per option gives its name, how its value is parsed and into which field, its range,
 * the model families that take it, its section and help text. From the table come getopt's
 * list, the usage text (and so the manual page) and the refusal, with the model's reason, of
 * an option the chosen model does not take. Pure: fills a struct or a one-line message; prints
 * nothing. Every numeric value is parsed completely (trailing junk, overflow, NaN and
 * infinities are errors) and range-checked here, so the trainer can trust it. */
#include "cli/options.h"

#include <errno.h>
#include <float.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "mpitrain/dp.h"
#include "mpitrain/llama.h"
#include "mpitrain/transformer.h"

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

enum {
#define X(id, ...) OPT_##id,
  OPTIONS(X)
#undef X
      OPT_COUNT
};

typedef struct option_row {
  const char *name;
  parse_kind kind;
  struct {
    size_t offset, size;
  } at;
  double lo, hi;
  int families;
  const char *section, *arg, *help, *not_for;
} option_row;

static const option_row rows[OPT_COUNT] = {
#define X(id, name, kind, field, lo, hi, fam, sec, arg, help, why) \
  {name, kind, field, (double)(lo), (double)(hi), fam, sec, arg, help, why},
    OPTIONS(X)
#undef X
};

_Static_assert(OPT_COUNT <= MPT_CLI_MAX_OPTIONS, "mpt_cli_options.given is too small");

/* getopt_long's list: val is the row's index + 256 (above any short option). */
static struct option long_options[OPT_COUNT + 1];

static void make_long_options(void) {
  if (long_options[0].name) return;
  for (int i = 0; i < OPT_COUNT; i++) {
    const int has_arg = rows[i].kind != P_ON && rows[i].kind != P_OFF && rows[i].arg[0] != '\0';
    long_options[i] = (struct option){rows[i].name, has_arg ? required_argument : no_argument,
                                      NULL, 256 + i};
  }
}

/* The usage, from the table: a heading per section, then "  --name ARG" and the help text at
 * column 29 (on the next line when the option is longer). */
const char *mpt_cli_usage(void) {
  static char text[16384];
  if (text[0]) return text;
  size_t n = 0;
#define PUT(...) \
  n += (size_t)snprintf(text + n, n < sizeof text ? sizeof text - n : 0, __VA_ARGS__)
  PUT("usage: mpitrain train [options]      (run under mpirun -np N for DDP)\n"
      "       mpitrain tokenize --help, mpitrain generate --help,\n"
      "       mpitrain hang-report DIR [--json]   (why a job hung: docs/hangs.md)\n"
      "       mpitrain ckpt info FILE|DIR   (what a checkpoint holds: docs/checkpoints.md)\n"
      "Options marked [mlp cnn], [gpt] or [gpt llama] apply to those models only; every\n"
      "other option works with every model.\n");
  const char *section = "";
  for (int i = 0; i < OPT_COUNT; i++) {
    const option_row *r = &rows[i];
    if (!r->section[0]) continue;
    if (strcmp(r->section, section) != 0) {
      PUT("%s:\n", section = r->section);
      if (strncmp(section, "language models", 15) == 0) /* whose shape comes from where */
        PUT("  A GPT's shape: --n-layer, --n-head, --n-embd, --vocab-size (GPT only). A\n"
            "  Llama's is fixed: its preset's (llama-tiny, llama-mini) or --init-from's\n"
            "  config.json.\n");
    }
    char spec[96];
    snprintf(spec, sizeof spec, "--%s%s%s", r->name, r->arg[0] ? " " : "", r->arg);
    const char *fam = r->families == ALL ? "" : r->families == IMG ? " [mlp cnn]"
                      : r->families == MLP ? " [mlp]" : r->families == CNN ? " [cnn]"
                      : r->families == GPT ? " [gpt]" : r->families == LLAMA ? " [llama]"
                      : r->families == LM ? " [gpt llama]" : "";
    /* the model tag ends the entry's last line */
    const char *h = r->help;
    size_t len = strcspn(h, "\n");
    const char *tag = h[len] ? "" : fam;
    if (strlen(spec) <= 25)
      PUT("  %-26s %.*s%s\n", spec, (int)len, h, tag);
    else
      PUT("  %s   %.*s%s\n", spec, (int)len, h, tag);
    for (h += len; *h == '\n';) {
      h++;
      len = strcspn(h, "\n");
      PUT("%29s%.*s%s\n", "", (int)len, h, h[len] ? "" : fam);
      h += len;
    }
  }
  PUT("  --help, --version\n");
#undef PUT
  return text;
}

const char *mpt_cli_option_name(const char *arg) {
  if (strncmp(arg, "--", 2) != 0 || arg[2] == '\0') return NULL;
  const char *name = arg + 2;
  const size_t n = strcspn(name, "=");
  const char *prefix_of = NULL;
  int prefixes = 0;
  for (int i = 0; i < OPT_COUNT; i++) {
    if (strncmp(rows[i].name, name, n) != 0) continue;
    if (rows[i].name[n] == '\0') return rows[i].name; /* exact */
    prefix_of = rows[i].name;
    prefixes++;
  }
  return prefixes == 1 ? prefix_of : NULL;
}

int mpt_cli_given(const mpt_cli_options *o, const char *name) {
  for (int i = 0; i < OPT_COUNT; i++)
    if (strcmp(rows[i].name, name) == 0) return o->given[i];
  return 0;
}

int mpt_cli_is_gpt(const mpt_cli_options *o) { return strncmp(o->model, "gpt", 3) == 0; }
int mpt_cli_is_llama(const mpt_cli_options *o) { return strncmp(o->model, "llama", 5) == 0; }
int mpt_cli_is_lm(const mpt_cli_options *o) { return mpt_cli_is_gpt(o) || mpt_cli_is_llama(o); }

static int family_of(const char *model) {
  return strncmp(model, "gpt", 3) == 0     ? GPT
         : strncmp(model, "llama", 5) == 0 ? LLAMA
         : strcmp(model, "cnn") == 0       ? CNN
                                           : MLP;
}

void mpt_cli_options_default(mpt_cli_options *o) {
  memset(o, 0, sizeof *o);
  snprintf(o->command, sizeof o->command, "train");
  snprintf(o->model, sizeof o->model, "mlp");
  o->mlp = mpt_mlp_config_default();
  o->cnn = mpt_cnn_config_default();
  o->epochs = 10;
  o->batch_size = MPT_CLI_DEFAULT_BATCH;
  o->optim = mpt_optimizer_config_default();
  o->optim.kind = MPT_OPTIM_SGD;
  o->optim.lr = 0.05f;
  o->optim.momentum = 0.9f;
  o->optim.weight_decay = 5e-4f;
  o->schedule = mpt_lr_schedule_default();
  o->schedule.kind = MPT_LR_COSINE;
  o->schedule.step_size = 0; /* 0: one epoch, filled in by the trainer */
  o->seed = 1;
  o->shuffle = 1;
  o->progress = -1;
  o->ddp = mpt_ddp_config_default();
  o->accumulate = 1;
  o->timeout_s = 300;
  o->mode = MPT_MODE_SINGLE_OR_DDP;
  o->keep = 3;
  o->progress_interval_s = 30;
  o->flight_recorder = 2000;
  o->straggler_warn = 1.2;
  mpt_gpt_config_preset("gpt-mini", &o->gpt);
  mpt_llama_config_preset("llama-tiny", &o->llama);
  o->save = mpt_st_save_options_default();
}

/* ---- value parsers: 0 ok, -1 error (message written) ---- */

static int fail(char *msg, size_t n, const char *fmt, ...) MPT_PRINTF(3, 4);
static int fail(char *msg, size_t n, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, n, fmt, ap);
  va_end(ap);
  return -1;
}

static int parse_i64(const char *name, const char *s, int64_t lo, int64_t hi, int64_t *out,
                     char *msg, size_t n) {
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (end == s || *end != '\0' || errno == ERANGE)
    return fail(msg, n, "--%s: '%s' is not an integer", name, s);
  if (v < lo || v > hi)
    return fail(msg, n, "--%s: %lld is outside [%lld, %lld]", name, v, (long long)lo,
                (long long)hi);
  *out = v;
  return 0;
}

static int parse_f64(const char *name, const char *s, double lo, double hi, double *out,
                     char *msg, size_t n) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (end == s || *end != '\0' || (errno == ERANGE && fabs(v) >= 1) || !isfinite(v))
    return fail(msg, n, "--%s: '%s' is not a finite number", name, s);
  if (v < lo || v > hi) return fail(msg, n, "--%s: %g is outside [%g, %g]", name, v, lo, hi);
  *out = v == 0 ? 0 : v; /* -0 (an underflow of '-1e-400') as 0 */
  return 0;
}

/* A value the trainer keeps in float (learning rates, momentum, weight decay, dropout,
 * --grad-clip...): parse_f64's checks, then a non-zero value below float's smallest normal is
 * refused, as it would become 0 (--lr 1e-50 trained with lr 0, --grad-clip 1e-310 failed at
 * step 1, --momentum 1e-50 ran plain SGD: faults.md F45) or a subnormal (slow, few digits);
 * so is one below a double's ('1e-400', which strtod rounds to 0). */
static int parse_f32(const char *name, const char *s, double lo, double hi, double *out,
                     char *msg, size_t n) {
  double v;
  if (parse_f64(name, s, lo, hi, &v, msg, n) != 0) return -1;
  errno = 0;
  double raw = strtod(s, NULL);
  if ((v != 0 && fabs(v) < FLT_MIN) || (raw == 0 && errno == ERANGE)) /* or under a double's */
    return fail(msg, n, "--%s: %s is below the smallest normal float, %g (the value is used in "
                "single precision): give 0 or a value of at least 1.2e-38", name, s,
                (double)FLT_MIN);
  if (fabs(v) > FLT_MAX)
    return fail(msg, n, "--%s: %g is beyond the largest float, %g (the value is used in single "
                "precision)", name, v, (double)FLT_MAX);
  *out = v;
  return 0;
}

static int copy_str(const char *name, const char *s, char *dst, size_t cap, char *msg,
                    size_t n) {
  if (strlen(s) >= cap) return fail(msg, n, "--%s: value longer than %zu bytes", name, cap - 1);
  if (s[0] == '\0') return fail(msg, n, "--%s: empty value", name);
  memcpy(dst, s, strlen(s) + 1);
  return 0;
}

static int parse_hidden(const char *s, mpt_mlp_config *mlp, char *msg, size_t n) {
  int count = 0;
  const char *p = s;
  while (*p) {
    char *end;
    errno = 0;
    long long v = strtoll(p, &end, 10);
    if (end == p || errno == ERANGE || v < 1 || v > 1 << 20)
      return fail(msg, n, "--hidden: '%s' is not a list of sizes in [1, 1048576]", s);
    if (count == MPT_MLP_MAX_HIDDEN)
      return fail(msg, n, "--hidden: at most %d layers", MPT_MLP_MAX_HIDDEN);
    mlp->hidden[count++] = v;
    if (*end == ',' && end[1] != '\0')
      p = end + 1;
    else if (*end == '\0')
      p = end;
    else
      return fail(msg, n, "--hidden: '%s' is not a list of sizes in [1, 1048576]", s);
  }
  if (count == 0) return fail(msg, n, "--hidden: empty list");
  mlp->num_hidden = count;
  return 0;
}

/* The generic kinds: a value into its field, range-checked. */
static int parse_row(const option_row *r, const char *a, mpt_cli_options *o, char *msg,
                     size_t n) {
  char *field = (char *)o + r->at.offset;
  int64_t i64;
  double f64;
  switch (r->kind) {
    case P_I64:
      if (parse_i64(r->name, a, (int64_t)r->lo, (int64_t)r->hi, &i64, msg, n)) return -1;
      *(int64_t *)field = i64;
      return 0;
    case P_INT:
      if (parse_i64(r->name, a, (int64_t)r->lo, (int64_t)r->hi, &i64, msg, n)) return -1;
      *(int *)field = (int)i64;
      return 0;
    case P_F64:
      if (parse_f64(r->name, a, r->lo, r->hi, &f64, msg, n)) return -1;
      *(double *)field = f64;
      return 0;
    case P_F32:
      if (parse_f32(r->name, a, r->lo, r->hi, &f64, msg, n)) return -1;
      *(float *)field = (float)f64;
      return 0;
    case P_F32D:
      if (parse_f32(r->name, a, r->lo, r->hi, &f64, msg, n)) return -1;
      *(double *)field = f64;
      return 0;
    case P_STR:
      return copy_str(r->name, a, field, r->at.size, msg, n);
    case P_ON:
      *(int *)field = 1;
      return 0;
    case P_OFF:
      *(int *)field = 0;
      return 0;
    case P_FN:
      break;
  }
  return fail(msg, n, "--%s: no parser", r->name);
}

/* The options whose value is more than a number or a string. */
static int parse_special(int id, const char *a, mpt_cli_options *o, int64_t *gpt_size,
                         char *msg, size_t n) {
  const char *name = rows[id].name;
  int64_t i64;
  double f64;
  switch (id) {
    case OPT_MODEL:
      if (strcmp(a, "mlp") != 0 && strcmp(a, "cnn") != 0 && strcmp(a, "gpt") != 0 &&
          strcmp(a, "gpt-mini") != 0 && strcmp(a, "gpt2") != 0 &&
          strcmp(a, "gpt2-medium") != 0 && strcmp(a, "gpt2-large") != 0 &&
          strcmp(a, "llama-tiny") != 0 && strcmp(a, "llama-mini") != 0 && strcmp(a, "llama") != 0)
        return fail(msg, n, "--model: unknown model '%s' (expected mlp, cnn, gpt, gpt-mini, "
                    "gpt2, gpt2-medium, gpt2-large, llama-tiny, llama-mini or llama)", a);
      snprintf(o->model, sizeof o->model, "%s", a);
      return 0;
    case OPT_HIDDEN:
      return parse_hidden(a, &o->mlp, msg, n);
    case OPT_DROPOUT:
      if (parse_f32(name, a, 0, 0.99, &f64, msg, n)) return -1;
      o->mlp.dropout = o->cnn.dropout = (float)f64;
      return 0;
    case OPT_N_LAYER: case OPT_N_HEAD: case OPT_N_EMBD: case OPT_SEQ_LEN: case OPT_VOCAB_SIZE:
      if (parse_i64(name, a, (int64_t)rows[id].lo, (int64_t)rows[id].hi, &i64, msg, n))
        return -1;
      gpt_size[id - OPT_N_LAYER] = i64;
      return 0;
    case OPT_OPTIMIZER:
      if (mpt_optimizer_kind_parse(a, &o->optim.kind) != MPT_OK)
        return fail(msg, n, "--optimizer: unknown optimizer '%s' (expected sgd or adamw)", a);
      return 0;
    case OPT_SCHEDULE:
      if (mpt_lr_kind_parse(a, &o->schedule.kind) != MPT_OK)
        return fail(msg, n, "--schedule: unknown schedule '%s' (constant, step or cosine)", a);
      return 0;
    case OPT_BATCH: case OPT_ACCUMULATE: /* auto: 0, resolved by mpt_trainer_plan_resume */
      if (strcmp(a, "auto") == 0)
        i64 = 0;
      else if (parse_i64(name, a, (int64_t)rows[id].lo, (int64_t)rows[id].hi, &i64, msg, n))
        return -1;
      if (id == OPT_BATCH) o->batch_size = i64;
      else o->accumulate = (int)i64;
      return 0;
    case OPT_SEED:
      if (parse_i64(name, a, 0, INT64_MAX, &i64, msg, n)) return -1;
      o->seed = (uint64_t)i64;
      return 0;
    case OPT_BUFFERS:
      if (mpt_ddp_buffer_mode_parse(a, &o->ddp.buffers) != MPT_OK)
        return fail(msg, n, "--buffers: '%s' is not broadcast, average or none", a);
      return 0;
    case OPT_GRAD_COMM:
      if (mpt_ddp_grad_comm_parse(a, &o->ddp.grad_comm) != MPT_OK)
        return fail(msg, n, "--grad-comm: '%s' is not fp32 or bf16", a);
      return 0;
    case OPT_ZERO:
      if (strcmp(a, "0") != 0 && strcmp(a, "1") != 0 && strcmp(a, "2") != 0 &&
          strcmp(a, "3") != 0)
        return fail(msg, n, "--zero: '%s' is not a supported ZeRO stage (0: off, 1: sharded "
                    "optimizer state, 2: and sharded gradients, 3: and sharded parameters)", a);
      o->ddp.zero = a[0] - '0';
      return 0;
    case OPT_ALLREDUCE_ALGO:
      if (mpt_ddp_allreduce_algo_parse(a, &o->ddp.allreduce) != MPT_OK)
        return fail(msg, n, "--allreduce-algo: '%s' is not native or rs-ag", a);
      return 0;
    case OPT_MODE:
      if (strcmp(a, "ddp") == 0 || strcmp(a, "single") == 0)
        o->mode = MPT_MODE_SINGLE_OR_DDP;
      else if (strcmp(a, "dp") == 0)
        o->mode = MPT_MODE_DP;
      else
        return fail(msg, n, "--mode: '%s' is not single, ddp or dp", a);
      return 0;
    case OPT_DEVICES:
      if (copy_str(name, a, o->devices, sizeof o->devices, msg, n)) return -1;
      /* A CPU list is checked here (a usage error, status 2); one naming CUDA devices needs
       * the devices present, so the trainer checks it at start. */
      if (!strstr(a, "cuda")) {
        mpt_device devs[MPT_DP_MAX_DEVICES];
        int nd = 0;
        if (mpt_dp_parse_devices(a, devs, MPT_DP_MAX_DEVICES, &nd) != MPT_OK)
          return fail(msg, n, "--devices: %s", mpt_last_error());
      }
      return 0;
    case OPT_CKPT_EVERY:
      if (strcmp(a, "epoch") == 0) {
        o->checkpoint_every = 0;
        return 0;
      }
      if (parse_i64(name, a, 1, BIG, &i64, msg, n)) return -1;
      o->checkpoint_every = i64;
      return 0;
    case OPT_CKPT_ASYNC:
      if (strcmp(a, "on") == 0 || strcmp(a, "off") == 0) {
        o->checkpoint_async = strcmp(a, "on") == 0;
        return 0;
      }
      return fail(msg, n, "--checkpoint-async: '%s' is not on or off", a);
    case OPT_PROGRESS:
      o->progress = 1;
      return 0;
    case OPT_NO_PROGRESS:
      o->progress = 0;
      return 0;
    case OPT_DEVICE:
      if (strcmp(a, "cpu") != 0 && strcmp(a, "cuda") != 0)
        return fail(msg, n, "--device: unknown device '%s' (expected cpu or cuda)", a);
      snprintf(o->device, sizeof o->device, "%s", a);
      return 0;
    case OPT_CONV_ALGO:
      if (strcmp(a, "auto") == 0) o->conv_algo = MPT_CONV_ALGO_AUTO;
      else if (strcmp(a, "im2col") == 0) o->conv_algo = MPT_CONV_ALGO_IM2COL;
      else if (strcmp(a, "onednn") == 0) o->conv_algo = MPT_CONV_ALGO_LIBRARY;
      else return fail(msg, n, "--conv-algo: unknown algorithm '%s' (auto, im2col or onednn)", a);
      return 0;
    case OPT_GEMM:
      if (strcmp(a, "auto") == 0) o->gemm = MPT_CPU_GEMM_AUTO;
      else if (strcmp(a, "openblas") == 0) o->gemm = MPT_CPU_GEMM_OPENBLAS;
      else if (strcmp(a, "onednn") == 0) o->gemm = MPT_CPU_GEMM_ONEDNN;
      else if (strcmp(a, "tune") == 0) o->gemm = MPT_CPU_GEMM_TUNE;
      else return fail(msg, n, "--gemm: unknown library '%s' (auto, openblas, onednn or tune)", a);
      return 0;
    case OPT_PRECISION:
      if (mpt_precision_parse(a, &o->precision) != MPT_OK)
        return fail(msg, n, "--precision: '%s' is not fp32 or bf16", a);
      return 0;
    case OPT_SAVE_DTYPE:
      if (strcmp(a, "fp32") != 0 && strcmp(a, "bf16") != 0)
        return fail(msg, n, "--save-dtype: '%s' is not fp32 or bf16", a);
      o->save.dtype = strcmp(a, "bf16") == 0 ? MPT_ST_BF16 : MPT_ST_F32;
      snprintf(o->save_given, sizeof o->save_given, "%s", name);
      return 0;
    case OPT_SAVE_SHARD_SIZE:
      if (mpt_st_parse_size(a, &o->save.shard_nbytes) != MPT_OK)
        return fail(msg, n, "--save-shard-size: %s", mpt_last_error());
      snprintf(o->save_given, sizeof o->save_given, "%s", name);
      return 0;
    default:
      return fail(msg, n, "--%s: no parser", name);
  }
}

/* The GPT sizes: the preset of --model, then the sizes given (gpt2 and gpt-mini are fixed
 * presets: sizes there are a usage error), then checks that the model can be built. */
static int finish_gpt(mpt_cli_options *o, const int64_t size[5], char *msg, size_t n) {
  int any = 0;
  for (int k = 0; k < 5; k++) any |= size[k] != 0;
  if (strcmp(o->model, "gpt") != 0 && any)
    return fail(msg, n, "--model %s is a preset: --n-layer, --n-head, --n-embd, --seq-len and "
                "--vocab-size need --model gpt", o->model);
  if (mpt_gpt_config_preset(strcmp(o->model, "gpt") == 0 ? "gpt-mini" : o->model, &o->gpt) !=
      MPT_OK)
    return fail(msg, n, "--model %s: no preset", o->model);
  if (size[0]) o->gpt.num_layers = (int)size[0];
  if (size[1]) o->gpt.num_heads = (int)size[1];
  if (size[2]) o->gpt.channels = (int)size[2];
  if (size[3]) o->gpt.max_seq_len = (int)size[3];
  if (size[4]) o->gpt.vocab_size = (int)size[4];
  if (o->gpt.channels % o->gpt.num_heads != 0)
    return fail(msg, n, "--n-embd %d is not a multiple of --n-head %d", o->gpt.channels,
                o->gpt.num_heads);
  o->gpt.padded_vocab_size = (int)mpt_gpt_padded_vocab(o->gpt.vocab_size);
  return 0;
}

/* A Llama's sizes: its preset's, or (--model llama) those of --init-from's config.json, read
 * when the run starts; --seq-len, the training window. */
static int finish_llama(mpt_cli_options *o, const int64_t size[5], char *msg, size_t n) {
  o->llama_seq_len = (int)size[3];
  if (strcmp(o->model, "llama") == 0) {
    if (!o->init_from[0])
      return fail(msg, n, "--model llama takes its shape from a Hugging Face model's "
                  "config.json: give --init-from DIR|X.safetensors (or a preset: llama-tiny, "
                  "llama-mini)");
    return 0;
  }
  if (mpt_llama_config_preset(o->model, &o->llama) != MPT_OK)
    return fail(msg, n, "--model %s: no preset", o->model);
  if (o->llama_seq_len > o->llama.max_seq_len)
    return fail(msg, n, "--seq-len %d is longer than --model %s's T %d", o->llama_seq_len,
                o->model, o->llama.max_seq_len);
  return 0;
}

/* What the language models share: their data, and their defaults. */
static int finish_lm(mpt_cli_options *o, char *msg, size_t n) {
  if (o->shards[0] == '\0')
    return fail(msg, n, "--model %s needs --shards GLOB (token shards: `mpitrain tokenize`)",
                o->model);
  /* the GPT's defaults, where the user said nothing (llm.c's and nanoGPT's choices); the
   * Llama takes them too */
  if (!o->given[OPT_OPTIMIZER]) o->optim.kind = MPT_OPTIM_ADAMW;
  if (!o->given[OPT_LR]) /* GPT-3's table for these sizes (Brown et al., 2020) */
    o->optim.lr = strcmp(o->model, "gpt2") == 0          ? 6e-4f
                  : strcmp(o->model, "gpt2-medium") == 0 ? 3e-4f
                  : strcmp(o->model, "gpt2-large") == 0  ? 2.5e-4f
                                                         : 1e-3f;
  if (!o->given[OPT_WD]) o->optim.weight_decay = 0.1f;
  if (!o->given[OPT_BATCH]) o->batch_size = MPT_CLI_DEFAULT_GPT_BATCH;
  if (!o->given[OPT_EPOCHS]) o->epochs = 1;
  if (!o->given[OPT_ADAM_BETA2]) o->optim.beta2 = 0.95f;
  if (!o->given[OPT_GRAD_CLIP]) o->grad_clip = 1.0;
  if (!o->given[OPT_VAL_STEPS]) o->val_steps = 20;
  if (!o->given[OPT_LOG_EVERY]) o->log_every = 10;
  o->no_decay_bias_norm = 1;
  return 0;
}

/* Checks across options, once all are read. */
static int finish(mpt_cli_options *o, const int64_t *gpt_size, char *msg, size_t n) {
  const int family = family_of(o->model);
  for (int i = 0; i < OPT_COUNT; i++) /* the first option given that the model does not take */
    if (o->given[i] && !(rows[i].families & family))
      return fail(msg, n, "--%s does not apply to --model %s: %s", rows[i].name, o->model,
                  rows[i].not_for);
  if (o->optim.nesterov && (o->optim.momentum <= 0 || o->optim.dampening != 0))
    return fail(msg, n, "--nesterov needs --momentum > 0");
  if (o->mode == MPT_MODE_DP && o->ddp.zero)
    return fail(msg, n, "--zero %d does not work with --mode dp (DataParallel steps the whole "
                "model in each rank): use --mode ddp", o->ddp.zero);
  if (o->mode == MPT_MODE_DP && o->devices[0] == '\0')
    return fail(msg, n, "--mode dp needs --devices (e.g. cpu:2)");
  if (strcmp(o->resume, "auto") == 0 && o->checkpoint_dir[0] == '\0')
    return fail(msg, n, "--resume auto needs --checkpoint-dir (the directory to resume from)");
  if (o->save_given[0] && !o->save_model[0])
    return fail(msg, n, "--%s needs --save-model (a safetensors file or folder)",
                o->save_given);
  if (family & LM) {
    if (family == GPT ? finish_gpt(o, gpt_size, msg, n) != 0 : finish_llama(o, gpt_size, msg, n) != 0)
      return -1;
    if (finish_lm(o, msg, n) != 0) return -1;
    if (o->val_every > 0 && o->val_shards[0] == '\0')
      return fail(msg, n, "--val-every needs --val-shards GLOB (the validation token shards)");
  }
  o->ddp.timeout_ms = o->timeout_s * 1e3;
  return 0;
}

int mpt_cli_parse(int argc, char **argv, mpt_cli_options *o, char *msg, size_t n) {
  mpt_cli_options_default(o);
  make_long_options();
  msg[0] = '\0';
  o->argc = argc;
  o->argv = argv;
  if (argc < 2) { /* a bare `mpitrain` prints the usage rather than start a 10-epoch run */
    fail(msg, n, "no command given (expected: train, tokenize, generate, hang-report or "
         "ckpt)");
    return MPT_CLI_EXIT_USAGE;
  }
  int first = 1;
  if (argv[1][0] != '-') {
    if (strcmp(argv[1], "train") != 0) {
      fail(msg, n, "unknown command '%s' (expected: train, tokenize, generate, "
           "hang-report or ckpt)", argv[1]);
      return MPT_CLI_EXIT_USAGE;
    }
    first = 2;
  }
  /* getopt_long over argv[first-1..] so that argv[first] is the first option. */
  int sub_argc = argc - first + 1;
  char **sub_argv = argv + first - 1;
  optind = 0; /* glibc: full re-initialisation, so the parser can run more than once */
  opterr = 0;
  int64_t gpt_size[5] = {0, 0, 0, 0, 0}; /* layers, heads, channels, seq len, vocab */
  for (;;) {
    int longindex = -1;
    const int c = getopt_long(sub_argc, sub_argv, ":", long_options, &longindex);
    if (c == -1) break;
    if (c == ':') {
      fail(msg, n, "option '%s' needs a value", sub_argv[optind - 1]);
      return MPT_CLI_EXIT_USAGE;
    }
    if (c < 256 || c >= 256 + OPT_COUNT) {
      if (optopt > 0 && optopt < 256)
        fail(msg, n, "unknown option '-%c'", optopt);
      else
        fail(msg, n, "unknown option '%s'", sub_argv[optind - 1]);
      return MPT_CLI_EXIT_USAGE;
    }
    const int id = c - 256;
    o->given[id] = 1;
    if (id == OPT_HELP) {
      snprintf(msg, n, "%s", mpt_cli_usage());
      return MPT_CLI_EXIT_OK;
    }
    if (id == OPT_VERSION) {
      snprintf(msg, n, "mpitrain %s", PACKAGE_VERSION);
      snprintf(o->command, sizeof o->command, "version"); /* main.c adds the build's features */
      return MPT_CLI_EXIT_OK;
    }
    const int r = rows[id].kind == P_FN ? parse_special(id, optarg, o, gpt_size, msg, n)
                                        : parse_row(&rows[id], optarg, o, msg, n);
    if (r) return MPT_CLI_EXIT_USAGE;
  }
  if (optind < sub_argc) {
    const char *extra = sub_argv[optind];
    const size_t len = strlen(extra);
    if (len > 4 && strcmp(extra + len - 4, ".bin") == 0) /* the shell expanded a shard glob */
      fail(msg, n, "unexpected argument '%s': an unquoted --shards or --val-shards glob that the "
           "shell expanded? Quote it, as in --shards 'DIR/train_*.bin'", extra);
    else
      fail(msg, n, "unexpected argument '%s'", extra);
    return MPT_CLI_EXIT_USAGE;
  }
  if (finish(o, gpt_size, msg, n) != 0) return MPT_CLI_EXIT_USAGE;
  o->argc = argc;
  o->argv = argv;
  return MPT_CLI_RUN;
}
