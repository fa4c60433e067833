# src/data: see the layer's public header include/mpitrain/data.h
