"""Scale groups: the verifier, contiguous (wrong) W groups on demand, and the error split."""

import re

import numpy as np
import pytest

from conftest import seeded_rng
from int8attn import reference as ref
from int8attn.fragments import fragment_model, format_token_set
from int8attn.driver.graph import attention_graph, decode_graph
from test_cli import run


@pytest.fixture(scope="module")
def decode_4k(tmp_path_factory):
    path = tmp_path_factory.mktemp("graphs") / "decode4k.mlir"
    path.write_text(decode_graph(1, 32, 8, 4096, 128))
    return path


def _max_abs_vs_exact(stdout: str) -> float:
    return float(re.search(r"vs exact f32 reference\s+max abs ([0-9.e+-]+)", stdout).group(1))


def test_contiguous_groups_are_the_logical_runs():
    groups = fragment_model("gfx936").contiguous_groups(64)
    assert [format_token_set(g) for g in groups] == ["{0-31}", "{32-63}"]


def test_contiguous_scales_are_rejected_with_a_located_diagnostic(decode_4k, tmp_path):
    out = tmp_path / "never.vmfb"
    proc = run("int8attn", "compile", decode_4k, "--scale-groups", "contiguous", "-o", out,
               check_rc=1)
    assert re.search(r"decode4k\.mlir:\d+:\d+: error: W scale of group 0 is computed over "
                     r"tokens \{0-31\} but the MMAC consuming its quantized values reads "
                     r"tokens \{0-7,16-23,32-39,48-55\}", proc.stderr), proc.stderr
    assert not out.exists()


def test_no_verify_measures_at_least_ten_times_the_error(decode_4k):
    good = run("int8attn", "run", decode_4k, "--seed", "4", check_rc=0).stdout
    bad = run("int8attn", "run", decode_4k, "--seed", "4", "--scale-groups", "contiguous",
              "--no-verify", check_rc=0).stdout
    good_err, bad_err = _max_abs_vs_exact(good), _max_abs_vs_exact(bad)
    print(f"decode 4K max abs vs exact: fragment groups {good_err:.3e}, "
          f"contiguous groups {bad_err:.3e} ({bad_err / good_err:.1f}x)")
    assert bad_err >= 10 * good_err


@pytest.mark.parametrize("mode, query_tokens, tokens", [("decode", 1, 1000), ("prefill", 37, 300)])
@pytest.mark.parametrize("scale_groups, q_terms, w_quant, w_terms", [
    ("fragment", 1, "s8", 1), ("contiguous", 1, "s8", 1), ("fragment", 2, "u8", 1),
    ("fragment", 1, "u8", 1), ("fragment", 2, "s8", 1), ("fragment", 2, "u8", 2)])
def test_error_split_terms_add_up(mode, query_tokens, tokens, scale_groups, q_terms, w_quant,
                                  w_terms):
    import int8attn

    numerics = ref.Numerics(q_terms=q_terms, w_quant=w_quant, w_terms=w_terms)
    source = attention_graph(1, 8, 2, tokens, 64, mode=mode, query_tokens=query_tokens)
    graph = int8attn.compile(source, scale_groups=scale_groups, verify=False, numerics=numerics)
    info = graph.entry()
    from int8attn.driver.graph import random_inputs

    arrays, floats = random_inputs(info, 17, float_caches=True)
    out = graph(*arrays)
    scale = info.attention.softmax_scale
    split = ref.error_split(*arrays, floats["k"], floats["v"], scale, out,
                            scale_groups=scale_groups, numerics=numerics)
    residual = np.abs(split["total"] - sum(split[t] for t in ref.TERMS))
    slack = ref.rounding_tie_slack(*arrays, scale, numerics=numerics) \
        if scale_groups == "fragment" else 0
    assert (residual <= 5e-5 + slack).all(), residual.max()
    # every term is real: none is zero, the total is not one of them alone (two-term Q
    # leaves ~1e-6 of INT8 Q error here, two-term W ~1e-6 of W rounding)
    for term in ref.TERMS:
        floor = 1e-8 if (term, q_terms) == ("q_quantization", 2) or \
            (term, w_terms) == ("w_quantization", 2) else 1e-5
        assert np.abs(split[term]).max() > floor, term
    if scale_groups == "contiguous":
        assert np.abs(split["w_quantization"]).max() > 5 * np.abs(split["v_cache"]).max()


def test_report_prints_the_split_and_the_pv_table(tmp_path):
    path = tmp_path / "small.mlir"
    path.write_text(decode_graph(1, 8, 2, 1000, 64))
    out = run("int8attn", "run", path, "--seed", "3", "--report", check_rc=0).stdout
    for label in ("INT8 Q (via P)", "K cache (via P)", "V cache", "W quantization",
                  "total - sum of the terms",
                  "| INT8 PV vs BF16 PV |", "| INT8 PV vs f32 PV |"):
        assert label in out, out
    residual = float(re.search(r"total - sum of the terms\s+max abs ([0-9.e+-]+)", out).group(1))
    assert residual < 1e-3


def test_report_follows_the_variant(tmp_path):
    # The split is computed for the module's own contract: with two-term Q the
    # INT8 Q term shrinks (~250x less Q error), with unsigned W the W term ~halves,
    # and the terms still add up to the total.
    path = tmp_path / "small.mlir"
    path.write_text(decode_graph(1, 8, 2, 1000, 64))

    def terms(*flags):
        out = run("int8attn", "run", path, "--seed", "3", "--report", *flags, check_rc=0).stdout
        value = lambda label: float(re.search(re.escape(label) + r"\s+max abs ([0-9.e+-]+)",
                                              out).group(1))
        assert f"q-terms {flags[1]}, w-quant {flags[3]}" in out, out
        assert value("total - sum of the terms") < 1e-3 * value("total (INT8 module - exact)")
        return value("INT8 Q (via P)"), value("W quantization sum eW*Vq")

    q1, w_s8 = terms("--q-terms", "1", "--w-quant", "s8")
    q2, w_u8 = terms("--q-terms", "2", "--w-quant", "u8")
    print(f"INT8 Q term {q1:.2e} -> {q2:.2e}; W term {w_s8:.2e} -> {w_u8:.2e}")
    assert q2 * 20 < q1 and w_u8 < 0.7 * w_s8


def test_report_needs_random_inputs(tmp_path):
    path = tmp_path / "small.mlir"
    path.write_text(decode_graph(1, 4, 4, 40, 16))
    arrays = ref.quantize_cache(seeded_rng(2).standard_normal((1, 4, 40, 16)).astype(np.float32))
    np.savez(tmp_path / "in.npz", arg0=np.ones((1, 4, 16), np.float32), arg1=arrays[0],
             arg2=arrays[1], arg3=arrays[0], arg4=arrays[1])
    proc = run("int8attn", "run", path, "--inputs", tmp_path / "in.npz", "--report", check_rc=2)
    assert "--report needs random inputs" in proc.stderr
