"""ONNX models in: IREE's ONNX importer, then `raise-int8-attention`.

`import_model(data, filename)` checks the model (`onnx.checker`), infers its
shapes, imports it with IREE's importer (`iree.compiler.extras.onnx_importer`,
what `iree-import-onnx` runs) into the current context: every node a
`torch.operator "onnx.<Op>"` located at its node's name. Two things are
added for the driver:

- constants become dense attributes (the importer stores initializers as
  `dense_resource` blobs, which Python cannot read), so the pass can read a
  mask or a scale factor;
- the public function carries the model's input and output names
  (`int8attn.input_names`, `int8attn.output_names`), so `--inputs` and
  `--output` use them.

A model saved with external data (`onnx.save(..., save_as_external_data=True)`)
is read by `read_model(path)` with its tensors loaded from the files beside
it (relative to the model's folder, wherever the command runs), so the bytes
the driver compiles, caches and hands to onnxruntime hold every weight.

Needs the `onnx` extra (`pip install -e '.[onnx]'`).
"""

from __future__ import annotations

from pathlib import Path

from iree.compiler import ir

from ..passes.onnx_ops import onnx_name
from ..support.ir import walk

INPUT_NAMES = "int8attn.input_names"
OUTPUT_NAMES = "int8attn.output_names"
ONNX_SUFFIX = ".onnx"


class ModelError(ValueError):
    """An ONNX model that cannot be read or imported (what, where, how to fix)."""


def is_onnx(filename: str | Path) -> bool:
    return str(filename).lower().endswith(ONNX_SUFFIX)


def _onnx():
    try:
        import onnx
    except ImportError:
        raise ModelError("reading ONNX models needs the onnx package: pip install -e "
                         "'.[onnx]' (or pip install onnx)") from None
    return onnx


def parse_model(data: bytes, filename: str):
    """`data` as an onnx.ModelProto, or a ModelError saying it is no ONNX model."""
    model = _onnx().ModelProto()
    try:
        model.ParseFromString(data)
    except Exception as error:  # protobuf's DecodeError has no stable import path
        raise ModelError(f"{filename} is not an ONNX model (protobuf: {error}); export it "
                         "with onnx.save or torch.onnx.export") from None
    return model


def import_model(data: bytes, filename: str) -> ir.Operation:
    """A builtin.module holding the model's graph as one public function."""
    onnx = _onnx()
    from iree.compiler.extras import onnx_importer

    model = parse_model(data, filename)
    if not model.graph.node:
        raise ModelError(f"{filename} holds no ONNX graph (no nodes; an empty or truncated "
                         f"file?); export it again with onnx.save or torch.onnx.export")
    external = _external_tensors(model)
    if external:
        raise ModelError(f"{filename} keeps tensor '{external[0].name}' in the external data "
                         f"file '{_location(external[0])}', which the model's bytes do not "
                         f"carry; compile the model's file (int8attn.compile_file(path), "
                         f"int8attn compile|run PATH), which reads the data from the model's "
                         f"folder")
    try:
        onnx.checker.check_model(model)
        model = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as error:
        raise ModelError(f"{filename} is not a valid ONNX model: {_reason(error)}") from None
    _name_unnamed_nodes(model.graph)
    info = onnx_importer.ModelInfo(model)
    module = info.create_module(context=ir.Context.current).operation
    try:
        importer = onnx_importer.NodeImporter.define_function(info.main_graph, module)
        importer.import_all()
    except onnx_importer.OnnxImportError as error:
        raise ModelError(f"{filename}: IREE's ONNX importer: {error}") from None
    _dense_constants(module, info.main_graph.initializer_map)
    _name_signature(module, list(info.main_graph.input_map), [o.name for o in model.graph.output])
    return module


REASON_CHARS = 600   # a checker message can list a whole node or graph: keep it readable


