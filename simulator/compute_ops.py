"""The lane simulator's handlers of the ops that compute values.

`ComputeOps` holds the `op_<dialect>_<op>` handlers of arith and math, of
vector (extract, insert, elements, slices, bitcast) and of the matrix
instructions (gfx936's MMAC intrinsic, gfx942's MFMA, CUDA's mma.sync, run by
`simulator.isa`). It is mixed into `interpreter.Machine`, whose state
(`thread_count`, `wave_size`) the handlers read; each takes the op and its
operands' values, arrays with a leading thread axis, and returns the results.
"""

from __future__ import annotations

import numpy as np
from iree.compiler import ir

from ..kernels.target_spec import (BYTE_PERMUTE, EXP2_INTRINSICS, FLUSHED_BELOW,
                                   RECIPROCAL_INTRINSICS)
from ..reference.common import fma_f32
from .isa import matrix_instruction, table_for
from .memory import DTYPES, SimulationError, _element

INTRINSICS = {"llvm.amdgcn.mmac.i32.16x16x32i8": "gfx936"}
CMPI = {0: np.equal, 1: np.not_equal, 2: np.less, 3: np.less_equal, 4: np.greater,
        5: np.greater_equal, 6: np.less, 7: np.less_equal, 8: np.greater, 9: np.greater_equal}
# arith.cmpf's predicates: the ordered ones (false on NaN) and une (true on NaN), which
# is numpy's !=.
CMPF = {1: np.equal, 2: np.greater, 3: np.greater_equal, 4: np.less, 5: np.less_equal,
        13: np.not_equal}


def byte_permute(a, b, selector) -> np.ndarray:
    """PTX prmt.b32, default mode: byte i of the result is byte n (n = selector nibble
    i, low three bits) of the eight bytes {b, a}, a's first; a nibble's bit 3 replicates
    that byte's sign bit instead."""
    a, b, selector = np.broadcast_arrays(*(np.asarray(x).astype(np.int64) & 0xFFFFFFFF
                                          for x in (a, b, selector)))
    pool = a | (b << 32)
    out = np.zeros_like(a)
    for i in range(4):
        nibble = (selector >> (4 * i)) & 0xF
        byte = (pool >> (8 * (nibble & 7))) & 0xFF
        byte = np.where(nibble & 8, np.where(byte & 0x80, 0xFF, 0), byte)
        out |= byte << (8 * i)
    return out.astype(np.uint32).view(np.int32)


def flushed_reciprocal(x) -> np.ndarray:
    """rcp.approx.ftz.f32 as the simulator takes it: 1 / x correctly rounded, a
    subnormal operand or result flushed to zero of its sign (the hardware's is within
    1 ulp, which `contract.levels_over` is checked to absorb)."""
    x = np.asarray(x, np.float32)
    x = np.where(np.abs(x) < FLUSHED_BELOW, np.copysign(np.float32(0), x), x)
    with np.errstate(divide="ignore", over="ignore", under="ignore"):
        y = np.float32(1) / x
    return np.where(np.abs(y) < FLUSHED_BELOW, np.copysign(np.float32(0), y), y)


