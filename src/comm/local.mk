# src/comm: see the layer's public header include/mpitrain/comm.h
