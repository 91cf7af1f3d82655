"""How far the hardware's rcp.approx.ftz.f32 is from 1/x, for every x that
`contract.levels_over` gives it (an NVIDIA GPU, torch and triton).

    python benchmarks/rcp_approx_ulps.py [--low-exponent -118] [--high-exponent 64] [--out FILE.json]

`levels_over` (contract/elementary.py) is bitwise the checked division for every first
reciprocal y0 within one ulp of RN(1/x) (tests/test_levels_over.py, on an emulation);
this checks that premise on the hardware, for every f32 x in [2^low, 2^high): the
quantizable W absmax after its scaling (a >= 2^64 is scaled by 2^-64, so x stays below
2^64). Each y0 comes from the instruction itself (triton's inline PTX) and is compared
with 1/x in f64 rounded to f32 (exact: a quotient rounded twice is rounded once when
the wider format has 2p + 2 bits), as a distance in ulps (the bits' difference: x > 0).
Prints the distance histogram; exit status 1 if any distance exceeds one ulp.
"""

from __future__ import annotations

import argparse
import json
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/rcp_approx_ulps.py")
    parser.add_argument("--low-exponent", type=int, default=-118)
    parser.add_argument("--high-exponent", type=int, default=64)
    parser.add_argument("--chunk-bits", type=int, default=26, help="values per launch: 2^N")
    parser.add_argument("--out", help="also write the histogram as JSON")
    args = parser.parse_args(argv)
    if not -126 <= args.low_exponent < args.high_exponent <= 127:
        parser.error("the exponents must satisfy -126 <= low < high <= 127 (normal x)")

    try:
        import torch
        import triton
        import triton.language as tl
    except ImportError as error:
        print(f"rcp_approx_ulps needs torch and triton with a CUDA GPU: {error}",
              file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("rcp_approx_ulps needs a CUDA GPU: torch sees none", file=sys.stderr)
        return 2

    @triton.jit
    def reciprocal(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        x = tl.load(x_ptr + offsets, mask=mask, other=1.0)
        y = tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=f,f", [x],
                                      dtype=tl.float32, is_pure=True, pack=1)
        tl.store(y_ptr + offsets, y, mask=mask)

    first = (args.low_exponent + 127) << 23
    last = (args.high_exponent + 127) << 23           # exclusive
    chunk = 1 << args.chunk_bits
    histogram: dict[int, int] = {}
    worst = None
    for start in range(first, last, chunk):
        stop = min(start + chunk, last)
        bits = torch.arange(start, stop, dtype=torch.int32, device="cuda")
        x = bits.view(torch.float32)
        y = torch.empty_like(x)
        reciprocal[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
        exact = (1.0 / x.double()).float()
        distance = (y.view(torch.int32).long() - exact.view(torch.int32).long()).abs()
        values, counts = torch.unique(distance, return_counts=True)
        for value, count in zip(values.tolist(), counts.tolist()):
            histogram[value] = histogram.get(value, 0) + count
        top = int(distance.argmax())
        if worst is None or distance[top] > worst[0]:
            worst = (int(distance[top]), float(x[top]), float(y[top]), float(exact[top]))
    total = sum(histogram.values())
    print(f"rcp.approx.ftz.f32 on {torch.cuda.get_device_name()}: {total} x in "
          f"[2^{args.low_exponent}, 2^{args.high_exponent})")
    for value in sorted(histogram):
        print(f"  {value} ulp: {histogram[value]}")
    print(f"  worst: {worst[0]} ulp at x = {worst[1]!r} (rcp {worst[2]!r}, RN(1/x) {worst[3]!r})")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "low_exponent": args.low_exponent,
                       "high_exponent": args.high_exponent, "values": total,
                       "ulps": {str(k): v for k, v in sorted(histogram.items())},
                       "worst": worst}, f, indent=1)
    return 0 if max(histogram) <= 1 else 1


if __name__ == "__main__":
    sys.exit(main())
