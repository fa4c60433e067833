# src/ddp: the DDP engine (include/mpitrain/ddp.h)
mpitraininclude_HEADERS += include/mpitrain/ddp.h
libmpitrain_all_la_SOURCES += src/ddp/ddp.c src/ddp/ddp_stats.h src/ddp/ddp_stats.c
