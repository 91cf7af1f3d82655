"""What `int8attn run` and the paged decoder can tell before any compile or call.

A graph of several public functions run without --function (or with one it does
not have), and a GPU target run on a machine without that GPU, are refused from
the graph stage (parse and verify, nothing compiled) and the HAL driver's answer;
a PagedCache of impossible sizes, or one whose sizes are not the graph's, is
refused when it is built, not at the first prefill. Each test fails if the full
compile starts (`no_compile`); under `pytest -m fast` the fast tier's guard also
fails any IREE compile.
"""

import numpy as np
import pytest

from int8attn import api, cli
from int8attn.driver import devices
from int8attn.driver.compile import compile as compile_stages
from int8attn.driver.graph import decode_graph
from int8attn.driver.options import CompileOptions
from int8attn.driver.paged_decode import PagedCache, PagedDecoder, paged_decode_graph
from int8attn.runtime.module import InputError


class Compiled(Exception):
    """The full compile started."""


@pytest.fixture()
def no_compile(monkeypatch):
    """api.compile's stages raise Compiled: a refusal must come before them."""
    def compiled(*args, **kwargs):
        raise Compiled("the graph was compiled before the refusal")

    monkeypatch.setattr(api, "compile_stages", compiled)


@pytest.fixture()
def two_functions(tmp_path):
    text = decode_graph(1, 4, 4, 40, 16, name="a").strip()
    text = text[:text.rindex("}")] + decode_graph(1, 4, 4, 40, 16,
                                                  name="b").split("module {", 1)[1]
    path = tmp_path / "two.mlir"
    path.write_text(text)
    return path


@pytest.fixture()
def one_function(tmp_path):
    path = tmp_path / "decode.mlir"
    path.write_text(decode_graph(1, 4, 4, 40, 16))
    return path


def test_several_functions_without_function_are_refused_before_compiling(
        two_functions, no_compile, tmp_path, capsys):
    assert cli.main(["run", str(two_functions), "--seed", "0"]) == 2
    assert "the module has 2 public functions (@a, @b); choose one with --function" in \
        capsys.readouterr().err
    assert cli.main(["run", str(two_functions), "--function", "c", "--seed", "0"]) == 2
    assert "no public function @c; the module has @a, @b" in capsys.readouterr().err
    # with given inputs too (no memory check of random inputs to make the graph stage run)
    inputs = tmp_path / "in.npz"
    np.savez(inputs, arg0=np.zeros(1))
    assert cli.main(["run", str(two_functions), "--inputs", str(inputs)]) == 2
    assert "choose one with --function" in capsys.readouterr().err
    # a named function gets past the check, to the compile (not the module cache, which
    # an earlier test of the same graph may have filled)
    with pytest.raises(Compiled):
        cli.main(["run", str(two_functions), "--function", "b", "--seed", "0", "--no-cache"])


@pytest.mark.parametrize("target, driver", [("cuda", "cuda"), ("gfx942", "hip")])
def test_a_gpu_target_without_its_gpu_is_refused_before_compiling(
        target, driver, one_function, no_compile, monkeypatch, capsys):
    asked = []
    monkeypatch.setattr(devices, "missing_device",
                        lambda name: asked.append(name) or f"no {name} GPU in this test")
    assert cli.main(["run", str(one_function), "--target", target, "--seed", "0"]) == 2
    err = capsys.readouterr().err
    assert (f"--target {target} runs its module on IREE's {driver} driver, and no {driver} "
            f"device is present here (no {driver} GPU in this test)") in err
    assert "--simulate" in err and f"int8attn compile {one_function} --target {target}" in err
    assert asked == [driver]
    # the lane simulator needs no GPU: no question asked, on to the compile
    with pytest.raises(Compiled):
        cli.main(["run", str(one_function), "--target", target, "--simulate", "--seed", "0",
                  "--no-cache"])
    assert asked == [driver]


def test_a_code_object_without_a_gpu_is_refused_before_compiling(
        one_function, no_compile, monkeypatch, capsys):
    monkeypatch.setattr(devices, "missing_device", lambda name: "no GPU in this test")
    assert cli.main(["run", str(one_function), "--target", "gfx936", "--kernel-object",
                     "k.co", "--seed", "0"]) == 2
    err = capsys.readouterr().err
    assert "IREE's hip driver, and no hip device is present here" in err
    assert "--kernel-object k.co -o module.vmfb" in err and "--simulate" not in err


def test_a_present_gpu_gets_past_the_check(one_function, no_compile, monkeypatch):
    monkeypatch.setattr(devices, "missing_device", lambda name: None)
    with pytest.raises(Compiled):
        cli.main(["run", str(one_function), "--target", "cuda", "--seed", "0", "--no-cache"])


