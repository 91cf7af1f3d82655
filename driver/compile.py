"""`compile(source, options, until=STAGE)`: the one driver.

The CLI, the Python API, the bench and the simulator all compile through
here: the target's row of the stage table (`driver.targets`) gives the chain,
each stage's artifact is kept, and `save_stages` writes every artifact as it
is made (`00-graph.mlir`, `01-algorithm.mlir`, ...), so a stage that fails can
be reproduced from the saved input of that stage.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .graph import FunctionInfo
from .options import CompileOptions
from .stages import Compilation
from .targets import TARGETS
from ..support.files import write_atomic
from ..support.ir import new_context
from ..support.remarks import collect


@dataclass(frozen=True)
class Compiled:
    """What a compile produced: every stage's artifact, in chain order."""

    options: CompileOptions
    artifacts: dict[str, str | bytes]
    functions: dict[str, FunctionInfo]
    timings: dict[str, float]
    kernel_layouts: dict[str, dict]   # per public function of a kernel target: its kernels
    remarks: tuple[str, ...] = ()   # the passes' remarks (raise-int8-attention's), located
    companions: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)
                                    # per stage: files written beside its artifact

    @property
    def last(self) -> str | bytes:
        return list(self.artifacts.values())[-1]


def compile(source: str | bytes, options: CompileOptions, *, filename: str = "<string>",
            until: str | None = None, save_stages: str | Path | None = None,
            print_ir_after_all: bool = False,
            progress: Callable[[str], None] | None = None) -> Compiled:
    """Run the target's chain up to `until` (default: the target's main artifact).

    `source` is MLIR text, or the bytes of an ONNX model (imported in the graph stage)."""
    target = TARGETS[options.target]
    options = target.check(options)
    chain = target.chain(until, options.kernel_object is not None)
    directory = Path(save_stages) if save_stages is not None else None
    if directory is not None:
        directory.mkdir(parents=True, exist_ok=True)
    with new_context() as context:
        remarks = collect(context)
        c = Compilation(source, filename, options, target,
                        print_ir_after_all=print_ir_after_all)
        for number, stage in enumerate(chain):
            if progress is not None:
                progress(f"{stage.name}: {stage.summary}")
            start = time.perf_counter()
            try:
                artifact = stage.make(c)
            except Exception as error:
                # What the passes reported, e.g. why an attention was left to IREE.
                error.remarks = tuple(remarks)
                raise
            c.timings[stage.name] = time.perf_counter() - start
            c.artifacts[stage.name] = artifact
            if directory is not None:
                write_atomic(directory / f"{number:02d}-{stage.name}{stage.suffix}", artifact)
                for suffix, content in c.companions.get(stage.name, {}).items():
                    write_atomic(directory / f"{number:02d}-{stage.name}{suffix}", content)
    return Compiled(options, dict(c.artifacts), dict(c.functions), dict(c.timings),
                    dict(c.kernel_layouts), tuple(remarks), dict(c.companions))
