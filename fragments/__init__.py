"""The fragment model: matrix-instruction operand layouts and load schemes as data.

This is the single place where lane, register-slot and token indices are
related to each other. Everything that needs to know which tokens one matrix
instruction consumes -- the W scale groups, the token gathers of the
tensor-level lowering, the verifier and the numpy fragment-level reference --
reads it from a `FragmentModel` here.

Each operand layout is a table `coords[lane, slot] = (row, col)` written from
the ISA lane tables (docs/design.md §3). A `VLoadScheme` says which token
each byte of a lane's V registers holds. Composing the B layout with the load
scheme gives, for every MMAC of a wave, the token behind each of its K slots.

The same model as XOR-linear layouts over named dims (`LinearLayout`, in the
spirit of Triton's): `mma_layouts` holds each instruction's A/B/C operands,
and `k_slot_tokens`, `group_tokens`, `token_set` and `xor_partners` derive the
token groups and shuffle partners by composition and inversion
(docs/design.md §4). The kernels still read the tables and `LaneMap`s; they
move onto the layouts in a later step.
"""

from .instructions import (GFX936_MMAC, GFX942_MFMA, GFX942_MFMA_32X32X16,
                           SM80_MMA_BF16, SM80_MMA_S8, MatrixInstruction,
                           OperandLayout)
from .kernel_layout import DecodeKernelLayout
from .lane_maps import (LaneMap, element_classes, thread_distribution, thread_groups,
                        thread_runs, tile_copies, xor_reduction_offsets)
from .model import (BF16_PV_INSTRUCTIONS, FRAGMENT_MODELS, PV_ATOMS, PVAtomName,
                    SCALE_GROUP_KINDS, W_CHAINS, FragmentModel, FragmentModelName,
                    ScaleGroupKind, VLoadScheme, WChain, bf16_pv_model,
                    format_token_set, fragment_model, pv_model,
                    pv_model_named, pv_model_names)
from .index_rules import (NUMPY_OPS, TEXT_OPS, HeadMajorRows, IndexOps,
                          PackedRows, PackedTerms, TileRing, arith_ops, ceil_div, floor_div)
from .layout_emit import INT_BUILDER, TEXT_BUILDER, CallableBuilder
from .linear_layout import LinearLayout, NotInvertible, NotLinear
from .mma_atoms import ATOMS, WGMMA_S32_N, MmaAtom, mma_atom, wgmma_atom
from .operand_staging import OperandStaging, StagingNotLinear
from .mma_layouts import (MMA_LAYOUTS, MmaLayouts, group_reduction_offsets,
                          group_tokens, k_slot_tokens, mma_layouts,
                          pv_token_layout, register_feed,
                          row_reduction_offsets, score_group_layout,
                          score_layout, token_set, token_slots,
                          v_load_layout, xor_partners)
from .score_feed import ScoreFeed, a_token_layout, score_feed
from .token_axes import (NotADigitPermutation, TokenAxes, TokenAxis,
                         token_axes)

__all__ = [
    "NUMPY_OPS",
    "TEXT_OPS",
    "IndexOps",
    "HeadMajorRows",
    "arith_ops",
    "PackedRows",
    "PackedTerms",
    "TileRing",
    "ceil_div",
    "floor_div",
    "SCALE_GROUP_KINDS",
    "W_CHAINS",
    "WChain",
    "BF16_PV_INSTRUCTIONS",
    "OperandLayout",
    "MatrixInstruction",
    "VLoadScheme",
    "FragmentModel",
    "FragmentModelName",
    "ScaleGroupKind",
    "GFX936_MMAC",
    "GFX942_MFMA",
    "GFX942_MFMA_32X32X16",
    "SM80_MMA_S8",
    "SM80_MMA_BF16",
    "bf16_pv_model",
    "FRAGMENT_MODELS",
    "fragment_model",
    "PV_ATOMS",
    "PVAtomName",
    "pv_model",
    "pv_model_named",
    "pv_model_names",
    "format_token_set",
    "LaneMap",
    "DecodeKernelLayout",
    "OperandStaging",
    "StagingNotLinear",
    "xor_reduction_offsets",
    "element_classes",
    "thread_distribution",
    "thread_groups",
    "thread_runs",
    "tile_copies",
    "ScoreFeed",
    "score_feed",
    "a_token_layout",
    "TokenAxis",
    "TokenAxes",
    "NotADigitPermutation",
    "token_axes",
    "LinearLayout",
    "NotLinear",
    "NotInvertible",
    "MmaAtom",
    "ATOMS",
    "mma_atom",
    "wgmma_atom",
    "WGMMA_S32_N",
    "CallableBuilder",
    "INT_BUILDER",
    "TEXT_BUILDER",
    "MmaLayouts",
    "MMA_LAYOUTS",
    "mma_layouts",
    "v_load_layout",
    "register_feed",
    "pv_token_layout",
    "k_slot_tokens",
    "group_tokens",
    "token_slots",
    "token_set",
    "score_layout",
    "score_group_layout",
    "xor_partners",
    "row_reduction_offsets",
    "group_reduction_offsets",
]