class ComputeOps:
    """The value-computing op handlers of `Machine` (a mixin: it reads the machine's state)."""

    # arithmetic -------------------------------------------------------------
    def op_arith_constant(self, op, _):
        t, attr = op.result.type, op.attributes["value"]
        dtype = DTYPES[_element(t)]
        if isinstance(t, ir.VectorType):
            splat = ir.DenseElementsAttr(attr).get_splat_value()
            scalar = splat.value
            return np.full((1,) + tuple(t.shape), scalar, dtype=dtype)
        return np.array([attr.value], dtype=dtype)

    def _binary(fn):
        def handler(self, op, operands):
            with np.errstate(all="ignore"):
                result = fn(*operands)
            return result.astype(DTYPES[_element(op.result.type)], copy=False)
        return handler

    op_arith_addi = _binary(np.add)
    op_arith_subi = _binary(np.subtract)
    op_arith_muli = _binary(np.multiply)
    op_arith_divui = _binary(np.floor_divide)
    op_arith_remui = _binary(np.remainder)
    op_arith_minui = _binary(np.minimum)
    op_arith_negf = _binary(np.negative)
    def op_arith_trunci(self, op, operands):
        # The cast wraps, as LLVM's trunc (the kernels read a level off the low bits).
        return np.asarray(operands[0]).astype(DTYPES[_element(op.result.type)])

    def op_arith_bitcast(self, op, operands):
        # i32 <-> f32, the same bits (the conversions through the round bias).
        dtype = DTYPES[_element(op.result.type)]
        source = np.asarray(operands[0])
        width = np.int32 if source.dtype.kind in "iu" else np.float32
        return np.ascontiguousarray(source.astype(width)).view(dtype)
    op_arith_extsi = _binary(lambda x: np.asarray(x))    # integers are held signed

    def op_math_fma(self, op, operands):
        # one rounding of the exact a*b + c, as the hardware's fma
        return fma_f32(*operands)
    op_arith_andi = _binary(np.bitwise_and)
    op_arith_ori = _binary(np.bitwise_or)
    op_arith_xori = _binary(np.bitwise_xor)
    op_arith_shrui = _binary(np.right_shift)
    op_arith_shrsi = _binary(np.right_shift)           # integers are held signed
    op_arith_shli = _binary(np.left_shift)
    op_arith_addf = _binary(np.add)
    op_arith_subf = _binary(np.subtract)
    op_arith_mulf = _binary(np.multiply)
    op_arith_divf = _binary(np.divide)
    op_arith_maximumf = _binary(np.maximum)
    op_arith_minimumf = _binary(np.minimum)
    op_math_exp = _binary(np.exp)
    op_math_exp2 = _binary(np.exp2)
    op_math_absf = _binary(np.abs)
    op_math_roundeven = _binary(np.rint)

    def op_arith_cmpi(self, op, operands):
        return CMPI[ir.IntegerAttr(op.attributes["predicate"]).value](*operands)

    def op_arith_cmpf(self, op, operands):
        return CMPF[ir.IntegerAttr(op.attributes["predicate"]).value](*operands)

    def op_arith_select(self, op, operands):
        return np.where(*operands)

    def op_arith_sitofp(self, op, operands):
        return operands[0].astype(np.float32)

    def op_arith_truncf(self, op, operands):
        if _element(op.result.type) != "bf16":
            raise SimulationError(f"unsupported truncf to {op.result.type}")
        from ..support.bf16 import round_to_bf16

        return round_to_bf16(np.asarray(operands[0], np.float32))

    def op_arith_fptosi(self, op, operands):
        # NaN, Inf or an out-of-range value is poison in LLVM: an error here, not a number.
        x = np.asarray(operands[0])
        dtype = DTYPES[_element(op.result.type)]
        limits = np.iinfo(dtype)
        with np.errstate(invalid="ignore"):
            bad = ~np.isfinite(x) | (np.trunc(x) < limits.min) | (np.trunc(x) > limits.max)
        if bad.any():
            raise SimulationError(f"arith.fptosi of {x[bad].ravel()[0]!r} to {dtype.__name__} is "
                                  f"poison ({int(bad.sum())} lanes)")
        return np.trunc(x).astype(dtype)

    def op_arith_index_cast(self, op, operands):
        return operands[0].astype(DTYPES[_element(op.result.type)])

    # vectors and matrix instructions -----------------------------------------
    def op_vector_extract(self, op, operands):
        position = tuple(ir.DenseI64ArrayAttr(op.attributes["static_position"]))
        source = operands[0]
        return source[(slice(None),) + position]

    def op_vector_insert(self, op, operands):
        position = tuple(ir.DenseI64ArrayAttr(op.attributes["static_position"]))
        value, dest = operands
        shape = (self.thread_count,) + tuple(ir.VectorType(op.result.type).shape)
        out = np.array(np.broadcast_to(dest, shape))
        out[(slice(None),) + position] = value
        return out

    def op_vector_to_elements(self, op, operands):
        # Canonicalization's form of "extract every element": one result each, row-major.
        source = np.asarray(operands[0])
        rank = len(ir.VectorType(op.operands[0].type).shape)
        flat = source.reshape(source.shape[:source.ndim - rank] + (-1,))
        return tuple(flat[..., i] for i in range(flat.shape[-1]))

    def op_vector_from_elements(self, op, operands):
        shape = tuple(ir.VectorType(op.result.type).shape)
        elements = np.broadcast_arrays(*[np.asarray(x) for x in operands])
        return np.stack(elements, axis=-1).reshape(elements[0].shape + shape)

    def op_vector_broadcast(self, op, operands):
        # Canonicalization's form of a one-element from_elements, among others: the
        # source's dims align with the result's trailing ones.
        shape = tuple(ir.VectorType(op.result.type).shape)
        source = np.asarray(operands[0])
        rank = (len(ir.VectorType(op.operands[0].type).shape)
                if isinstance(op.operands[0].type, ir.VectorType) else 0)
        lead = source.shape[:source.ndim - rank]
        aligned = source.reshape(lead + (1,) * (len(shape) - rank) + source.shape[len(lead):])
        return np.array(np.broadcast_to(aligned, lead + shape))

    def op_vector_extract_strided_slice(self, op, operands):
        offset = ir.IntegerAttr(ir.ArrayAttr(op.attributes["offsets"])[0]).value
        size = ir.IntegerAttr(ir.ArrayAttr(op.attributes["sizes"])[0]).value
        return operands[0][..., offset:offset + size]

    def op_vector_bitcast(self, op, operands):
        dtype = DTYPES[_element(op.result.type)]
        source = np.ascontiguousarray(operands[0])
        return source.view(dtype)

    def _matrix(self, target, a, b, c):
        waves = self.thread_count // self.wave_size

        def per_wave(x):
            x = np.broadcast_to(x, (self.thread_count,) + x.shape[1:])
            return x.reshape(waves, self.wave_size, -1)

        out = matrix_instruction(target, per_wave(a), per_wave(b), per_wave(c))
        return out.reshape((self.thread_count,) + c.shape[1:])

    def op_nvgpu_mma_sync(self, op, operands):
        shape = tuple(ir.IntegerAttr(d).value for d in ir.ArrayAttr(op.attributes["mmaShape"]))
        kinds = {(16, 8, 32): "cuda", (16, 8, 16): "cuda-bf16"}
        if shape not in kinds:
            raise SimulationError(f"unsupported nvgpu.mma.sync shape {shape}")
        return self._matrix(kinds[shape], *operands)

    def op_llvm_call_intrinsic(self, op, operands):
        name = ir.StringAttr(op.attributes["intrin"]).value
        if name in EXP2_INTRINSICS.values():
            with np.errstate(over="ignore", under="ignore"):
                exp2 = np.exp2(np.asarray(operands[0], np.float32))
            return np.where(exp2 < FLUSHED_BELOW, np.float32(0), exp2)
        if name in RECIPROCAL_INTRINSICS.values():
            return flushed_reciprocal(operands[0])
        if name == BYTE_PERMUTE:
            return byte_permute(*operands)
        if name not in INTRINSICS:
            raise SimulationError(f"unknown intrinsic {name}")
        a, b, c = operands
        as_bytes = lambda x: np.ascontiguousarray(np.broadcast_to(x, (self.thread_count,))).view(np.int8).reshape(-1, 8)
        return self._matrix(INTRINSICS[name], as_bytes(a), as_bytes(b), c)

    def op_amdgpu_mfma(self, op, operands):
        shape = tuple(ir.IntegerAttr(op.attributes[k]).value for k in ("m", "n", "k"))
        try:
            table = table_for("gfx942", shape)
        except KeyError:
            raise SimulationError(f"unsupported amdgpu.mfma shape {shape}") from None
        return self._matrix(table, *operands)
