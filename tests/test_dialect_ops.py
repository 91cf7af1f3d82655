"""The int8attn ops as typed classes: registration, accessors, verifier methods."""

import numpy as np
import pytest
from iree.compiler import ir
from iree.compiler.dialects import func

from int8attn.dialects import int8attn as d
from int8attn.dialects.ops import Int8AttnOp
from int8attn.fragments import fragment_model
from int8attn.support.diagnostics import DiagnosticError, format_location
from int8attn.support.ir import new_context, parse_module, walk

TYPES = ("(tensor<1x4x2x16xf32>, tensor<1x2x8x16xi8>, tensor<1x2x8xf32>, tensor<1x2x8x16xi8>, "
         "tensor<1x2x8xf32>) -> tensor<1x4x2x16xf32>")
GRAPH = f"""\
func.func @prefill(%q: tensor<1x4x2x16xf32>, %k: tensor<1x2x8x16xi8>, %ks: tensor<1x2x8xf32>,
                   %v: tensor<1x2x8x16xi8>, %vs: tensor<1x2x8xf32>) -> tensor<1x4x2x16xf32> {{
  %o = "int8attn.attention"(%q, %k, %ks, %v, %vs) {{mode = "prefill", softmax_scale = SCALE : f32}} : {TYPES}
  return %o : tensor<1x4x2x16xf32>
}}
"""


def _ops(module, cls):
    return [op.opview for op in walk(module) if isinstance(op.opview, cls)]


def test_parsed_graph_yields_a_typed_attention_op():
    with new_context():
        module = parse_module(GRAPH.replace("SCALE", "0.25"), "graph.mlir")
        (op,) = _ops(module, d.AttentionOp)
        assert type(op) is d.AttentionOp
        assert op.mode == "prefill" and isinstance(op.mode, str)
        assert op.softmax_scale == 0.25 and isinstance(op.softmax_scale, float)
        func = op.operation.parent.opview
        arguments = list(func.regions[0].blocks[0].arguments)
        assert [op.q, op.k, op.k_scale, op.v, op.v_scale] == arguments
        assert op.result.owner == op  # a value's owner is the typed op too
        assert op.verify()
        d.verify(module)


def test_typed_verifier_raises_at_the_op_location():
    with new_context():
        module = parse_module(GRAPH.replace("SCALE", "-0.5"), "graph.mlir")
        (op,) = _ops(module, d.AttentionOp)
        with pytest.raises(DiagnosticError) as error:
            op.verify()
        assert format_location(error.value.location) == "graph.mlir:3:8"
        assert error.value.message == ("'int8attn.attention' op attribute 'softmax_scale' must "
                                       "be positive and finite, got -0.5")
        with pytest.raises(DiagnosticError) as from_module:
            d.verify(module)
        assert str(from_module.value) == str(error.value)


def test_built_ops_have_typed_accessors():
    groups = fragment_model("gfx936").token_groups(64)
    with new_context(), ir.Location.unknown():
        module = ir.Module.create()
        with ir.InsertionPoint(module.body):
            w = d.tensor([1, 2, 3, 4, 64], "f32")
            v = d.tensor([1, 2, 4, 64, 16], "i8")
            o = d.tensor([1, 2, 3, 4, 16], "f32")
            @func.FuncOp.from_py_func(w, v, o)
            def f(w_arg, v_arg, o_arg):
                quantize = d.GroupQuantizeOp.build(w_arg, groups)
                return d.grouped_pv(quantize.wq, quantize.sw, v_arg, o_arg, groups)

        (quantize,) = _ops(module.operation, d.GroupQuantizeOp)
        (grouped,) = _ops(module.operation, d.GroupedPVOp)
        assert np.array_equal(quantize.groups, groups) and quantize.groups.dtype == np.int64
        assert np.array_equal(quantize.scale_groups, groups)  # defaults to groups
        arguments = list(f.func_op.regions[0].blocks[0].arguments)
        assert grouped.wq.owner == quantize and grouped.v == arguments[1]
        assert grouped.acc == arguments[2] and grouped.column_sums is None
        assert grouped.result.type == grouped.acc.type
        assert np.array_equal(grouped.groups, groups)
        d.verify(module.operation)


def test_every_op_in_the_table_has_a_registered_class():
    assert set(d.OPS) == {d.ATTENTION, d.PAGED_ATTENTION, d.CACHE_WRITE, d.QUANTIZE,
                          d.SOFTMAX_PV, d.PV, d.FOLDED_PV, d.GROUP_QUANTIZE, d.GROUPED_PV,
                          d.MMAC_TILES, d.COLUMN_SUMS}
    with new_context(), ir.Location.unknown():
        for name, cls in d.OPS.items():
            assert issubclass(cls, Int8AttnOp) and cls.OPERATION_NAME == name
            op = ir.Operation.create(name)
            assert type(op.opview) is cls, name
        unknown = ir.Operation.create("int8attn.nonsense")
        assert not isinstance(unknown.opview, Int8AttnOp)
        with pytest.raises(DiagnosticError, match="unknown op 'int8attn.nonsense'"):
            d.verify(unknown)


def test_an_op_class_without_its_own_verifier_is_refused_at_definition():
    import pytest

    from int8attn.dialects.ops import Int8AttnOp

    with pytest.raises(TypeError, match="NoVerifier must define verify()"):
        class NoVerifier(Int8AttnOp):
            OPERATION_NAME = "int8attn.no_verifier"
