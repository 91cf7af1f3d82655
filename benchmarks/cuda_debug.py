"""Check each decode kernel alone on a GPU against the lane simulator's partials.

    python benchmarks/cuda_debug.py --prepare DIR     (here: vmfb + inputs + simulated partials)
    python benchmarks/cuda_debug.py --run DIR         (on the GPU machine)
"""

import argparse
import json
from pathlib import Path

import numpy as np

SHAPE = dict(batch=1, q_heads=8, kv_heads=2, tokens=512, head_dim=128)


def prepare(directory: Path):
    from iree.compiler import ir

    from int8attn.fragments import fragment_model
    from int8attn.kernels.decode import MERGE_KERNEL, PARTITION_KERNEL, ROWS, DecodeShape, build_decode_kernels
    from int8attn.kernels.host import build_kernel_entries
    from int8attn.driver.stages import iree_compile
    from int8attn.driver.targets import TARGETS
    from int8attn.reference import quantize_cache
    from int8attn.simulator.decode import host_buffers
    from int8attn.simulator.run import run_executable
    from int8attn.support.ir import new_context

    directory.mkdir(parents=True, exist_ok=True)
    b, hq, hkv, s, dim = (SHAPE[k] for k in ("batch", "q_heads", "kv_heads", "tokens", "head_dim"))
    rng = np.random.default_rng(5)
    q = rng.standard_normal((b, hq, dim)).astype(np.float32)
    k, ks = quantize_cache(rng.standard_normal((b, hkv, s, dim)).astype(np.float32))
    v, vs = quantize_cache(rng.standard_normal((b, hkv, s, dim)).astype(np.float32))
    with new_context(), ir.Location.unknown():
        kernels = build_decode_kernels(DecodeShape(b, hkv, hq // hkv, s, dim, dim ** -0.5),
                                       fragment_model("cuda"), "cuda")
        inputs = host_buffers(q, k, ks, v, vs, kernels.padded_tokens)
        parts = (b, hkv, kernels.partitions, ROWS)
        o, m, l = np.zeros(parts + (dim,), np.float32), np.zeros(parts, np.float32), np.zeros(parts, np.float32)
        run_executable(kernels.module, PARTITION_KERNEL, inputs + [o, m, l])
        out = np.zeros((b, hkv, ROWS, dim), np.float32)
        run_executable(kernels.module, MERGE_KERNEL, [o, m, l, out])
        with ir.InsertionPoint(kernels.module.regions[0].blocks[0]):
            build_kernel_entries(kernels)
        text = str(kernels.module)
    vmfb, ptx = iree_compile(text, TARGETS["cuda"])
    (directory / "kernels.vmfb").write_bytes(vmfb)
    (directory / "kernels.ptx").write_text(ptx)
    np.savez(directory / "data.npz", *inputs, o=o, m=m, l=l, out=out)
    print("prepared", len(vmfb))


def run(directory: Path):
    import iree.runtime as rt

    data = np.load(directory / "data.npz")
    inputs = [data[f"arr_{i}"] for i in range(6)]
    config = rt.Config("cuda")
    ctx = rt.SystemContext(config=config)
    ctx.add_vm_module(rt.VmModule.copy_buffer(ctx.instance, (directory / "kernels.vmfb").read_bytes()))
    args = [rt.asdevicearray(config.device, a) for a in inputs]
    o, m, l = [r.to_host() for r in ctx.modules.module["partition"](*args)]
    report = {}
    for name, got in (("m", m), ("l", l), ("o", o)):
        want = data[name]
        err = np.abs(got - want)
        report[name] = dict(max_abs=float(np.nanmax(err)), nan=int(np.isnan(got).sum()),
                            worst=[int(i) for i in np.unravel_index(np.nanargmax(err), err.shape)])
    merged = ctx.modules.module["merge"](*[rt.asdevicearray(config.device, data[n]) for n in "oml"]).to_host()
    report["merge_max_abs"] = float(np.abs(merged - data["out"]).max())
    print(json.dumps(report, indent=1))
    print("m got/want row 0..5 of [0,0,0]:", m[0, 0, 0, :6], data["m"][0, 0, 0, :6])
    print("l got/want:", l[0, 0, 0, :6], data["l"][0, 0, 0, :6])
    print("o got/want:", o[0, 0, 0, 0, :6], data["o"][0, 0, 0, 0, :6])


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--prepare", type=Path)
    parser.add_argument("--run", type=Path)
    a = parser.parse_args()
    if a.prepare:
        prepare(a.prepare)
    if a.run:
        run(a.run)
