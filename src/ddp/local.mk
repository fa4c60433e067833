# src/ddp: see the layer's public header include/mpitrain/ddp.h
