# src/optim: see the layer's public header include/mpitrain/optim.h