def test_the_driver_says_why_it_has_no_device(monkeypatch):
    import iree.runtime as rt

    class Driver:
        def __init__(self, devices):
            self.devices = devices

        def query_available_devices(self):
            return self.devices

    def no_library(name):
        raise RuntimeError(
            "Error creating driver: c/runtime/src/iree/hal/drivers/cuda/cuda_dynamic_symbols"
            ".c:66: UNAVAILABLE; CUDA driver library 'libcuda.so'/'nvcuda.dll' not available; "
            "please ensure installed and in dynamic library search path")

    monkeypatch.setattr(rt, "get_driver", no_library)
    assert devices.missing_device("cuda") == \
        "CUDA driver library 'libcuda.so'/'nvcuda.dll' not available"
    assert devices.missing_device("local-task") is None     # the CPU is always here
    monkeypatch.setattr(rt, "get_driver", lambda name: Driver([]))
    assert devices.missing_device("hip") == "IREE's hip driver finds no device"
    monkeypatch.setattr(rt, "get_driver", lambda name: Driver([{"device_id": 0}]))
    assert devices.missing_device("hip") is None


def test_this_machines_answer_refuses_before_compiling(one_function, no_compile, capsys):
    if devices.missing_device("cuda") is None:
        pytest.skip("this machine has a CUDA device")
    assert cli.main(["run", str(one_function), "--target", "cuda", "--seed", "0"]) == 2
    assert "no cuda device is present here" in capsys.readouterr().err


HKV, BS, D = 2, 16, 64


@pytest.fixture(scope="module")
def decode_functions():
    """A @write / @attend graph as the decoder sees it, from the graph stage alone."""
    # (target cuda: its graph stage asks IREE nothing about this machine's CPU)
    stage = compile_stages(paged_decode_graph(4, HKV, D, BS), CompileOptions(target="cuda"),
                           until="graph")
    return api.CompiledGraph(stage.functions, CompileOptions())


@pytest.mark.parametrize("sizes, message", [
    (dict(blocks=0), r"PagedCache blocks must be a positive integer \(a pool of no blocks "
                     r"holds no token\), got 0"),
    (dict(blocks=-3), "PagedCache blocks must be a positive integer .*, got -3"),
    (dict(blocks=2.5), r"PagedCache blocks must be a positive integer, got 2.5 \(float\)"),
    (dict(block_size=0), "PagedCache block_size must be a positive integer"),
    (dict(head_dim=True), r"PagedCache head_dim must be a positive integer, got True \(bool\)"),
    (dict(kv_heads="2"), r"PagedCache kv_heads must be a positive integer, got '2' \(str\)"),
])
def test_a_cache_of_impossible_sizes_is_refused_when_built(sizes, message):
    with pytest.raises(InputError, match=message):
        PagedCache(**{**dict(blocks=8, kv_heads=HKV, block_size=BS, head_dim=D), **sizes})


def test_numpy_integer_sizes_are_sizes():
    cache = PagedCache(np.int64(4), np.int32(HKV), np.int64(BS), np.int16(D))
    assert cache.k_cache.shape == (4, HKV, BS, D) and cache.block_size == BS


@pytest.mark.parametrize("name, value", [("head_dim", 128), ("block_size", 32),
                                         ("kv_heads", 4)])
def test_a_cache_the_graph_does_not_take_is_refused_by_the_decoder(decode_functions, name,
                                                                  value):
    sizes = {**dict(blocks=8, kv_heads=HKV, block_size=BS, head_dim=D), name: value}
    takes = dict(kv_heads=HKV, block_size=BS, head_dim=D)[name]
    with pytest.raises(InputError, match=rf"PagedDecoder: the cache's {name} is {value} but "
                                         rf"@write takes {name} {takes} \(its k_cache is "
                                         rf"tensor<\?x{HKV}x{BS}x{D}xi8>\): build the cache "
                                         rf"with PagedCache\(\.\.\., {name}={takes}\), or the "
                                         rf"graph with paged_decode_graph\(\.\.\., "
                                         rf"{name}={value}\)"):
        PagedDecoder(decode_functions, PagedCache(**sizes))
    PagedDecoder(decode_functions, PagedCache(8, HKV, BS, D))      # the graph's sizes


def test_a_decoder_needs_paged_functions(decode_functions):
    with pytest.raises(InputError, match="no public function @step"):
        PagedDecoder(decode_functions, PagedCache(8, HKV, BS, D), attend="step")
    stage = compile_stages(decode_graph(1, 4, 2, 40, 16, name="attend"),
                           CompileOptions(target="cuda"),
                           until="graph")
    dense = api.CompiledGraph({**decode_functions.functions, **stage.functions},
                              CompileOptions())
    with pytest.raises(InputError, match="@attend returns no int8attn.cache_write or "
                                         "paged_attention of its arguments"):
        PagedDecoder(dense, PagedCache(8, HKV, BS, D))
