# src/ddp: the DDP engine (include/mpitrain/ddp.h)
mpitraininclude_HEADERS += include/mpitrain/ddp.h
libmpitrain_all_la_SOURCES += src/ddp/ddp.c src/ddp/ddp_stats.h src/ddp/ddp_stats.c \
	src/ddp/grad_comm.h src/ddp/grad_comm.c \
	src/ddp/ddp_impl.h src/ddp/zero.c src/ddp/rsag.c \
	src/ddp/reducer.h src/ddp/reducer.c
