"""The model layer: the `.tflite` flatbuffer and the graph IR every later stage works on.

The bottom of the data flow (model -> graph IR -> rewrite -> ... -> package): these modules import
nothing of the project's outside this subpackage, and of LiteRT only its flatbuffer schema.

- `schema`: operator codes, tensor types and option tables of the TFLite schema.
- `ir`: the mutable graph IR (`Model`, `Subgraph`, `Operator`, `Tensor`).
- `reader` / `writer`: flatbuffer bytes <-> IR, validating on the way in, atomic on the way out.
- `builder`: `ModelBuilder`, for tests and for the rewritten model's new operators.
- `stats`, `fingerprint`: per-operator FLOPs and bytes, and the canonical form behind every
  identity: a block's kernel (shared and cached by it), the planner's block signature and the
  model fingerprint a kernel bundle is matched against.
- `atomic`, `errors`: the write-then-rename helpers and the one error type for bad input.
"""
