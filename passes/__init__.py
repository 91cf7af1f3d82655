"""int8attn's passes: one module per pass, registered here by CLI argument.

A pass is a frozen dataclass whose fields are its options; `run(module)`
rewrites the module in place and raises `DiagnosticError` on bad input.
"""

from __future__ import annotations

from .decode_split_kv import DecodeSplitKV
from .float_pv import FloatPV
from .fold_v_scale import FoldVScale
from .int8_qk import Int8QK
from .lower_cache_write import LowerCacheWrite
from .lower_mmac_tiles import LowerMMACTiles
from .lower_paged_attention import LowerPagedAttention
from .lower_quantize import LowerQuantize
from .prefill_online_softmax import PrefillOnlineSoftmax
from .pv_to_mmac import PVToMMAC
from .quantize_w_groups import QuantizeWGroups
from .raise_int8_attention import RaiseInt8Attention
from .verify_scale_groups import VerifyScaleGroups

PASSES = {cls.argument: cls for cls in (
    RaiseInt8Attention, Int8QK, LowerCacheWrite, LowerPagedAttention, DecodeSplitKV, PrefillOnlineSoftmax, FoldVScale, QuantizeWGroups, FloatPV, PVToMMAC,
    LowerMMACTiles, LowerQuantize, VerifyScaleGroups,
)}

__all__ = ["PASSES"] + [cls.__name__ for cls in PASSES.values()]
