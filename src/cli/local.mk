# src/cli: the mpitrain program
bin_PROGRAMS += mpitrain
mpitrain_SOURCES = src/cli/main.c src/cli/options.c src/cli/options.h src/cli/train.c \
	src/cli/train.h src/cli/train_impl.h src/cli/train_checks.c src/cli/train_ckpt.c src/cli/metrics.c src/cli/metrics.h \
	src/cli/fault.c src/cli/fault.h
mpitrain_LDADD = libmpitrain_all.la