def _reason(error: Exception) -> str:
    """The checker's whole message on one line: its first line often stops mid-sentence
    ("... input 'x' of node: ") before the node and the real reason."""
    reason = " ".join(line.strip() for line in str(error).splitlines() if line.strip())
    return reason if len(reason) <= REASON_CHARS else reason[:REASON_CHARS - 3].rstrip() + "..."


def _name_unnamed_nodes(graph) -> None:
    # Node names are the IR's locations (and the remarks' subject): give the
    # unnamed ones their op type and position in the graph.
    for index, node in enumerate(graph.node):
        if not node.name:
            node.name = f"{node.op_type}_{index}"


def _dense_constants(module: ir.Operation, initializers) -> None:
    from onnx import numpy_helper

    for op in walk(module):
        value = op.attributes["torch.onnx.value"] if "torch.onnx.value" in op.attributes else None
        if onnx_name(op) != "Constant" or value is None or \
                isinstance(value, (ir.DenseFPElementsAttr, ir.DenseIntElementsAttr)):
            continue  # already readable (the importer inlines small non-raw tensors)
        tensor = initializers.get(op.location.name_str)
        array = numpy_helper.to_array(tensor) if tensor is not None else None
        if array is None or array.dtype.kind not in "biuf":
            continue  # left as a blob (strings, complex): IREE reads it, the pass need not
        element = ir.RankedTensorType(value.type).element_type
        op.attributes["torch.onnx.value"] = ir.DenseElementsAttr.get(
            array.copy(order="C"), type=element, shape=list(array.shape))


def _name_signature(module: ir.Operation, inputs: list[str], outputs: list[str]) -> None:
    func = module.regions[0].blocks[0].operations[0].operation
    names = lambda items: ir.ArrayAttr.get([ir.StringAttr.get(n) for n in items])
    func.attributes[INPUT_NAMES] = names(inputs)
    func.attributes[OUTPUT_NAMES] = names(outputs)


def read_model(path: str | Path) -> bytes:
    """The model's bytes, with any external data loaded into them (a model saved
    with `save_as_external_data` keeps its tensors in files beside it)."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise ModelError(f"ONNX model '{path}' does not exist") from None
    except IsADirectoryError:
        raise ModelError(f"ONNX model '{path}' is a directory") from None
    except OSError as error:
        raise ModelError(f"cannot read ONNX model '{path}': {error.strerror}") from None
    return _load_external_data(data, Path(path))


def _external_tensors(model) -> list:
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    return [t for t in _get_all_tensors(model) if uses_external_data(t)]


def _location(tensor) -> str:
    from onnx.external_data_helper import ExternalDataInfo

    return ExternalDataInfo(tensor).location


def _load_external_data(data: bytes, path: Path) -> bytes:
    """`data` with every external tensor's bytes read from the file it names,
    relative to the model's folder (not the working directory)."""
    onnx = _onnx()
    from onnx.external_data_helper import load_external_data_for_tensor

    # Refused here, before a module cache could answer for bytes no model holds.
    model = parse_model(data, str(path))
    external = _external_tensors(model)
    if not external:
        return data
    folder = path.parent
    for tensor in external:
        location = _location(tensor)
        where = folder / location
        if not where.is_file():
            raise ModelError(f"ONNX model '{path}' keeps tensor '{tensor.name}' in the external "
                             f"data file '{location}', but '{where}' "
                             f"{'is not a file' if where.exists() else 'does not exist'}; "
                             f"put the data file beside the model (external data is read "
                             f"relative to the model's folder)")
        try:
            load_external_data_for_tensor(tensor, str(folder))
        except (OSError, ValueError, onnx.checker.ValidationError) as error:
            raise ModelError(f"ONNX model '{path}': cannot read tensor '{tensor.name}' from "
                             f"its external data file '{where}': {error}; save the model and its data "
                             f"again (onnx.save)") from None
    try:
        return model.SerializeToString()
    except ValueError:  # protobuf's 2 GiB limit on one message
        raise ModelError(f"ONNX model '{path}' with its external data is over protobuf's 2 "
                         f"GiB limit on one model, which IREE's importer reads whole; "
                         f"models that large are not supported") from None
