"""Lane-level GPU kernels generated from a target's fragment model."""
