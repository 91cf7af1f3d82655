"""What `--target` does: one row per target, its named stages in order.

    cpu     graph -> algorithm -> linalg -> vmfb          runs on IREE local-task
    gfx936  graph -> kernel -> llvm (-> vmfb with --kernel-object)   simulator; IREE hip
    gfx942  graph -> kernel -> vmfb -> isa; kernel -> llvm (-> vmfb)  simulator; IREE hip
    cuda    graph -> kernel -> vmfb -> ptx                simulator; IREE cuda

Every chain starts with `graph` (parse, the int8attn op verifiers, the
signatures), so every target rejects a malformed graph the same way; inputs
are checked once, before any call, in `driver.graph.check_arguments`. A
target also says which option values it accepts: an option that does not
apply is refused with the reason, never ignored. Adding a target adds a row.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Mapping

from . import stages
from .cpu_target import HOST, CPUTarget, UnknownTargetCPU
from .cpu_target import resolve as resolve_cpu
from .options import TARGET_NAMES, CompileOptions, flag_spelling
from ..fragments import PV_ATOMS
from ..kernels.target_spec import target_spec
from ..support.docs import first_sentence


class OptionRefused(ValueError):
    """An option value that the chosen target does not offer."""


@dataclass(frozen=True)
class Stage:
    name: str
    make: Callable[[stages.Compilation], str | bytes]
    suffix: str
    reads: str | None = None     # the stage whose results it needs (None: the one before it)
    prints_ir: bool = False      # runs MLIR pass pipelines that --print-ir-after-all prints
    packages_object: bool = False  # packages the --kernel-object code object

    @property
    def summary(self) -> str:
        return first_sentence(self.make.__doc__ or "")


GRAPH = Stage("graph", stages.make_graph, ".mlir")
ALGORITHM = Stage("algorithm", stages.make_algorithm, ".mlir", prints_ir=True)
LINALG = Stage("linalg", stages.make_linalg, ".mlir", prints_ir=True)
KERNEL = Stage("kernel", stages.make_kernel, ".mlir")
VMFB = Stage("vmfb", stages.make_vmfb, ".vmfb")
ISA = Stage("isa", stages.make_assembly, ".s", reads="vmfb")
PTX = Stage("ptx", stages.make_assembly, ".ptx", reads="vmfb")
LLVM = Stage("llvm", stages.make_llvm, ".ll", reads="kernel")
PACKAGED_VMFB = Stage("vmfb", stages.make_packaged_vmfb, ".vmfb", reads="llvm",
                      packages_object=True)


# The kernel targets whose prefill kernel (dense and chunked) chains PV MMACs into one
# accumulator (kernels/pv_stages.py: check_w_chain says which chains); their decode
# kernels refuse a chain when built (kernels/decode.py: build_decode_kernels).
CHAINED_PREFILL_TARGETS = ("cuda",)


def _kernel_refusals(target: str) -> dict[str, tuple[Callable[[CompileOptions], bool], str]]:
    """Options a lane-kernel target refuses: (is the value refused?, why)."""
    model = target_spec(target).model
    return {
        "fragment_model": (lambda o: o.fragment_model not in (None, target),
                           f"--target {target} generates its kernels from its own fragment "
                           f"model ({target}); --fragment-model chooses the W groups of "
                           f"--target cpu"),
        "scale_groups": (lambda o: o.scale_groups != "fragment",
                         "the lane kernels compute each W scale in the lanes that feed its "
                         "MMAC, so their groups are the MMAC's token sets by construction; "
                         "measure contiguous (wrong) W groups with --target cpu"),
        "verify": (lambda o: not o.verify,
                   "--no-verify only lets --scale-groups contiguous past the verifier, which "
                   "only --target cpu offers"),
        "partition_tokens": (lambda o: o.partition_tokens != model.partition_tokens,
                             f"the decode kernels' partition is fixed by the fragment model: "
                             f"{model.waves_per_partition} waves of {model.wave_tokens} "
                             f"tokens = {model.partition_tokens}"),
        "tile_tokens": (lambda o: o.tile_tokens != model.wave_tokens,
                        f"the prefill kernel's KV tile is the fragment model's wave of "
                        f"{model.wave_tokens} tokens (its W groups are the wave's MMAC "
                        f"token sets)"),
        "w_chain": (lambda o: o.w_chain != 1 and target not in CHAINED_PREFILL_TARGETS,
                    f"--target {target}'s kernels convert each MMAC's int32 sum to f32 on "
                    f"its own (chain 1); chained accumulators are --target cpu's and "
                    f"--target {', '.join(CHAINED_PREFILL_TARGETS)}'s prefill kernel's"),
        "pv_atom": (lambda o: o.pv_atom not in (None, *PV_ATOMS[target]),
                    f"--target {target}'s INT8 PV atoms are {', '.join(PV_ATOMS[target])} "
                    f"(the first is QK's too), and only --pv int8 runs on one"),
        "target_cpu": (lambda o: o.target_cpu != HOST,
                       "--target-cpu chooses the CPU IREE's llvm-cpu backend compiles "
                       "--target cpu for"),
        "contraction": (lambda o: o.contraction != "f32",
                        "--contraction chooses how --target cpu's tensor-level pipeline "
                        "lowers the MMAC tiles; the lane kernels run the matrix instruction"),
        "vector_isa": (lambda o: o.vector_isa is not None,
                       "vector_isa sizes --target cpu's mmt4d tiles"),
        **({} if target_spec(target).llvm_proxy else _NO_KERNEL_OBJECT),
    }


# What the lane kernels have no use for, whatever its value (the others of
# `_kernel_refusals` take the value the kernels have anyway).
_KERNEL_INAPPLICABLE = frozenset({"target_cpu", "contraction", "vector_isa"})

_NO_KERNEL_OBJECT = {"kernel_object": (
    lambda o: o.kernel_object is not None,
    "--kernel-object packages an AMDGPU code object built from --emit llvm; --target "
    "gfx936 and gfx942 have that stage")}


@dataclass(frozen=True)
class Target:
    name: str
    summary: str
    stages: tuple[Stage, ...]
    default_emit: str
    pv: tuple[str, ...]                     # PV precisions it has kernels / passes for
    runtime_driver: str | None              # IREE HAL driver that runs its vmfb
    simulates: bool                         # its kernels run in the lane simulator
    iree_flags: tuple[str, ...] = ()
    assembly_glob: str | None = None
    refusals: Mapping[str, tuple[Callable[[CompileOptions], bool], str]] = \
        dataclasses.field(default_factory=dict)
    # Of `refusals`, the options that do nothing here at any value (their default too).
    inapplicable: frozenset[str] = frozenset()
    takes_target_cpu: bool = False          # IREE llvm-cpu: --target-cpu is its CPU
    compiles_models: bool = False           # an ONNX model's float ops too (IREE's own)
    # With --kernel-object (a code object built from the llvm stage): the stages
    # that replace or extend the row, and the IREE HAL driver that runs the result.
    with_object: tuple[Stage, ...] = ()
    object_runtime_driver: str | None = None

    def stage_names(self, kernel_object: bool = False) -> list[str]:
        return [s.name for s in self.row(kernel_object)]

    def row(self, kernel_object: bool = False) -> tuple[Stage, ...]:
        """The target's stages; with a kernel object, `with_object` replaces the stages
        of the same name (a stage reading a replaced one goes: IREE's ISA of a vmfb
        it did not build) or is appended."""
        if not kernel_object:
            return self.stages
        replaced = {s.name: s for s in self.with_object}
        row = [replaced.get(s.name, s) for s in self.stages
               if s.name in replaced or s.reads not in replaced]
        row += [s for s in self.with_object if s.name not in self.stage_names()]
        # each stage after the one it reads (a packaged vmfb reads llvm, listed after it)
        ordered: list[Stage] = []
        while row:
            ready = next(s for s in row if s.reads is None
                         or s.reads in [o.name for o in ordered]
                         or s.reads not in [r.name for r in row])
            ordered.append(ready)
            row.remove(ready)
        return tuple(ordered)

    def chain(self, until: str | None = None, kernel_object: bool = False) -> tuple[Stage, ...]:
        """The stages `until` (default: `default_emit`, `vmfb` with a kernel object)
        needs, in order: each stage after the one it reads."""
        until = until or ("vmfb" if kernel_object else self.default_emit)
        row = self.row(kernel_object)
        names = [s.name for s in row]
        if until not in names:
            hint = ""
            if not kernel_object and until in [s.name for s in self.with_object]:
                hint = (f" without --kernel-object: its {until} packages a code object built "
                        f"from --emit llvm "
                        f"(docs/targets.md, *gfx936: the hand-off to Hygon's DTK*)")
            with_object = " with --kernel-object" if kernel_object else ""
            raise OptionRefused(f"--target {self.name}{with_object} has the stages "
                                f"{', '.join(names)}; there is no '{until}' to emit{hint}")
        needed, name = [], until
        while name is not None:
            index = names.index(name)
            needed.append(row[index])
            name = row[index].reads or (names[index - 1] if index else None)
        packaged = [s.name for s in row if s.packages_object]
        if kernel_object and packaged and not any(s.packages_object for s in needed):
            raise OptionRefused(f"--kernel-object does not apply to --emit {until}: only the "
                                f"{' and '.join(packaged)} stage packages the code object, "
                                f"and --emit {until} stops before it (drop --kernel-object, "
                                f"or --emit {' or '.join(packaged)})")
        return tuple(reversed(needed))

    def check_source(self, model: bool) -> None:
        """An ONNX model (`model`) compiles only where IREE compiles its float ops too."""
        if model and not self.compiles_models:
            raise OptionRefused(f"--target {self.name} compiles int8attn graphs to lane-level "
                                f"kernels; an ONNX model (its float ops too) compiles with "
                                f"--target cpu")

    def check_print_ir(self, kernel_object: bool = False, model: bool = False) -> None:
        """--print-ir-after-all prints the IR after each pass of the stages that run MLIR
        pass pipelines; a chain without one (a lane-kernel target's) would print nothing.
        An ONNX model's graph stage runs raise-int8-attention (`model`)."""
        if model or any(s.prints_ir for s in self.row(kernel_object)):
            return
        raise OptionRefused(f"--print-ir-after-all does not apply to --target {self.name}: "
                            f"its stages ({', '.join(self.stage_names(kernel_object))}) run "
                            f"no MLIR pass pipeline to print (the kernel stage generates the "
                            f"kernels directly); write each stage's IR with --emit STAGE or "
                            f"--save-stages DIR")

    def check(self, options: CompileOptions) -> CompileOptions:
        """Refuse what does not apply (`refuse`); return the options with defaults
        resolved."""
        self.refuse(options)
        resolved = options.resolved()
        if not self.takes_target_cpu:
            return resolved
        cpu = self.cpu(options.target_cpu)
        if options.vector_isa not in (None, cpu.vector_isa):
            raise OptionRefused(f"vector_isa {options.vector_isa} is not the register file of "
                                f"--target-cpu {options.target_cpu} ({cpu.vector_isa}); it "
                                f"is derived from --target-cpu, leave it out")
        # (kept only where it sizes something: contraction mmt4d, `resolved`)
        return dataclasses.replace(resolved, vector_isa=cpu.vector_isa).resolved()

    def refuse(self, options: CompileOptions, given=None) -> None:
        """Refuse an option that does not apply to this target or with the others.
        `given`: the options the caller named (the CLI's flags), refused where they do
        nothing even at their default value; None: those not at their default."""
        if options.pv not in self.pv:
            raise OptionRefused(f"--pv {options.pv} does not apply to --target {self.name}: "
                                f"it has {' and '.join(self.pv)} PV")
        named = set(given or ())
        for name, (refused, why) in self.refusals.items():
            if refused(options) or (name in named and name in self.inapplicable):
                raise OptionRefused(f"{flag_spelling(name, getattr(options, name))} does not "
                                    f"apply to --target {self.name}: {why}")
        why = options.refusal(given)  # what an option needs of the others (any target)
        if why is not None:
            raise OptionRefused(why)

    def cpu(self, name: str) -> CPUTarget:
        """The CPU IREE compiles for, as IREE resolves `--target-cpu name`."""
        try:
            return resolve_cpu(name)
        except UnknownTargetCPU as error:
            raise OptionRefused(str(error)) from None


_KERNEL_FLAGS = (
    # Binding fusion packs the partition outputs into one buffer, and its offsets
    # do not reach the hand-written kernel's subspans (the outputs land on top of
    # each other).
    "--iree-scheduling-optimize-bindings=false",
)
_CPU_ONLY = {**_NO_KERNEL_OBJECT, "v_token_innermost": (lambda o: o.v_token_innermost,
                                   "V layouts are a kernel-target choice"),
             "pv_atom": (lambda o: o.pv_atom is not None,
                         "the lane kernels' PV instruction; --target cpu's W groups follow "
                         "--fragment-model"),
             **{f"{value}_second": (lambda o, name=f"{value}_second":
                                    getattr(o, name) not in (None, "scaled"),
                                    f"the tensor-level pipeline scales the second {value} term "
                                    "by its residual's own absmax (scaled); the digit split "
                                    "is the lane kernels'")
                for value in ("q", "w")}}

TARGETS: dict[str, Target] = {
    "cpu": Target(
        "cpu", "the tensor-level pipeline compiled by IREE llvm-cpu (runs here)",
        (GRAPH, ALGORITHM, LINALG, VMFB), "vmfb", ("int8", "bf16", "f32"), "local-task", False,
        ("--iree-hal-target-device=local", "--iree-hal-local-target-device-backends=llvm-cpu",
         # lower-mmac-tiles{contraction=mmt4d} emits each MMAC group's sum as a
         # linalg.batch_mmt4d of i16 operands: IREE's mmt4d ukernel runs it on VNNI
         # (vpdpwssd). No other op of the cpu pipeline is an mmt4d.
         "--iree-llvmcpu-enable-ukernels=mmt4d"),
        refusals=_CPU_ONLY, takes_target_cpu=True, compiles_models=True),
    "gfx936": Target(
        "gfx936", "lane-level decode, prefill and cache-write kernels on the DCU's v_mmac_i32_16x16x32_i8 (IR for a "
        "gfx936 toolchain; IREE's LLVM cannot translate the intrinsic)",
        (GRAPH, KERNEL, LLVM), "kernel", ("int8",), None, True,
        with_object=(PACKAGED_VMFB,), object_runtime_driver="hip",
        inapplicable=_KERNEL_INAPPLICABLE,
        refusals={**_kernel_refusals("gfx936"),
                  "iree_flags": (lambda o: bool(o.iree_flags),
                                 "gfx936 has no IREE compilation stage (IREE does not know "
                                 "the chip)")}),
    "gfx942": Target(
        "gfx942", "lane-level decode, prefill and cache-write kernels on v_mfma_i32_16x16x32_i8 through IREE's ROCm "
        "backend",
        (GRAPH, KERNEL, VMFB, ISA, LLVM), "vmfb", ("int8",), "hip", True,
        ("--iree-hal-target-device=hip", "--iree-rocm-target=gfx942", *_KERNEL_FLAGS),
        "*.rocmasm", refusals=_kernel_refusals("gfx942"), inapplicable=_KERNEL_INAPPLICABLE,
        with_object=(PACKAGED_VMFB,), object_runtime_driver="hip"),
    "cuda": Target(
        "cuda", "lane-level decode, prefill and cache-write kernels on mma.sync.m16n8k32.s8 through IREE's CUDA "
        "backend (sm_80 PTX; the driver JITs it on newer GPUs)",
        (GRAPH, KERNEL, VMFB, PTX), "vmfb", ("int8", "bf16"), "cuda", True,
        ("--iree-hal-target-device=cuda", "--iree-cuda-target=sm_80", *_KERNEL_FLAGS),
        "*.ptx", refusals=_kernel_refusals("cuda"), inapplicable=_KERNEL_INAPPLICABLE),
}

STAGE_NAMES = tuple(dict.fromkeys(s.name for t in TARGETS.values() for s in t.stages))


def describe() -> str:
    """The table as text (for `int8attn targets` and docs/targets.md)."""
    lines = []
    for t in TARGETS.values():
        lines.append(f"{t.name:7} {' -> '.join(t.stage_names())}")
        lines.append(f"        {t.summary}")
        runs = ([f"IREE {t.runtime_driver}"] if t.runtime_driver else []) + \
            (["the lane simulator (--simulate)"] if t.simulates else [])
        atoms = (f"; --pv-atom: {', '.join(PV_ATOMS[t.name])}"
                 if len(PV_ATOMS.get(t.name, ())) > 1 else "")
        lines.append(f"        pv: {', '.join(t.pv)}{atoms}; runs on: {' or '.join(runs)}")
        if t.with_object:
            lines.append(f"        --kernel-object K.co (built from --emit llvm): "
                         f"{' -> '.join(t.stage_names(True))}, runs on IREE "
                         f"{t.object_runtime_driver}")
    return "\n".join(lines)

assert tuple(TARGETS) == TARGET_NAMES
