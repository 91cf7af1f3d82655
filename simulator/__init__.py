"""A lane-level simulator for the generated kernels (see `interpreter`)."""

from .decode import simulate_decode, simulate_paged
from .kernel_ir import simulate_kernel_ir
from .interpreter import Machine, SimulationError
from .prefill import simulate_prefill
from .run import run_executable

__all__ = ["Machine", "SimulationError", "run_executable", "simulate_decode", "simulate_kernel_ir",
           "simulate_paged", "simulate_prefill"]
