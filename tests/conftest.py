"""Shared fixtures: a private module cache, seeded inputs, compiled decode graphs."""

from __future__ import annotations

import os
import sys
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

from int8attn.contract.numerics import ONE_TERM_NUMERICS  # noqa: F401  (the tests' name for it)

import fast_tier

_GUARD = pytest.StashKey[list]()    # [site folder, saved PYTHONPATH, hits.log offset read]

REPO = Path(__file__).resolve().parent.parent

# Property-based tests: `quick` runs in CI (fixed, derandomized examples);
# `long` (--hypothesis-profile=long) draws >= 10,000 fresh cases on demand.
_FUZZ = dict(deadline=None, print_blob=True,
             suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("quick", max_examples=30, derandomize=True, **_FUZZ)
settings.register_profile("long", max_examples=10_000, **_FUZZ)
settings.load_profile("quick")


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory):
    """Compiled modules go to a per-session cache, never the user's."""
    os.environ["INT8ATTN_CACHE_DIR"] = str(tmp_path_factory.mktemp("int8attn-cache"))
    yield


@pytest.fixture(autouse=True, scope="session")
def _private_temp_dir(tmp_path_factory):
    """Reproducer folders (int8attn-repro-*) that tests provoke land in pytest's own
    temporary tree, in this process and in the commands it starts; the system temp
    dir must gain none."""
    import tempfile

    system = Path(tempfile.gettempdir())
    before = set(system.glob("int8attn-repro-*"))
    private = tmp_path_factory.mktemp("tmp")
    saved = tempfile.tempdir, os.environ.get("TMPDIR")
    tempfile.tempdir = str(private)
    os.environ["TMPDIR"] = str(private)
    yield
    tempfile.tempdir = saved[0]
    if saved[1] is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = saved[1]
    leaked = set(system.glob("int8attn-repro-*")) - before
    assert not leaked, f"tests left reproducer folders in {system}: {sorted(leaked)}"


def seeded_rng(seed: int) -> np.random.Generator:
    print(f"random inputs: numpy default_rng seed {seed}", file=sys.stderr)
    return np.random.default_rng(seed)


_ELEMENTS = {np.dtype(np.float32): "f32", np.dtype(np.int8): "i8", np.dtype(np.int32): "i32"}


def simulate_workgroup(name: str, arrays: list[np.ndarray], threads: int, body) -> None:
    """One workgroup of `threads` threads (one wave) in the lane simulator, its kernel
    `name` built by `body(lanes, views)`: one binding per array of `arrays`, viewed in
    its shape and element type; the arrays are read and written in place."""
    from iree.compiler import ir
    from iree.compiler.dialects import func

    from int8attn.kernels.lanes import Lanes, binding
    from int8attn.simulator.interpreter import Machine
    from int8attn.support.ir import new_context

    with new_context() as context, ir.Location.unknown():
        context.allow_unregistered_dialects = True
        module = ir.Module.create()
        with ir.InsertionPoint(module.body):
            binding_type = ir.Type.parse("!stream.binding")
            kernel = func.FuncOp(name, ir.FunctionType.get([binding_type] * len(arrays), []))
            with ir.InsertionPoint(kernel.add_entry_block()):
                lanes = Lanes(threads, threads)
                zero = lanes.index(0)
                body(lanes, [binding(argument, array.shape, _ELEMENTS[array.dtype], zero)
                             for argument, array in zip(kernel.arguments, arrays)])
                func.ReturnOp([])
        Machine(kernel.operation, list(arrays), (1, 1, 1), threads, threads).run()


def first_loop_body(text: str) -> str:
    """The printed body of a module's first scf.for: from its `{` to the matching `}`
    (the branches and loops nested in it included)."""
    start = text.index("{", text.index("scf.for"))
    depth = 0
    for end in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[end], 0)
        if depth == 0:
            return text[start:end + 1]
    raise ValueError("unbalanced braces after scf.for")


@lru_cache(maxsize=None)
def compiled_decode(batch, q_heads, kv_heads, tokens, head_dim, pv="int8",
                    numerics=ONE_TERM_NUMERICS):
    """`numerics` (a Numerics) default to one-term numerics (ONE_TERM_NUMERICS: one-term Q,
    s8 W in one term), which the files using this helper pass to the references too;
    test_numerics.py also tests the pipeline's defaults (`Numerics()`)."""
    import int8attn
    from int8attn.driver.graph import decode_graph

    source = decode_graph(batch, q_heads, kv_heads, tokens, head_dim)
    return int8attn.compile(source, filename=f"decode_{tokens}.mlir", pv=pv, cache=False,
                            numerics=numerics)


