"""The numerics contract (docs/design.md §2), below every consumer.

`constants` holds the contract's constants and option types; `scalar_ir` its scalar
rules (quantize, round, residuals, the causal mask) as f32 IR, `elementary` its
divisions and exp2 (re-exported by `scalar_ir`). Dialects, passes,
kernels, references and the simulator import from here; this package imports
nothing of int8attn but `support`.
"""
