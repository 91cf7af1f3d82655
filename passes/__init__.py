"""int8attn's passes: one module per pass, registered here by CLI argument.

A pass is a frozen dataclass whose fields are its options; `run(module)`
rewrites the module in place and raises `DiagnosticError` on bad input.
"""

from __future__ import annotations

from int8attn.passes.decode_split_kv import DecodeSplitKV
from int8attn.passes.float_pv import FloatPV
from int8attn.passes.fold_v_scale import FoldVScale
from int8attn.passes.int8_qk import Int8QK
from int8attn.passes.lower_cache_write import LowerCacheWrite
from int8attn.passes.lower_mmac_tiles import LowerMMACTiles
from int8attn.passes.lower_paged_attention import LowerPagedAttention
from int8attn.passes.lower_quantize import LowerQuantize
from int8attn.passes.prefill_online_softmax import PrefillOnlineSoftmax
from int8attn.passes.pv_to_mmac import PVToMMAC
from int8attn.passes.quantize_w_groups import QuantizeWGroups
from int8attn.passes.raise_int8_attention import RaiseInt8Attention
from int8attn.passes.verify_scale_groups import VerifyScaleGroups

PASSES = {cls.argument: cls for cls in (
    RaiseInt8Attention, Int8QK, LowerCacheWrite, LowerPagedAttention, DecodeSplitKV, PrefillOnlineSoftmax, FoldVScale, QuantizeWGroups, FloatPV, PVToMMAC,
    LowerMMACTiles, LowerQuantize, VerifyScaleGroups,
)}

__all__ = ["PASSES"] + [cls.__name__ for cls in PASSES.values()]
