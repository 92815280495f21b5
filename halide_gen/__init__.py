"""halide_gen: one Halide pipeline per fused block — lowering, schedules, AOT compilation.

Knows planned blocks and Halide, nothing about flatbuffers. (Built by the code-generation issue.)
"""