@lru_cache(maxsize=None)
def compiled_attention(mode, shape, pv="int8"):
    """shape = (B, Hq, Hkv, S, Sq, D); Sq is ignored for decode. The pipeline's default
    numerics (accuracy.check_against_references follows them)."""
    import int8attn
    from int8attn.driver.graph import attention_graph

    batch, q_heads, kv_heads, tokens, query_tokens, head_dim = shape
    source = attention_graph(batch, q_heads, kv_heads, tokens, head_dim, mode=mode,
                             query_tokens=query_tokens)
    return int8attn.compile(source, filename=f"{mode}.mlir", pv=pv, cache=False)


def decode_inputs(seed, batch, q_heads, kv_heads, tokens, head_dim):
    from int8attn.reference import quantize_cache

    rng = seeded_rng(seed)
    q = rng.standard_normal((batch, q_heads, head_dim)).astype(np.float32)
    k, k_scale = quantize_cache(rng.standard_normal((batch, kv_heads, tokens, head_dim)).astype(np.float32))
    v, v_scale = quantize_cache(rng.standard_normal((batch, kv_heads, tokens, head_dim)).astype(np.float32))
    return q, k, k_scale, v, v_scale


# The x86-64 levels the cpu-target tests compile for beside `host`, with the
# register file IREE sizes vector tiles by on each (support/cpu_vectors.py).
# A level this machine cannot execute is compiled but not run (skipped).
X86_LEVELS = {"x86-64": "sse", "x86-64-v3": "avx", "x86-64-v4": "avx512"}


def runnable_here(target_cpu: str) -> bool:
    """Whether this machine can execute code compiled for `target_cpu`."""
    from int8attn.driver.cpu_target import UnknownTargetCPU, check_runnable_here, resolve

    if not resolve("host").triple.startswith("x86_64") and target_cpu != "host":
        return False
    try:
        check_runnable_here(resolve(target_cpu))
    except UnknownTargetCPU:
        return False
    return True


def require_runnable(target_cpu: str) -> None:
    if not runnable_here(target_cpu):
        pytest.skip(f"this machine cannot execute --target-cpu {target_cpu} code")


# The slow tier: files whose tests compile and run full-size modules on IREE or
# through the lane simulator (numerics at 4K-16K tokens, every lowering form and
# CPU level, the kernel targets, the fuzzer's compiled cases), and the slowest
# tests of the other files. `pytest -m "not slow"` runs the rest: the error paths
# of every surface, the IR tests (lit), the references, the fragment model, the
# CPU-level rule and the CLIs' everyday paths.
SLOW_FILES = {
    "test_mmac_lowering.py", "test_fuzz.py", "test_numerics.py", "test_prefill.py",
    "test_scale_groups.py", "test_w_terms.py", "test_q_terms.py", "test_w_quant.py",
    "test_edge_cases.py", "test_onnx_import.py", "test_onnx_cli.py", "test_kernels.py",
    "test_prefill_kernels.py", "test_paged_kernels.py", "test_targets.py", "test_cuda.py",
    "test_paged.py", "test_paged_prefill.py", "test_paged_decode_loop.py",
    "test_stage_errors.py", "test_key_bias.py", "test_paged_cpu_agreement.py",
    "test_byte_model.py", "test_cpu_int8_dot.py",
}
SLOW_TESTS = {
    "test_cpu_levels.py::test_each_level_meets_both_references",
    "test_cli.py::test_inputs_that_are_not_an_npz_of_arrays",
    "test_cli.py::test_several_public_functions_need_function",
    "test_cpu_bench.py::test_quick_run_end_to_end",
    "test_cpu_bench.py::test_a_wrong_output_is_not_timed",
}


