"""The lane simulator's semantics of an MMA atom (fragments/mma_atoms.py).

An atom names its model in `semantics`; the models are written from the ISA text
apart from fragments/ (simulator/isa.py, simulator/wgmma.py), so running an atom
through them checks the layouts it distributes operands with.
"""

from __future__ import annotations

from .isa import matrix_instruction
from .wgmma import wgmma_m64nNk32


def simulate_atom(atom, *operands):
    """D of one instruction: for ("isa", key), matrix_instruction(key, a, b, c) on
    [waves, lanes, slots] operands; for ("wgmma", ...), wgmma_m64nNk32(n, c, b, a)
    of one warpgroup (b, and a in the SS form: shared-memory bytes and descriptor)."""
    kind, key = atom.semantics
    if kind == "isa":
        return matrix_instruction(key, *operands)
    if kind == "wgmma":
        return wgmma_m64nNk32(atom.n, *operands, a_type=atom.types[0], b_type=atom.types[1])
    raise ValueError(f"{atom.name}: no simulator model '{kind}'")
