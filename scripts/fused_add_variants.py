"""Fused add + RMSNorm's two-pass kernel four ways at prefill shapes on a GPU: loops over the runtime width or
unrolled over a constant one (`-static`), writing in place (the op's contract) or into separate outputs (`-sep`, as
Inductor's compiled reference does), beside the shipped kernel and Inductor. docs/performance.md and
docs/changelog.md read from it.

    python scripts/fused_add_variants.py [--sliced] [TOKENSxHIDDEN ...]   (default: seven prefill shapes)

--sliced lays the input sets out as the plan's benchmarks do (each tensor's sets slices of one buffer,
harness.runtime.bench.implementations.input_sets) instead of allocating each set on its own.

Every variant is checked against the reference before it is timed; timings as the harness takes them
(harness.runtime.timing.time_calls, both graph modes), in % of the copy bandwidth measured in the same process.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from tabulate import tabulate  # noqa: E402

from harness.runtime.timing import copy_bandwidth_gbps, l2_cache_bytes, rotation_count, time_calls  # noqa: E402
from kernels import fused_add_rms_norm as fa  # noqa: E402


@triton.jit
def _two_pass_variant(x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, x_row_stride, res_row_stride, out_row_stride,
       res_out_row_stride, hidden, eps, BLOCK: tl.constexpr, HIDDEN: tl.constexpr, STATIC: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_row_stride
    res_row = res_ptr + row * res_row_stride
    out_row = out_ptr + row * out_row_stride
    res_out_row = res_out_ptr + row * res_out_row_stride
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    if STATIC:
        for off in tl.static_range(0, HIDDEN, BLOCK):
            cols = off + tl.arange(0, BLOCK)
            mask = cols < HIDDEN
            x = tl.load(x_row + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
            r = tl.load(res_row + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
            s = x + r
            acc += s * s
        rstd = tl.rsqrt(tl.sum(acc, axis=0) / HIDDEN + eps)
        for off in tl.static_range(0, HIDDEN, BLOCK):
            cols = off + tl.arange(0, BLOCK)
            mask = cols < HIDDEN
            x = tl.load(x_row + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
            r = tl.load(res_row + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
            w = tl.load(w_ptr + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
            s = x + r
            tl.store(res_out_row + cols, s.to(res_ptr.dtype.element_ty), mask=mask)
            y = (s * rstd).to(x_ptr.dtype.element_ty).to(tl.float32) * w
            tl.store(out_row + cols, y.to(x_ptr.dtype.element_ty), mask=mask)
    else:
        for off in range(0, hidden, BLOCK):
            cols = off + tl.arange(0, BLOCK)
            mask = cols < hidden
            x = tl.load(x_row + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
            r = tl.load(res_row + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
            s = x + r
            acc += s * s
        rstd = tl.rsqrt(tl.sum(acc, axis=0) / hidden + eps)
        for off in range(0, hidden, BLOCK):
            cols = off + tl.arange(0, BLOCK)
            mask = cols < hidden
            x = tl.load(x_row + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
            r = tl.load(res_row + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
            w = tl.load(w_ptr + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
            s = x + r
            tl.store(res_out_row + cols, s.to(res_ptr.dtype.element_ty), mask=mask)
            y = (s * rstd).to(x_ptr.dtype.element_ty).to(tl.float32) * w
            tl.store(out_row + cols, y.to(x_ptr.dtype.element_ty), mask=mask)


def variant(block, warps, static, separate):
    def run(v):
        out, ro = (v["o"], v["ro"]) if separate else (v["x"], v["r"])
        _two_pass_variant[(v["x"].shape[0],)](v["x"], v["r"], v["w"], out, ro, v["x"].stride(0), v["r"].stride(0),
                                              out.stride(0), ro.stride(0), v["x"].shape[1], 1e-6, BLOCK=block,
                                              HIDDEN=v["x"].shape[1], STATIC=static, num_warps=warps)
    return run


def main() -> int:
    if not torch.cuda.is_available():
        print("fused_add_variants: needs a CUDA GPU")
        return 2
    dt = torch.bfloat16
    copy_bw, l2 = copy_bandwidth_gbps("cuda"), l2_cache_bytes("cuda")
    rows = []
    args = [a for a in sys.argv[1:] if a != "--sliced"]
    sliced = "--sliced" in sys.argv[1:]
    shapes = [tuple(int(v) for v in arg.split("x")) for arg in args] or \
        [(2048, 4096), (8192, 4096), (8192, 5120), (8192, 8192), (32768, 4096), (32768, 5120), (32768, 8192)]
    for n, h in shapes:
        def mk():
            return {"x": torch.randn(n, h, dtype=dt, device="cuda"), "r": torch.randn(n, h, dtype=dt, device="cuda"),
                    "w": torch.randn(h, dtype=dt, device="cuda").abs() + 0.5,
                    "o": torch.empty(n, h, dtype=dt, device="cuda"), "ro": torch.empty(n, h, dtype=dt, device="cuda")}
        # Sets enough for the smallest working set timed (x and residual, written in place): every call, of every
        # variant, starts with its inputs out of L2, as in the plan's benchmarks. Counting the separate outputs too
        # (4 tensors) gave 2 sets at 2048 x 4096, and the in-place calls found part of their inputs still in L2.
        ws = 2 * n * h * 2 + 2 * h
        count = rotation_count(ws, l2)
        if sliced:
            first = [mk() for _ in range(count)]
            buffers = {k: torch.stack([one[k] for one in first]) for k in first[0]}
            del first
            sets = [{k: b[i] for k, b in buffers.items()} for i in range(count)]
        else:
            sets = [mk() for _ in range(count)]
        nbytes = 4 * n * h * 2 + 2 * h
        torch._dynamo.reset()
        ref = torch.compile(fa.fused_add_rms_norm_ref, fullgraph=True, dynamic=False)
        impls = {"shipped": lambda v: fa.fused_add_rms_norm(v["x"], v["r"], v["w"], 1e-6),
                 "inductor": lambda v: ref(v["x"], v["r"], v["w"], 1e-6)}
        for block, warps in ((1024, 4), (2048, 8), (4096, 16), (2048, 4), (4096, 8)):
            for static in (False, True):
                for sep in (False, True):
                    impls[f"b{block}-w{warps}{'-static' if static else ''}{'-sep' if sep else ''}"] = \
                        variant(block, warps, static, sep)
        # correctness of each variant against the shipped kernel
        base = mk()
        want = fa.fused_add_rms_norm_ref(base["x"], base["r"], base["w"], 1e-6)
        for name, call in list(impls.items()):
            if name == "inductor":
                continue
            v = {k: t.clone() for k, t in base.items()}
            call(v)
            sep = name.endswith("-sep")
            got = (v["o"], v["ro"]) if sep else (v["x"], v["r"])
            ok = all(torch.allclose(g.float(), w_.float(), atol=2e-2, rtol=2e-2) for g, w_ in zip(got, want))
            if not ok:
                rows.append(["eager", n, h, name, None, "WRONG"])
                del impls[name]
        for mode in ("eager", "cuda_graph"):
            for name, call in impls.items():
                t = time_calls(call, sets, "cuda", graph=mode == "cuda_graph")
                rows.append([mode, n, h, name, round(t.median_us, 2),
                             round(100 * nbytes / (t.median_us * 1e-6) / 1e9 / copy_bw, 1)])
        del sets
        torch.cuda.empty_cache()
    print(tabulate(rows, ["mode", "tokens", "hidden", "variant", "us", "% copy"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
