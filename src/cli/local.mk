# src/cli: the mpitrain program
bin_PROGRAMS += mpitrain
mpitrain_SOURCES = src/cli/main.c src/cli/options.c src/cli/options.h src/cli/train.c \
	src/cli/train.h src/cli/train_impl.h src/cli/train_checks.c src/cli/train_ckpt.c src/cli/metrics.c src/cli/metrics.h \
	src/cli/fault.c src/cli/fault.h \
	src/cli/version.c src/cli/version.h src/cli/log_setup.c src/cli/train_auto.c
# The public API only (the shared library's exported symbols); the libraries themselves for
# --version's versions.
mpitrain_LDADD = libmpitrain.la $(libmpitrain_all_la_LIBADD)
# issue 15: the ranks' data agreement check
mpitrain_SOURCES += src/cli/train_data.c src/cli/train_watchdog.c
# which thread takes SIGTERM and SIGUSR1 (a thread that only waits for them)
mpitrain_SOURCES += src/cli/preempt.c src/cli/preempt.h
mpitrain_SOURCES += src/cli/train_precision.c
# issue 13: mpitrain tokenize (text to llm.c token shards)
mpitrain_SOURCES += src/cli/tokenize.c src/cli/tokenize.h
# issue 13: mpitrain train --model gpt|gpt-mini|gpt2
mpitrain_SOURCES += src/cli/train_gpt.c src/cli/train_gpt_checks.c src/cli/train_profile.c src/cli/generate.c \
	src/cli/generate.h
# the ranks read the same token shards
mpitrain_SOURCES += src/cli/train_gpt_data.c
# issue 14: ZeRO-1 and the memory report in the trainers
mpitrain_SOURCES += src/cli/train_zero.c src/cli/train_zero.h