# The fast tier (`pytest -m fast`, marker `fast`): tests that need neither IREE
# compilation (no iree-compile, not even the CPU probe; no vmfb) nor the lane
# simulator: numpy, the references, the fragment model, IR built and checked in
# Python, the error paths caught before anything compiles. Decided per test under
# the guard: while a run selects the tier, fast_tier.py makes compiling or simulating
# fail the test ("mark it slow or unmark fast"); `INT8ATTN_FAST_TIER_GUARD=1 pytest
# tests/test_x.py` runs a file under the guard to show which of its tests qualify.
# A test qualifies as a whole (every parameter). Kept out although they qualify, so
# that the tier stays well under 2 minutes on a loaded 2-core machine: tests that
# start commands (int8attn, int8attn-opt, python; ~1-3 s of interpreter and imports
# each), the lit suite above all (test_lit.py, ~1-1.5 minutes of int8attn-opt runs);
# the one exception is test_fast_tier.py's guarded run, the tier's own check.
# The `slow` mark stays per file, so the fast tests of slow files run in `-m fast`
# and in the whole suite, not in `-m "not slow"`.
# FAST_FILES: every test of the file is fast. FAST_TESTS: file -> its fast test
# functions. A file or name that does not exist is an error.
FAST_FILES = {
    "test_attention_match.py", "test_bench_harness.py", "test_cache_layout.py",
    "test_dialect_ops.py", "test_digits.py", "test_fragments.py", "test_index_arithmetic.py", "test_layout.py",
    "test_linear_layout.py", "test_mma_atoms.py", "test_reference.py", "test_reference_chunks.py",
    "test_score_feed.py", "test_fixed_p_scale.py", "test_cli_output_safety.py",
    "test_pass_defaults.py", "test_results_current.py", "test_no_history_in_code.py",
    "test_doc_tables.py",
}
FAST_TESTS = {
    "test_bad_inputs.py": {"test_misuse_is_a_usage_error"},
    "test_cache_write_kernels.py": {"test_cache_write_kernel_refuses_what_it_cannot_do"},
    "test_cli_bad_inputs.py": {
        "test_an_output_that_cannot_be_a_file_is_refused_first",
        "test_bench_bad_paths_are_named_before_any_work",
        "test_bench_from_a_good_folder_gets_past_the_checks",
        "test_bench_misuse_is_a_usage_error_before_any_work",
        "test_bench_from_refuses_the_flags_its_modules_fix",
        "test_bench_from_takes_the_run_time_flags_and_passes_the_seed"},
    "test_pv_chain.py": {"test_fma_f32_rounds_once", "test_fma_f32_special_values"},
    "test_cpu_bench.py": {"test_a_kernel_off_by_a_little_is_caught",
                          "test_bad_flags_are_named", "test_l3_size_text"},
    "test_early_refusals.py": {
        "test_a_gpu_target_without_its_gpu_is_refused_before_compiling",
        "test_a_code_object_without_a_gpu_is_refused_before_compiling",
        "test_a_present_gpu_gets_past_the_check", "test_the_driver_says_why_it_has_no_device",
        "test_this_machines_answer_refuses_before_compiling",
        "test_a_cache_of_impossible_sizes_is_refused_when_built",
        "test_numpy_integer_sizes_are_sizes",
        "test_a_cache_the_graph_does_not_take_is_refused_by_the_decoder",
        "test_a_decoder_needs_paged_functions"},
    "test_kv_ring.py": {"test_the_copies_cover_every_chunk_once_per_slot",
                        "test_a_split_that_is_not_linear_is_refused",
                        "test_the_ring_rule_turns_stages_and_stops_at_the_last_tile",
                        "test_the_bank_model_counts_wavefronts",
                        "test_the_swizzle_is_derived_from_the_k_loads",
                        "test_the_variants_command_refuses_what_is_no_prefill_choice"},
    "test_ptx_mix.py": {"test_the_counting_reads_opcodes_loops_and_classes",
                        "test_a_loop_is_one_region_however_many_branches_go_back",
                        "test_the_command_refuses_unknown_kernels",
                        "test_the_numerics_are_named_as_int8attn_bench_names_them"},
    "test_sass_mix.py": {"test_the_listing_reads_instructions_loops_and_classes",
                         "test_the_command_refuses_unknown_kernels",
                         "test_the_spec_changes_take_bool_and_int_fields_only"},
    # the extraction and its checks; the examples themselves compile (slow ones marked
    # per block, `<!-- example: slow -->`)
    "test_doc_examples.py": {
        "test_blocks_and_markers_are_found_with_their_lines", "test_a_fence_left_open_is_named",
        "test_shown_output_matches_numbers_aside_and_nothing_else",
        "test_every_page_has_runnable_examples_and_markers_are_known",
        "test_a_failing_block_is_named_by_file_and_line"},
    "test_fast_tier.py": {
        "test_the_guard_fails_fast_tests_that_compile_or_simulate",
        "test_the_guard_is_on_when_the_marks_select_only_fast_tests",
        "test_the_guard_knows_an_iree_tool_from_its_command"},
    "test_mfma_32x32.py": {
        "test_the_atom_is_registered_beside_the_targets_own_model",
        "test_the_tables_are_the_vendors_formulas",
        "test_the_simulators_table_is_found_by_target_and_shape",
        "test_the_fragment_tables_agree_with_the_simulators_isa_table",
        "test_one_mma_through_the_isa_table_equals_the_fragment_model_matmul",
        "test_the_linear_layouts_reproduce_the_tables",
        "test_the_v_load_layout_follows_the_16_byte_loads",
        "test_the_derived_token_groups_are_the_four_sets",
        "test_each_set_is_what_one_mma_consumes",
        "test_the_fragment_reference_on_the_atom_matches_the_exact_reference",
        "test_the_verifier_proves_the_atoms_groups"},
    "test_pv_atom_kernels.py": {"test_the_target_spec_offers_the_atom"},
    "test_serving.py": {"test_torch_ops_trace_under_fake_tensors"},
    "test_transformers_attention.py": {"test_bad_setups_are_named"},
    # in slow files
    "test_key_bias.py": {"test_subtracting_a_channel_bias_is_exact_for_attention"},
    "test_kernels.py": {"test_isa_tables_agree_with_the_fragment_model"},
    "test_mmac_lowering.py": {
        "test_token_axes_merge_runs_and_keep_odd_factors",
        "test_token_axes_of_gfx936_partition", "test_token_axes_rebuild_the_fragment_groups",
        "test_token_axes_refuse_tables_that_are_no_digit_permutation"},
    "test_paged_kernels.py": {
        "test_a_merge_split_the_kernel_cannot_run_is_refused",
        "test_the_cuda_occupancy_hint_follows_the_head_dim",
        "test_the_kernel_refuses_a_block_size_the_v_loads_straddle",
        "test_v_async_is_refused_where_there_is_no_async_copy"},
    "test_prefill_kernels.py": {
        "test_bench_counts_the_causal_pairs", "test_query_tokens_past_the_sequence_are_refused"},
    "test_scale_groups.py": {"test_contiguous_groups_are_the_logical_runs"},
    "test_targets.py": {
        "test_an_option_that_does_not_apply_is_refused_with_the_reason",
        "test_defaults_that_equal_the_kernels_own_are_accepted",
        "test_kernel_limits_are_located_errors", "test_targets_command_prints_the_table",
        "test_the_cache_key_covers_every_option",
        "test_the_cache_key_covers_every_source_file_recursively",
        "test_the_table_has_every_target_and_each_chain_starts_at_the_graph",
        "test_written_files_get_the_mode_a_plain_write_gives"},
    "test_w_quant.py": {"test_unsigned_rule_on_one_group"},
    "test_w_terms.py": {"test_two_term_rule_on_a_peaked_group",
                        "test_two_term_w_keeps_nan_zero_and_tiny_groups_to_themselves"},
}


