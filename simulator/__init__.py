"""A lane-level simulator for the generated kernels (see `interpreter`)."""

from int8attn.simulator.decode import simulate_decode, simulate_paged
from int8attn.simulator.kernel_ir import simulate_kernel_ir
from int8attn.simulator.interpreter import Machine, SimulationError
from int8attn.simulator.prefill import simulate_prefill
from int8attn.simulator.run import run_executable

__all__ = ["Machine", "SimulationError", "run_executable", "simulate_decode", "simulate_kernel_ir",
           "simulate_paged", "simulate_prefill"]
