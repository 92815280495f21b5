"""fusion: DNNFusion's analysis on the graph IR — mapping types, the ECG, rewriting, planning.

Knows graphs and mapping types, nothing about Halide. (Built by the fusion-analysis issue.)
"""
