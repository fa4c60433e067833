# src/train: the training loop as a library (include/mpitrain/trainer.h): one loop for every
# model family (image classifiers, language models, a user's), and the built-in tasks.
mpitraininclude_HEADERS += include/mpitrain/trainer.h
libmpitrain_all_la_SOURCES += src/train/train_impl.h src/train/trainer.c src/train/step.c \
	src/train/signals.c src/train/eval.c src/train/ckpt.c src/train/resume.c src/train/checks.c \
	src/train/report.c src/train/task_images.c src/train/task_tokens.c \
	src/train/straggler.c src/train/gemm_tune.c
