"""The one-pass RMSNorm and fused add + RMSNorm kernels on a GPU, varied: rows per program, warps, and an
`evict_first` hint on the activation loads (`-ef`), beside the shipped launch and Inductor.
kernels/rms_norm.py's launch rule, docs/performance.md and docs/changelog.md read from it.

    python scripts/one_pass_variants.py [TOKENS] [HIDDEN] [INDUCTOR_CODE_FILE] [OPS]
    (defaults 2048,8192 2048,4096,5120,8192 - rms_norm,fused_add_rms_norm; "-": no code file)

Every variant is checked against the shipped kernel before it is timed; timings as the harness takes them
(harness.runtime.timing.time_calls, both graph modes, input sets rotated past twice the L2 size), in % of the copy
bandwidth measured in the same process (bytes: inputs read once, outputs written once). The last table is the one
to read: per shape the shipped launch, the best variant and Inductor.
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
from kernels import rms_norm as rn  # noqa: E402


@triton.jit
def _rms(out_ptr, x_ptr, w_ptr, out_rs, x_rs, n_rows, hidden, eps, BLOCK: tl.constexpr, ROWS: tl.constexpr,
         EVICT: tl.constexpr):
    rows = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)[:, None]
    cols = tl.arange(0, BLOCK)[None, :]
    mask = (cols < hidden) & (rows < n_rows)
    if EVICT:
        x = tl.load(x_ptr + rows * x_rs + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
    else:
        x = tl.load(x_ptr + rows * x_rs + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=cols < hidden, other=0.0, eviction_policy="evict_last").to(tl.float32)
    var = tl.sum(x * x, axis=1)[:, None] / hidden
    rstd = tl.rsqrt(var + eps)
    y = (x * rstd).to(x_ptr.dtype.element_ty).to(tl.float32) * w
    tl.store(out_ptr + rows * out_rs + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _fa_rows(x_ptr, res_ptr, w_ptr, x_rs, res_rs, n_rows, hidden, eps, block_id, BLOCK: tl.constexpr,
             ROWS: tl.constexpr, EVICT: tl.constexpr, LOAD_CM: tl.constexpr, STORE_CM: tl.constexpr):
    rows = (block_id * ROWS + tl.arange(0, ROWS)).to(tl.int64)[:, None]
    cols = tl.arange(0, BLOCK)[None, :]
    mask = (cols < hidden) & (rows < n_rows)
    if EVICT:
        x = tl.load(x_ptr + rows * x_rs + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
        r = tl.load(res_ptr + rows * res_rs + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
    else:
        x = tl.load(x_ptr + rows * x_rs + cols, mask=mask, other=0.0, cache_modifier=LOAD_CM).to(tl.float32)
        r = tl.load(res_ptr + rows * res_rs + cols, mask=mask, other=0.0, cache_modifier=LOAD_CM).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=cols < hidden, other=0.0, eviction_policy="evict_last").to(tl.float32)
    s = x + r
    tl.store(res_ptr + rows * res_rs + cols, s.to(res_ptr.dtype.element_ty), mask=mask, cache_modifier=STORE_CM)
    var = tl.sum(s * s, axis=1)[:, None] / hidden
    rstd = tl.rsqrt(var + eps)
    y = (s * rstd).to(x_ptr.dtype.element_ty).to(tl.float32) * w
    tl.store(x_ptr + rows * x_rs + cols, y.to(x_ptr.dtype.element_ty), mask=mask, cache_modifier=STORE_CM)


@triton.jit
def _fa(x_ptr, res_ptr, w_ptr, x_rs, res_rs, n_rows, hidden, eps, BLOCK: tl.constexpr, ROWS: tl.constexpr,
        EVICT: tl.constexpr, LOAD_CM: tl.constexpr = "", STORE_CM: tl.constexpr = "", PERSIST: tl.constexpr = False):
    # PERSIST: a grid smaller than the row blocks, each program striding over them (no tail wave of programs).
    if PERSIST:
        for block_id in tl.range(tl.program_id(0), tl.cdiv(n_rows, ROWS), tl.num_programs(0)):
            _fa_rows(x_ptr, res_ptr, w_ptr, x_rs, res_rs, n_rows, hidden, eps, block_id, BLOCK, ROWS, EVICT,
                     LOAD_CM, STORE_CM)
    else:
        _fa_rows(x_ptr, res_ptr, w_ptr, x_rs, res_rs, n_rows, hidden, eps, tl.program_id(0), BLOCK, ROWS, EVICT,
                 LOAD_CM, STORE_CM)


# The fused add's cache-modifier and persistent-grid variants (op fused_add_rms_norm, rows 1, the shipped warps and
# its neighbours): streaming stores (.cs) and write-through (.wt) for the in-place writes, L2-only loads (.cg), and a
# grid of a few programs per SM striding over the rows.
FA_EXTRA = [(load, store, persist) for load in ("", ".cg") for store in ("", ".cs", ".wt") for persist in (0, 4, 16)
            if (load, store, persist) != ("", "", 0)]


def main():
    if not torch.cuda.is_available():
        print("one_pass_variants: needs a CUDA GPU (timings of Triton's CPU interpreter mean nothing)")
        return 2
    tokens = [int(t) for t in (sys.argv[1] if len(sys.argv) > 1 else "2048,8192").split(",")]
    hiddens = [int(t) for t in (sys.argv[2] if len(sys.argv) > 2 else "2048,4096,5120,8192").split(",")]
    dtype = torch.bfloat16
    bw = copy_bandwidth_gbps("cuda")
    l2 = l2_cache_bytes("cuda")
    rows_out, summary = [], []
    code_out = open(sys.argv[3], "w") if len(sys.argv) > 3 and sys.argv[3] != "-" else None
    for op in (sys.argv[4] if len(sys.argv) > 4 else "rms_norm,fused_add_rms_norm").split(","):
        for n in tokens:
            for h in hiddens:
                mk = lambda: {"x": torch.randn(n, h, dtype=dtype, device="cuda"),
                              "r": torch.randn(n, h, dtype=dtype, device="cuda"),
                              "out": torch.empty(n, h, dtype=dtype, device="cuda"),
                              "w": torch.rand(h, dtype=dtype, device="cuda") + 0.5}
                first = mk()
                unused = "r" if op == "rms_norm" else "out"
                ws = sum(t.numel() * t.element_size() for k, t in first.items() if k != unused)
                sets = [first] + [mk() for _ in range(rotation_count(ws, l2) - 1)]
                nbytes = (2 if op == "rms_norm" else 4) * n * h * 2 + h * 2
                block = triton.next_power_of_2(h)
                impls = {}
                if op == "rms_norm":
                    impls["shipped"] = lambda v: rn.rms_norm(v["out"], v["x"], v["w"], 1e-6)
                    ref = torch.compile(rn.rms_norm_ref, fullgraph=True, dynamic=False)
                    impls["inductor"] = lambda v, ref=ref: ref(v["x"], v["w"], 1e-6)
                else:
                    impls["shipped"] = lambda v: fa.fused_add_rms_norm(v["x"], v["r"], v["w"], 1e-6)
                    ref = torch.compile(fa.fused_add_rms_norm_ref, fullgraph=True, dynamic=False)
                    impls["inductor"] = lambda v, ref=ref: ref(v["x"], v["r"], v["w"], 1e-6)
                for rows in (1, 2, 4):
                    for warps in (2, 4, 8, 16):
                        per_thread = rows * block // (32 * warps)
                        if per_thread < 4 or per_thread > 64:
                            continue
                        for evict in (True, False):
                            name = f"r{rows}-w{warps}{'-ef' if evict else ''}"
                            if op == "rms_norm":
                                def run(v, rows=rows, warps=warps, evict=evict):
                                    _rms[(triton.cdiv(n, rows),)](v["out"], v["x"], v["w"], h, h, n, h, 1e-6,
                                                                   BLOCK=block, ROWS=rows, EVICT=evict, num_warps=warps)
                            else:
                                def run(v, rows=rows, warps=warps, evict=evict):
                                    _fa[(triton.cdiv(n, rows),)](v["x"], v["r"], v["w"], h, h, n, h, 1e-6,
                                                                  BLOCK=block, ROWS=rows, EVICT=evict, num_warps=warps)
                            impls[name] = run
                if op == "fused_add_rms_norm":
                    _, _, shipped_warps = rn._launch_config(n, h, 2, streams=2,
                                                            two_pass_bytes=fa.FUSED_ADD_TWO_PASS_BYTES)
                    sms = torch.cuda.get_device_properties("cuda").multi_processor_count
                    for warps in {max(shipped_warps // 2, 1), shipped_warps, min(shipped_warps * 2, 16)}:
                        for load, store, persist in FA_EXTRA:
                            grid = min(n, sms * persist) if persist else n
                            name = f"r1-w{warps}-ld{load or '-'}-st{store or '-'}{f'-p{persist}' if persist else ''}"

                            def run(v, warps=warps, load=load, store=store, persist=persist, grid=grid):
                                _fa[(grid,)](v["x"], v["r"], v["w"], h, h, n, h, 1e-6, BLOCK=block, ROWS=1,
                                             EVICT=False, LOAD_CM=load, STORE_CM=store, PERSIST=bool(persist),
                                             num_warps=warps)
                            impls[name] = run
                # A variant that computes something else is not faster: check each against the shipped kernel.
                for name in [k for k in impls if k not in ("shipped", "inductor")]:
                    a = {k: t.clone() for k, t in first.items()}
                    b = {k: t.clone() for k, t in first.items()}
                    impls["shipped"](a)
                    impls[name](b)
                    keys = ["out"] if op == "rms_norm" else ["x", "r"]
                    if not all(torch.allclose(a[k].float(), b[k].float(), atol=2e-2, rtol=2e-2) for k in keys):
                        rows_out.append([op, "", n, h, name, None, "WRONG"])
                        del impls[name]
                for mode in ("eager", "cuda_graph"):
                    pct = {}
                    for name, call in impls.items():
                        try:
                            t = time_calls(call, sets, "cuda", graph=mode == "cuda_graph")
                        except Exception as exc:
                            rows_out.append([op, mode, n, h, name, None, type(exc).__name__])
                            continue
                        pct[name] = 100 * nbytes / (t.median_us * 1e-6) / 1e9 / bw
                        rows_out.append([op, mode, n, h, name, round(t.median_us, 2), round(pct[name], 1)])
                    alts = {k: v for k, v in pct.items() if k not in ("shipped", "inductor")}
                    best = max(alts, key=alts.get)
                    top3 = sorted(alts, key=alts.get, reverse=True)[:3]
                    summary.append([op, mode, n, h, round(pct["shipped"], 1), best, round(pct[best], 1),
                                    round(pct["inductor"], 1), " ".join(f"{k}:{alts[k]:.1f}" for k in top3)])
                if code_out is not None and n == tokens[0]:
                    from torch._inductor.utils import run_and_get_code
                    torch._dynamo.reset()
                    _, code = run_and_get_code(impls["inductor"], sets[0])
                    code_out.write(f"# ==== {op} {n}x{h}\n" + "\n".join(code) + "\n")
                torch._dynamo.reset()
                del sets, first
                torch.cuda.empty_cache()
    print(tabulate(rows_out, ["op", "mode", "n", "h", "cfg", "us", "%copy"]))
    print()
    print(tabulate(summary, ["op", "mode", "n", "h", "shipped%", "best", "best%", "inductor%", "top3"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
