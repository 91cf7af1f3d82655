"""`--kernel-object K.co`: a vmfb whose executables all come from one code object.

The code object was built by the target's own toolchain from the `llvm`
stage's IR. Before IREE sees it, it is checked against this graph's `llvm`
stage, each failure named: the processor it was built for, the kernels it
must export (every export of the manifest: ours and IREE's own dispatches),
the IR it was built from (the marker symbol holding that IR's digest), and
the manifest beside it (K.json), if there is one.

Packaging: IREE's sources of the proxy build (one `hal.executable` per kernel,
its pipeline layout and workgroup count as IREE derived them) become external
variants holding the object (`hal.executable.variant … objects([…])`, no
code inside), substituted for IREE's own with
`--iree-hal-substitute-executable-source`, so IREE generates no device code at
all and the host functions dispatch the object's kernels. The variant keeps the
proxy chip's `rocm-hsaco-fb` target: IREE 3.13 refuses to serialize a chip it
does not know (gfx936) even for an external object, and the runtime selects a
variant by format only; the HIP runtime then loads the object on the device,
which checks the object's own processor.
"""

from __future__ import annotations

import json
import shlex
import shutil
import tempfile
from pathlib import Path

from iree.compiler import ir
from iree.compiler.tools import CompilerToolError, compile_str

from .code_object import CodeObjectError, read_code_object
from .llvm_stage import MARKER_PREFIX, build_command, proxy_flags
from ..kernels.target_spec import target_spec
from ..support.diagnostics import StageError, save_for_repro
from ..support.ir import walk


class KernelObjectError(ValueError):
    """The --kernel-object file does not fit this graph (printed as an error, exit 1)."""


def package(kernel_mlir: str, llvm, options) -> bytes:
    path = Path(options.kernel_object)
    data = _read(path)
    check_object(data, path, llvm, options.target)
    spec = target_spec(options.target)
    with tempfile.TemporaryDirectory(prefix="int8attn-package-") as folder:
        folder = Path(folder)
        shutil.copyfile(path, folder / "kernels.co")
        flags = proxy_flags(spec.llvm_proxy)
        for executable, source in _translated_executables(kernel_mlir, flags).items():
            external = folder / f"{executable}.mlir"
            external.write_text(_external_variant(source, folder / "kernels.co"))
            flags.append(f"--iree-hal-substitute-executable-source={executable}={external}")
        try:
            return compile_str(kernel_mlir, extra_args=flags)
        except CompilerToolError as error:
            from .stages import compiler_messages

            saved = save_for_repro({"input.mlir": kernel_mlir})
            for item in folder.iterdir():
                shutil.copyfile(item, saved / item.name)
            flags = [f.replace(str(folder), str(saved)) for f in flags]
            raise StageError("IREE packaging of the kernel object (iree-compile)",
                             compiler_messages(str(error)),
                             shlex.join(["iree-compile", str(saved / "input.mlir"), *flags,
                                         "-o", str(saved / "out.vmfb")])) from None


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise KernelObjectError(f"kernel object '{path}' does not exist; build it from "
                                f"--emit llvm with the command the manifest gives") from None
    except IsADirectoryError:
        raise KernelObjectError(f"kernel object '{path}' is a directory") from None
    except OSError as error:
        raise KernelObjectError(f"cannot read kernel object '{path}': "
                                f"{error.strerror}") from None


def check_object(data: bytes, path: Path, llvm, target: str) -> None:
    """Refuses, naming the problem, an object this graph's kernels cannot come from."""
    manifest = llvm.manifest
    rebuild = (f"rebuild it: int8attn compile GRAPH --target {target} --emit llvm -o "
               f"KERNELS.ll, then {build_command(target)}")
    try:
        code = read_code_object(data, f"kernel object '{path}'")
    except CodeObjectError as error:
        raise KernelObjectError(str(error)) from None
    if code.processor != target:
        raise KernelObjectError(f"kernel object '{path}' is built for {code.processor}, not "
                                f"{target} (--target {target}); {rebuild}")
    needed = [k["kernel"] for k in manifest["kernels"] + manifest["iree_dispatches"]]
    missing = [k for k in needed if k not in code.kernels]
    if missing:
        raise KernelObjectError(f"kernel object '{path}' lacks the kernel(s) "
                                f"{', '.join(missing)} this graph dispatches (it has "
                                f"{', '.join(sorted(code.kernels)) or 'none'}); {rebuild}")
    markers = sorted(s for s in code.symbols if s.startswith(MARKER_PREFIX))
    if markers != [manifest["marker_symbol"]]:
        built = (f"IR {markers[0].removeprefix(MARKER_PREFIX)}" if markers else
                 "IR without int8attn's marker (not the llvm stage's output)")
        raise KernelObjectError(f"kernel object '{path}' is stale: it was built from {built}, "
                                f"but this graph and these options give IR "
                                f"{manifest['ir_digest']}; {rebuild}")
    _check_manifest_beside(path, manifest, rebuild)


def _check_manifest_beside(path: Path, manifest: dict, rebuild: str) -> None:
    beside = path.with_suffix(".json")
    if not beside.is_file():
        return
    try:
        written = json.loads(beside.read_text())
    except (OSError, ValueError, UnicodeDecodeError) as error:
        raise KernelObjectError(f"manifest '{beside}' beside the kernel object cannot be "
                                f"read as JSON ({error}); {rebuild}") from None
    if not isinstance(written, dict):
        raise KernelObjectError(f"manifest '{beside}' is not a JSON object; {rebuild}")
    for key in ("target", "ir_digest", "kernels", "iree_dispatches"):
        if written.get(key) != manifest[key]:
            raise KernelObjectError(f"manifest '{beside}' does not match the graph: its "
                                    f"'{key}' differs from what this graph and these options "
                                    f"give (written for another graph?); {rebuild}")


def _translated_executables(kernel_mlir: str, flags: list[str]) -> dict[str, str]:
    """Each hal.executable of the proxy build once IREE translated it: the workgroup
    count of a dispatch IREE formed itself is only resolved by then."""
    try:
        text = compile_str(kernel_mlir, extra_args=flags + ["--compile-to=executable-targets"])
    except CompilerToolError as error:
        from .stages import compiler_messages

        raise StageError("IREE translation of the proxy build (iree-compile)",
                         compiler_messages(str(error)), "int8attn compile GRAPH --target "
                         "gfx942 --emit vmfb -o out.vmfb") from None
    module = ir.Module.parse(text.decode() if isinstance(text, bytes) else text)
    return {ir.StringAttr(op.attributes["sym_name"]).value: str(op)
            for op in module.body.operations if op.operation.name == "hal.executable"}


def _external_variant(source: str, object_path: Path) -> str:
    """IREE's source of one executable with its variant's code replaced by the object."""
    module = ir.Module.parse(source)
    for op in walk(module.operation):
        if op.name != "hal.executable.variant":
            continue
        op.attributes["objects"] = ir.Attribute.parse(
            f"[#hal.executable.object<{{path = {json.dumps(str(object_path))}}}>]")
        for inner in list(op.regions[0].blocks[0].operations):
            if inner.operation.name == "builtin.module":
                inner.operation.erase()
    return str(module)
