"""`int8attn run MODEL.onnx` without `--inputs`: random inputs, and onnxruntime as the check.

An imported model's function has no single attention of its arguments, so
the inputs are drawn by type: f32 Gaussian, int8 uniform in [-127, 127], and
the f32 arguments that a raised attention reads as cache scales (the graph
stage records them) uniform in [1, 3] / 127, the absmax/127 of a Gaussian
row. The result is compared, output by output, with onnxruntime's f32 run of
the same model on the same inputs (the `onnx` extra).
"""

from __future__ import annotations

import numpy as np

from .graph import FunctionInfo, error_stats


def random_model_inputs(info: FunctionInfo, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    arrays = []
    for index, spec in enumerate(info.arguments):
        if None in spec.shape:
            raise ValueError(f"input '{info.argument_name(index)}' of @{info.name} has a dynamic "
                             f"shape ({spec.describe()}); pass --inputs")
        if spec.element == "i8":
            arrays.append(rng.integers(-127, 128, spec.shape, dtype=np.int8))
        elif spec.element == "f32" and index in info.scale_arguments:
            arrays.append(np.asarray(rng.uniform(1, 3, spec.shape) / 127, np.float32))
        elif spec.element == "f32":
            arrays.append(np.asarray(rng.standard_normal(spec.shape), np.float32))
        else:
            raise ValueError(f"input '{info.argument_name(index)}' of @{info.name} is "
                             f"{spec.describe()}, which random inputs do not cover (f32 and "
                             f"int8 only); pass --inputs")
    return arrays


def onnxruntime_outputs(model: bytes, info: FunctionInfo, arrays) -> list[np.ndarray] | None:
    """The model's outputs on onnxruntime (CPU), or None without onnxruntime."""
    try:
        import onnxruntime
    except ImportError:
        return None
    session = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"])
    feeds = {info.argument_name(i): a for i, a in enumerate(arrays)}
    return session.run(list(info.result_names), feeds)


def comparison_lines(info: FunctionInfo, outputs, expected) -> list[str]:
    lines = [f"{'output':24} {'max abs':>10} {'rms':>10} {'max |onnxruntime|':>18}"]
    for index, (actual, reference) in enumerate(zip(outputs, expected)):
        stats = error_stats(actual, reference)
        lines.append(f"{info.result_name(index):24} {stats['max_abs']:10.3e} {stats['rms']:10.3e} "
                     f"{np.abs(reference.astype(np.float64)).max():18.3e}")
    return lines
