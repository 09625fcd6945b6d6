"""Launch configurations of the bundled row-wise kernels against Inductor, timed as the harness times them.

    python scripts/kernel_sweep.py [--ops rms_norm,fused_add_rms_norm,silu_and_mul] [--tokens 2048,8192,32768]
                                   [--hidden 2048,4096,5120,8192] [--intermediate ...] [--dtype bf16] [--out FILE]

Per op, shape and mode (`--modes eager,cuda_graph`): the shipped launch (`default`), a sweep of alternatives \
(one or two passes and warps for the norms,
columns per program and warps for silu_and_mul), and the op's reference compiled by Inductor, each timed with
harness.runtime.timing.time_calls (CUDA events, input sets rotated past twice the L2 size) and given as % of the
device-to-device copy bandwidth measured in the same process (bytes: inputs read once, outputs written once).
Every configuration's result is checked against the op's reference first; one that computes something else is
listed as a wrong result and not timed. The last table is the one to read: per shape the default, the best
alternative and Inductor.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", default="rms_norm,fused_add_rms_norm,silu_and_mul")
    parser.add_argument("--tokens", default="1,64,256,2048,8192,32768")
    parser.add_argument("--hidden", default="2048,4096,5120,8192", help="hidden sizes of the norms")
    parser.add_argument("--intermediate", default="8192,11008,14336,28672", help="silu_and_mul's d")
    parser.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    parser.add_argument("--modes", default="eager", help="eager, cuda_graph or both (as the benchmarks time them)")
    parser.add_argument("--out", type=Path, help="also write the tables to this file")
    parser.add_argument("--inductor-code", type=Path, help="write Inductor's generated kernels (every shape) here")
    args = parser.parse_args()

    import torch

    if not torch.cuda.is_available():
        print("kernel_sweep: needs a CUDA GPU (timings of Triton's CPU interpreter mean nothing)")
        return 2
    from tabulate import tabulate

    from harness.runtime.timing import (
        copy_bandwidth_gbps,
        l2_cache_bytes,
        rotation_count,
        time_calls,
    )
    from kernels import fused_add_rms_norm as fa
    from kernels import rms_norm as rn
    from kernels import silu_and_mul as sm

    dtype = getattr(torch, DTYPES[args.dtype])
    copy_bw = copy_bandwidth_gbps("cuda")
    l2 = l2_cache_bytes("cuda")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows, summary = [], []

    def norm_variants(kernel, num_rows, hidden, ptrs):
        """The shipped launch, one-pass launches with other warp counts, two-pass launches over chunks."""
        fused_add = kernel is fa._fused_add_rms_norm_kernel
        block, single_pass, warps = rn._launch_config(num_rows, hidden, dtype.itemsize, streams=2 if fused_add else 1)
        configs = {"default": (block, single_pass, warps)}
        row_block = triton_next_power_of_2(hidden)  # one pass holds the whole row, whatever the default's chunk
        for w in (4, 8, 16, 32):
            configs[f"one-pass-w{w}"] = (row_block, True, w)
        for chunk in (1024, 2048, 4096, 8192):
            for w in (4, 8, 16, 32):
                if chunk <= row_block and chunk // (32 * w) >= 4:
                    configs[f"two-pass-b{chunk}-w{w}"] = (chunk, False, w)

        def launch(block, single_pass, warps):
            def run(v):
                extra = {"HIDDEN": 0 if single_pass else hidden} if fused_add else {}
                kernel[(num_rows,)](*[v[p] for p in ptrs], *[v[p].stride(0) for p in ptrs if p != "w"], hidden,
                                    1e-6, BLOCK=block, SINGLE_PASS=single_pass, num_warps=warps, **extra)
            return run
        return {name: launch(*c) for name, c in configs.items()}

    for op in args.ops.split(","):
        widths = args.intermediate if op == "silu_and_mul" else args.hidden
        for hidden in map(int, widths.split(",")):
            for num_rows in map(int, args.tokens.split(",")):
                if op == "rms_norm":
                    nbytes = 2 * num_rows * hidden * dtype.itemsize + hidden * dtype.itemsize
                    impls = norm_variants(rn._rms_norm_kernel, num_rows, hidden, ["out", "x", "w"])
                    torch._dynamo.reset()  # a fresh compile per shape (dynamic=False), never the recompile limit
                    ref = torch.compile(rn.rms_norm_ref, fullgraph=True, dynamic=False)
                    impls["inductor"] = lambda v, ref=ref: ref(v["x"], v["w"], 1e-6)
                elif op == "fused_add_rms_norm":
                    nbytes = 4 * num_rows * hidden * dtype.itemsize + hidden * dtype.itemsize
                    impls = norm_variants(fa._fused_add_rms_norm_kernel, num_rows, hidden, ["x", "r", "w"])
                    torch._dynamo.reset()
                    ref = torch.compile(fa.fused_add_rms_norm_ref, fullgraph=True, dynamic=False)
                    impls["inductor"] = lambda v, ref=ref: ref(v["x"], v["r"], v["w"], 1e-6)
                else:
                    d = hidden
                    nbytes = 3 * num_rows * d * dtype.itemsize
                    impls = {"default": lambda v: sm.silu_and_mul(v["out"], v["x"])}
                    for block in (512, 1024, 2048, 4096):
                        for warps in (2, 4, 8, 16):
                            if block // (warps * 32) < 2:
                                continue

                            def run(v, block=block, warps=warps, num_rows=num_rows, d=d):
                                grid = (num_rows * triton_cdiv(d, block),)
                                sm._silu_and_mul_kernel[grid](v["out"], v["x"], v["out"].stride(0), v["x"].stride(0),
                                                              d, BLOCK=block, num_warps=warps)
                            impls[f"b{block}-w{warps}"] = run
                    torch._dynamo.reset()
                    ref = torch.compile(sm.silu_and_mul_ref, fullgraph=True, dynamic=False)
                    impls["inductor"] = lambda v, ref=ref: ref(v["x"])
                first = make_inputs(op, num_rows, hidden, dtype)
                ws = sum(t.numel() * t.element_size() for t in first.values())
                sets = [first] + [make_inputs(op, num_rows, hidden, dtype) for _ in range(rotation_count(ws, l2) - 1)]
                for name in [n for n in impls if n != "inductor"]:  # a launch that computes less is not faster
                    if not right_result(op, impls[name], first):
                        rows.append([op, "", num_rows, hidden, name, None, None, "wrong result"])
                        del impls[name]
                for mode in args.modes.split(","):
                    pct = {}
                    for name, call in impls.items():
                        try:
                            t = time_calls(call, sets, "cuda", graph=mode == "cuda_graph")
                        except Exception as exc:  # a configuration the compiler rejects (too many registers)
                            rows.append([op, mode, num_rows, hidden, name, None, None, f"{type(exc).__name__}"])
                            continue
                        gbps = nbytes / (t.median_us * 1e-6) / 1e9
                        pct[name] = (100 * gbps / copy_bw, t.median_us)
                        rows.append([op, mode, num_rows, hidden, name,
                                     round(t.median_us, 2), round(100 * gbps / copy_bw, 1), ""])
                    alternatives = {k: v for k, v in pct.items() if k not in ("default", "inductor")}
                    best = min(alternatives, key=lambda k: alternatives[k][1]) if alternatives else "default"
                    summary.append([op, mode, num_rows, hidden,
                                    *(round(x, 2) for x in pct.get("default", (0, 0))[::-1]), best,
                                    *(round(x, 2) for x in pct.get(best, (0, 0))[::-1]),
                                    *(round(x, 2) for x in pct.get("inductor", (0, 0))[::-1])])
                if args.inductor_code:
                    from torch._inductor.utils import run_and_get_code

                    torch._dynamo.reset()
                    _, code = run_and_get_code(impls["inductor"], sets[0])
                    with args.inductor_code.open("a") as f:
                        f.write(f"# ==== {op} {num_rows}x{hidden}\n" + "\n".join(code) + "\n")
                del sets, first
                torch.cuda.empty_cache()

    text = (f"copy bandwidth {copy_bw:.0f} GB/s, {args.dtype}, {sms} SMs\n\n"
            + tabulate(rows, ["op", "mode", "tokens", "width", "config", "median us", "% copy", "error"]) + "\n\n"
            + tabulate(summary, ["op", "mode", "tokens", "width", "default us", "default %", "best", "best us",
                                 "best %", "inductor us", "inductor %"]))
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


def make_inputs(op: str, num_rows: int, width: int, dtype) -> dict:
    import torch

    def randn(*shape):
        return torch.randn(*shape, dtype=dtype, device="cuda")

    if op == "rms_norm":
        return {"out": randn(num_rows, width), "x": randn(num_rows, width), "w": randn(width).abs() + 0.5}
    if op == "fused_add_rms_norm":
        return {"x": randn(num_rows, width), "r": randn(num_rows, width), "w": randn(width).abs() + 0.5}
    return {"out": randn(num_rows, width), "x": randn(num_rows, 2 * width)}


def right_result(op: str, call, values: dict) -> bool:
    """Whether a launch configuration computes what the op's reference does, on a copy of one input set."""
    import torch

    from kernels import fused_add_rms_norm as fa
    from kernels import rms_norm as rn
    from kernels import silu_and_mul as sm

    v = {k: t.clone() for k, t in values.items()}
    call(v)
    if op == "rms_norm":
        pairs = [(v["out"], rn.rms_norm_ref(values["x"], values["w"], 1e-6))]
    elif op == "fused_add_rms_norm":
        out, residual = fa.fused_add_rms_norm_ref(values["x"], values["r"], values["w"], 1e-6)
        pairs = [(v["x"], out), (v["r"], residual)]
    else:
        pairs = [(v["out"], sm.silu_and_mul_ref(values["x"]))]
    return all(torch.allclose(got.float(), want.float(), atol=2e-2, rtol=2e-2) for got, want in pairs)


def triton_next_power_of_2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


if __name__ == "__main__":
    sys.exit(main())
