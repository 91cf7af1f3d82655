"""The trained byte-level model through the INT8 cache (examples/byte_model): the CI slice.

A short held-out slice of this Python's standard library, teacher-forced through the
committed weights with an f32 cache and with int8attn's paged cache on the cpu target.
What must hold on real activations: the default numerics stay closer to the f32 cache than
one-term numerics, and contiguous (wrong) W groups are measurably worse than the groups
the fragment model derives. The slice is chosen without randomness (windows spread evenly
over the held-out files), so there is no seed to print.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "byte_model"

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def slice_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("byte-model") / "slice"
    command = [sys.executable, str(EXAMPLE / "evaluate.py"), "--windows", "2",
               "--context", "512", "--batch", "2",
               "--variants", "f32,default,one-term,contiguous-one-term", "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(out.with_suffix(".json").read_text())


def test_the_weights_are_small_and_trained():
    weights = EXAMPLE / "weights"
    assert (weights / "model.safetensors").stat().st_size <= 10 * 2 ** 20
    curve = json.loads((weights / "training.json").read_text())["curve"]
    # an untrained byte model sits near 8 bits per byte
    assert curve[-1]["held_out_bits_per_byte"] < 1.5


def test_the_f32_cache_predicts_the_text(slice_report):
    assert slice_report["variants"]["f32"]["bits_per_byte"] < 2.0


def test_default_numerics_stay_closest_to_the_f32_cache(slice_report):
    v = slice_report["variants"]
    base = v["f32"]["bits_per_byte"]
    # On 1,022 predicted bytes a few near-ties move bits per byte by ~0.2% either way (the
    # full table's 16K bytes hold the 0.1% / 0.5% targets): bound it loosely here,
    # and order the numerics by their divergence from the f32 cache, which is not noisy.
    for name in ("default", "one-term"):
        assert abs(v[name]["bits_per_byte"] / base - 1) < 5e-3, (name, v[name])
    assert v["default"]["kl_mean"] < v["one-term"]["kl_mean"], v
    assert v["default"]["agreement"] >= v["one-term"]["agreement"], v


def test_contiguous_w_groups_are_measurably_worse(slice_report):
    v = slice_report["variants"]
    # the same one-term numerics, only the W groups differ: wrong groups cost several
    # times the divergence from the f32 cache
    assert v["contiguous-one-term"]["kl_mean"] > 3 * v["one-term"]["kl_mean"], v
    assert v["contiguous-one-term"]["agreement"] < v["one-term"]["agreement"], v
