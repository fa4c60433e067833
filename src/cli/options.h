/* The mpitrain command line: a pure parser (no I/O besides the returned message) from argv to
 * an options struct, so it can be tested and fuzzed. The program (main.c) prints and exits.
 *
 * Every option is one row of one table (options.c): its name, value, parser and range, the
 * model families that take it and its help. The table makes getopt's list, the usage text (so
 * the manual page, scripts/make_man.sh) and the refusal of an option a model does not take,
 * with the reason. Options of the loop (trainer.h) work for every model. */
#ifndef MPT_CLI_OPTIONS_H
#define MPT_CLI_OPTIONS_H

#include <stdint.h>

#include "mpitrain/ddp.h"
#include "mpitrain/gpt_file.h"
#include "mpitrain/llama.h"
#include "mpitrain/nn.h"
#include "mpitrain/optim.h"
#include "mpitrain/safetensors.h"

typedef enum { MPT_MODE_SINGLE_OR_DDP = 0, MPT_MODE_DP = 1 } mpt_cli_mode;

/* Room for the table's rows in mpt_cli_options.given. */
#define MPT_CLI_MAX_OPTIONS 128
/* --batch-size when none is given (and on a new run with auto): the images', a GPT's */
#define MPT_CLI_DEFAULT_BATCH 64
#define MPT_CLI_DEFAULT_GPT_BATCH 8

typedef struct mpt_cli_options {
  char command[16]; /* "train" */
  char model[16];   /* "mlp" | "cnn" | "gpt" | "gpt-mini" | "gpt2" | "gpt2-medium" | "gpt2-large"
                       | "llama-tiny" | "llama-mini" */
  mpt_mlp_config mlp;
  mpt_cnn_config cnn;
  int64_t epochs;
  int64_t batch_size;     /* per rank: images, or a GPT window's sequences */
  int64_t max_steps;      /* per epoch; 0 = whole epoch */
  int64_t train_limit;    /* first N training samples; 0 = all */
  int64_t test_limit;     /* first N evaluation samples; 0 = all */
  mpt_optimizer_config optim;
  int no_decay_bias_norm; /* weight decay on >= 2-D weights only (mpt_param_groups_split_decay) */
  mpt_lr_schedule schedule;
  uint64_t seed;
  char data_dir[4096];    /* "" = Debian's package folder */
  int synthetic;          /* train on synthetic data (benchmarks) */
  int threads;            /* CPU threads per rank; 0 = the host's cores / its ranks */
  char metrics_json[4096];
  char save_params[4096]; /* write the final flat parameters (raw float32) here */
  char trace[4096];       /* Chrome trace */
  char device[32];        /* "cpu" | "cuda" | "" (auto) */
  mpt_conv_algo conv_algo; /* --conv-algo (default AUTO) */
  mpt_cpu_gemm gemm;       /* --gemm (default AUTO, = 0) */
  mpt_precision precision; /* --precision: GEMMs and convolutions (default fp32, = 0) */
  int shuffle;
  int drop_last;
  int progress;           /* -1 auto (stderr is a terminal), 0 off, 1 on */
  mpt_ddp_config ddp;
  int accumulate;         /* micro-batches per step (K) */
  double timeout_s;
  int check_collectives;
  mpt_cli_mode mode;
  char devices[256];      /* DP device list, "cpu:2" */
  char checkpoint_dir[4096];
  int64_t checkpoint_every; /* steps; 0 = at the end of every epoch (when a dir is given) */
  int keep;                 /* checkpoints kept in the dir */
  int checkpoint_async;     /* --checkpoint-async on: written on a background thread */
  char resume[4096];        /* FILE or DIR ("" = fresh start) */
  int64_t stop_at_step;     /* stop after this global step (0 = never) */
  int skip_nonfinite;       /* skip optimizer steps whose averaged gradients are not finite */
  int64_t check_replicas;   /* every N steps compare a checksum of the parameters (0 = off) */
  char gemm_cache[4096];    /* --gemm-cache: --gemm tune's cache file ("" = default) */
  char log_file[4096];      /* --log-file: each rank writes its output to <this>.<rank> */
  int quiet;                /* --quiet: warnings and errors only */
  double progress_interval_s; /* one-line progress on rank 0 when stderr is not a terminal */
  int64_t flight_recorder;  /* --flight-recorder: collectives kept per rank (0 = off) */
  char debug_dir[4000];     /* --debug-dir: the flight recorder's dumps ("" = the default) */
  double straggler_warn;    /* --straggler-warn: slowest / fastest compute ratio to warn at */
  /* GPT language models */
  mpt_gpt_config gpt;       /* the preset's sizes, then --n-layer .. --vocab-size */
  mpt_llama_config llama;   /* --model llama-*: the preset's sizes */
  char shards[4096];        /* --shards GLOB: training token shards */
  char val_shards[4096];    /* --val-shards GLOB ("" = no validation) */
  char init_from[4096];     /* --init-from FILE: an llm.c model file to start from */
  char save_model[4096];    /* --save-model FILE: the final model as an llm.c model file */
  mpt_st_save_options save; /* --save-dtype, --save-shard-size (safetensors --save-model) */
  int llama_seq_len;        /* --seq-len of a Llama: the training window (0: its max_seq_len) */
  char save_given[24];      /* "save-dtype" or "save-shard-size" when given, else "" */
  double grad_clip;         /* max global gradient L2 norm; 0 = off (GPT default 1.0) */
  int64_t val_every;        /* evaluation every N steps (0 = at the end of each epoch) */
  int64_t val_steps;        /* at most this many evaluation batches per rank (0 = all) */
  int64_t log_every;        /* a loss / throughput line every N steps (0 = none) */
  int recompute;            /* --recompute: checkpoint each transformer block */
  int profile;              /* --profile: per-op times at the end (mpt_tape_set_profiling) */
  unsigned char given[MPT_CLI_MAX_OPTIONS]; /* which rows of the table were on the line */
  int argc;                 /* the command line as given (compared across ranks) */
  char **argv;
} mpt_cli_options;

enum { MPT_CLI_RUN = 0, MPT_CLI_EXIT_OK = 1, MPT_CLI_EXIT_USAGE = 2 };

/* 1 for --model gpt, gpt-mini or gpt2*. */
int mpt_cli_is_gpt(const mpt_cli_options *opts);
/* 1 for --model llama-tiny or llama-mini. */
int mpt_cli_is_llama(const mpt_cli_options *opts);
/* 1 for a language model (a GPT or a Llama): token shards, the tokens task. */
int mpt_cli_is_lm(const mpt_cli_options *opts);
/* Fills defaults (those of --model mlp; the GPT's are applied by mpt_cli_parse). */
void mpt_cli_options_default(mpt_cli_options *opts);
/* Parses argv (argv[0] is the program, argv[1] the command). Returns MPT_CLI_RUN, or
 * MPT_CLI_EXIT_OK for --help / --version (the text to print is in msg), or MPT_CLI_EXIT_USAGE
 * with a one-line error in msg. Reentrant across calls (resets getopt). */
int mpt_cli_parse(int argc, char **argv, mpt_cli_options *opts, char *msg, size_t msg_nbytes);
/* The long option an argument names, as getopt_long resolves it ("--dev=cpu:2" and "--devices"
 * both give "devices": an exact name, else a unique prefix), or NULL (not an option). */
const char *mpt_cli_option_name(const char *arg);
/* 1 when the option `name` (without dashes) was given on the parsed command line. */
int mpt_cli_given(const mpt_cli_options *opts, const char *name);
/* The usage text, generated from the table. */
const char *mpt_cli_usage(void);

#endif
