# src/nn: see the layer's public header include/mpitrain/nn.h
