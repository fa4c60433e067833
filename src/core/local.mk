# src/core: status, logging, devices, streams and events, tensors, RNG, ops (include/mpitrain/core.h, ops.h)
mpitraininclude_HEADERS += include/mpitrain/core.h include/mpitrain/ops.h
libmpitrain_all_la_SOURCES += \
	src/core/error.h src/core/backend.h \
	src/core/status.c src/core/log.c src/core/rng.c src/core/device.c src/core/tensor.c \
	src/core/ops.c \
	src/core/cpu/cpu.h src/core/cpu/cpu_backend.c src/core/cpu/stream_cpu.c \
	src/core/cpu/ops_cpu.c
