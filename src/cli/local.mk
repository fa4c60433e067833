# src/cli: see the layer's public header include/mpitrain/cli.h
