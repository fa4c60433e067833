# src/cli: the mpitrain program: options (one table, options.c) -> the training loop's
# configuration (include/mpitrain/trainer.h), the model families' data and models (train.c), and
# the commands tokenize and generate. The public API only (the shared library's exported
# symbols); the libraries themselves for --version's versions.
bin_PROGRAMS += mpitrain
mpitrain_SOURCES = src/cli/main.c src/cli/options.c src/cli/options.h src/cli/option_table.h \
	src/cli/train.c \
	src/cli/train.h src/cli/checks.c src/cli/checks.h src/cli/version.c src/cli/version.h \
	src/cli/tokenize.c src/cli/tokenize.h src/cli/generate.c src/cli/generate.h \
	src/cli/hang_report.c src/cli/hang_report.h src/cli/ckpt_info.c src/cli/ckpt_info.h
mpitrain_LDADD = libmpitrain.la $(libmpitrain_all_la_LIBADD)