def pytest_configure(config):
    if (fast_tier.requires_fast(config.getoption("markexpr") or "")
            or os.environ.get(fast_tier.FORCE_VARIABLE) == "1"):
        import tempfile

        site = Path(tempfile.mkdtemp(prefix=fast_tier.SITE_PREFIX))
        log = site / "hits.log"
        log.touch()
        config.stash[_GUARD] = [site, os.environ.get("PYTHONPATH"), 0]
        os.environ["PYTHONPATH"] = fast_tier.write_site(site, log)
        fast_tier.install(str(log))


def pytest_unconfigure(config):
    if _GUARD in config.stash:
        import shutil

        site, pythonpath, _ = config.stash[_GUARD]
        shutil.rmtree(site, ignore_errors=True)
        if pythonpath is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = pythonpath


def pytest_report_header(config):
    if _GUARD in config.stash:
        return "fast-tier guard on: compiling or simulating fails the test (tests/fast_tier.py)"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under the guard: a test whose phase compiled or simulated (here or in a
    command it started) fails, even if it caught the error."""
    report = (yield).get_result()
    state = item.config.stash.get(_GUARD, None)
    if state is not None:
        with open(state[0] / "hits.log") as f:
            f.seek(state[2])
            hits = f.read()
            state[2] = f.tell()
        if hits:
            # a command that lit started does not know the test: this one started it
            hits = hits.replace("fast-tier test ? ", f"fast-tier test {item.nodeid} ")
            if report.passed or report.skipped:
                report.outcome = "failed"
                report.longrepr = hits
            else:
                report.sections.append(("fast-tier guard", hits))


def _defines(module, name: str) -> bool:
    return hasattr(module, name) or any(
        isinstance(v, type) and hasattr(v, name) for v in vars(module).values())


def pytest_collection_modifyitems(config, items):
    modules = {}
    for item in items:
        file = item.path.name
        test = f"{file}::{item.originalname}"
        if file in SLOW_FILES or test in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)
        if file in FAST_FILES or item.originalname in FAST_TESTS.get(file, ()):
            item.add_marker(pytest.mark.fast)
        if getattr(item, "module", None) is not None:
            modules[file] = item.module
    here = Path(__file__).parent
    stale = [f for f in sorted(FAST_FILES | set(FAST_TESTS)) if not (here / f).is_file()]
    stale += [f"{file}::{name}" for file, names in FAST_TESTS.items() if file in modules
              for name in sorted(names) if not _defines(modules[file], name)]
    if stale:
        raise pytest.UsageError(f"tests/conftest.py FAST_FILES / FAST_TESTS name files or "
                                f"tests that do not exist: {stale}")
