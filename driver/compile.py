"""`compile(source, options, until=STAGE)`: the one driver.

The CLI, the Python API, the bench and the simulator all compile through
here: the target's row of the stage table (`driver.targets`) gives the chain,
each stage's artifact is kept, and `save_stages` writes every artifact as it
is made (`00-graph.mlir`, `01-algorithm.mlir`, ...), so a stage that fails can
be reproduced from the saved input of that stage.
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .graph import FunctionInfo
from .options import CompileOptions
from .stages import Compilation
from .targets import TARGETS
from ..support.files import OutputError, can_create_in, write_atomic
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
    target.check_source(isinstance(source, bytes))
    chain = target.chain(until, options.kernel_object is not None)
    inputs = [filename, options.kernel_object]
    directory = None
    if save_stages is not None:
        directory = check_save_stages(save_stages, chain, inputs)
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise OutputError(f"cannot make the stages folder '{directory}': "
                              f"{error.strerror}") from None
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
                write_atomic(directory / f"{number:02d}-{stage.name}{stage.suffix}", artifact,
                             inputs)
                for suffix, content in c.companions.get(stage.name, {}).items():
                    write_atomic(directory / f"{number:02d}-{stage.name}{suffix}", content,
                                 inputs)
    return Compiled(options, dict(c.artifacts), dict(c.functions), dict(c.timings),
                    dict(c.kernel_layouts), tuple(remarks), dict(c.companions))


def check_save_stages(save_stages: str | Path, chain, inputs=(),
                      flag: str = "save_stages", outputs=()) -> Path:
    """The folder `save_stages` names (made later, if missing), refused with an
    OutputError before any work if it cannot be one, if a stage of `chain` would
    write a file over one of `inputs` (its `NN-<stage>.*`: the artifact, the companions),
    or if one of `outputs` (the caller's own files, written after the stages) is the
    folder or would replace one of its stage files. `flag` names it in the messages
    (the CLI's --save-stages)."""
    text = os.fspath(save_stages)
    if not text:
        # Path('') is '.': an empty value would scatter the stages over the current folder.
        raise OutputError(f"{flag} '{text}' names no folder; give the folder to save the "
                          f"stages in ('.' for the current one)")
    directory = Path(text)
    if directory.exists() and not directory.is_dir():
        raise OutputError(f"{flag} '{directory}' is a file, not a folder; give a folder to "
                          f"save the stages in (it is made if missing)")
    existing = directory
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise OutputError(f"{flag} '{directory}': '{existing}' is a file, so the folder "
                          f"cannot be made; give another folder")
    if not os.access(existing, os.W_OK | os.X_OK) or not can_create_in(existing):
        what = "folder" if existing == directory else f"folder cannot be made: '{existing}'"
        raise OutputError(f"{flag} '{directory}': the {what} is not writable; give a "
                          f"folder you can write to")
    files = {f"{number:02d}-{stage.name}.": stage for number, stage in enumerate(chain)}
    for output in outputs:
        where = Path(output).absolute()
        if where == directory.absolute():
            raise OutputError(f"output '{output}' is the {flag} folder; give the output "
                              f"another path")
        prefix = next((f for f in files if where.name.startswith(f)), None)
        if prefix and where.parent == directory.absolute():
            raise OutputError(f"output '{output}' takes a name of the {files[prefix].name} "
                              f"stage's files ({prefix}*), which {flag} '{directory}' "
                              f"writes; give the output another name or save the stages "
                              f"to another folder")
    if directory.is_dir():
        for entry in directory.iterdir():
            stage = next((s for prefix, s in files.items() if entry.name.startswith(prefix)),
                         None)
            source = stage and next((s for s in inputs if s and entry.exists() and
                                     Path(s).exists() and os.path.samefile(entry, s)), None)
            if source:
                raise OutputError(f"{flag} '{directory}' would write the {stage.name} "
                                  f"stage's '{entry.name}' over the input '{source}'; save "
                                  f"the stages to another folder (or move the input)")
    return directory
