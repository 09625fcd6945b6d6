"""The calibration corpus: correct kernels of several authors and broken ones, in four families, run through the
harness's numerics cells on this machine; prints kernel, check, statistic, threshold and verdict per kernel.

    python -m tests.calibration [--jobs N] [--only WORD] [--reports-dir DIR] [pytest args...]

A correct kernel must pass every cell it runs; a broken one must fail at least one, for its reason. Exit status 1
when either does not hold. Each entry is a bundled (or third-party) plan with its kernel swapped and its matrix
narrowed to tp1 on this machine's SM (graph modes as the entry says), written under build/calibration/.
On a GPU machine: scripts/gpu_run.sh calibrate. The H200's table is kept in docs/calibration.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import yaml
from tabulate import tabulate

from harness.cells.matrix import Cell

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "build" / "calibration"
K = "tests.calibration.kernels"
H, S = "tests.broken.hazard_kernels", "tests.broken.sanitizer_bugs"
ACCUMULATOR = ("accumulation:", "max abs error", "max rel error", "NaN/Inf")  # its mark, its values, or fp16 overflow


@dataclass(frozen=True)
class Entry:
    label: str
    family: str
    author: str
    plan: str  # the plan the kernel is checked under (its reference, arguments, tolerances)
    kernel: str | None = None  # None: the plan's own
    broken: tuple[str, ...] = ()  # a broken kernel: words one of which its failure reason must contain
    graph_modes: tuple[str, ...] = ("eager",)
    dtypes: tuple[str, ...] = ("bf16", "fp16")
    gpu_only: bool = False  # a broken kernel only a GPU's sizes show (the cells on a CPU machine record why)
    # An implementation of the plan audited instead of its kernel (`vllm`: vLLM's compiled kernel for the op), as
    # vLLM calls it: contiguous rows of aligned widths (the op's own plan, where `implementations.vllm` has role
    # audited, finds what else it takes).
    provider: str = ""
    # a broken kernel the check cannot tell from correct ones of its kind (its cells say "inconclusive for this op")
    inseparable: bool = False
    numerics: tuple[tuple[str, object], ...] = ()  # the plan's numerics settings the entry sets (what it asks for)


CORPUS = (
    # row reductions
    Entry("rms_norm", "row reduction", "bundled", "plan.yaml", graph_modes=("eager", "torch_compile")),
    Entry("rms_norm_two_pass", "row reduction", "variant", "plan.yaml", f"{K}:rms_norm_two_pass"),
    Entry("rms_norm_fp32_weight", "row reduction", "variant", "plan.yaml", f"{K}:rms_norm_fp32_weight"),
    Entry("liger_rms_norm", "row reduction", "Liger-Kernel", "tests/thirdparty/liger_rms_norm.yaml"),
    Entry("vllm_rms_norm", "row reduction", "vLLM (compiled)", "plan.yaml", provider="vllm"),
    Entry("vllm_fused_add_rms_norm", "row reduction", "vLLM (compiled)", "kernels/plans/fused_add_rms_norm.yaml",
          provider="vllm"),
    Entry("rms_norm_bf16_accumulator", "row reduction", "broken", "plan.yaml",
          "tests.broken.rms_norm_bugs:bf16_accumulator", broken=ACCUMULATOR),
    Entry("rms_norm_fp16_square_sum", "row reduction", "broken", "plan.yaml",
          "tests.broken.rms_norm_bugs:fp16_square_sum", broken=ACCUMULATOR + ("inf",)),
    Entry("rms_norm_unmasked_load", "row reduction", "broken", "plan.yaml", "tests.broken.rms_norm_bugs:no_load_mask",
          broken=("output 'out'", "OutOfBounds"), dtypes=("fp32",)),
    Entry("rms_norm_tail_dropped", "row reduction", "broken", "plan.yaml",
          "tests.broken.rms_norm_bugs:tail_rows_dropped", broken=("never written",), dtypes=("bf16",)),
    # element-wise with scales
    Entry("silu_and_mul", "element-wise", "bundled", "kernels/plans/silu_and_mul.yaml"),
    Entry("fla_swiglu", "element-wise", "flash-linear-attention", "tests/thirdparty/fla_swiglu.yaml"),
    Entry("vllm_silu_and_mul", "element-wise", "vLLM (compiled)", "kernels/plans/silu_and_mul.yaml",
          provider="vllm"),
    Entry("per_token_fp8_quant", "element-wise", "bundled", "kernels/plans/dynamic_per_token_fp8_quant.yaml",
          graph_modes=("eager", "torch_compile")),
    Entry("torch_per_token_fp8_quant", "element-wise", "variant (plain PyTorch)",
          "kernels/plans/dynamic_per_token_fp8_quant.yaml", f"{K}:torch_per_token_fp8_quant",
          graph_modes=("eager", "torch_compile")),
    Entry("vllm_per_token_fp8_quant", "element-wise", "vLLM (compiled)",
          "kernels/plans/dynamic_per_token_fp8_quant.yaml", provider="vllm"),
    Entry("fp8_quant_wrong_scale", "element-wise", "broken", "kernels/plans/dynamic_per_token_fp8_quant.yaml",
          f"{K}:fp8_quant_wrong_scale", broken=("output 'scales'", "output 'out'")),
    Entry("silu_and_mul_unmasked_store", "element-wise", "broken", "kernels/plans/silu_and_mul.yaml",
          f"{K}:silu_and_mul_unmasked_store", broken=("memcheck", "out of bounds", "OutOfBounds", "output 'out'",
                                                       "Invalid"),
          graph_modes=("eager", "memcheck"), dtypes=("bf16",)),
    # GEMM-like K loops
    Entry("int8_linear", "GEMM", "bundled", "kernels/plans/int8_linear_row.yaml"),
    Entry("int8_linear_block_k32", "GEMM", "variant", "kernels/plans/int8_linear_row.yaml",
          f"{K}:int8_linear_block_k32"),
    Entry("int8_linear_block_k128", "GEMM", "variant", "kernels/plans/int8_linear_row.yaml",
          f"{K}:int8_linear_block_k128"),
    Entry("int8_linear_16bit_accumulator", "GEMM", "broken", "kernels/plans/int8_linear_row.yaml",
          f"{K}:int8_linear_16bit_accumulator", broken=ACCUMULATOR, gpu_only=True),
    Entry("int8_linear_scale_per_row", "GEMM", "broken", "kernels/plans/int8_linear_row.yaml",
          "tests.broken.int8_linear_bugs:scale_per_row", broken=("output 'out'",)),
    # attention
    Entry("paged_attention", "attention", "bundled", "kernels/plans/paged_attention.yaml"),
    Entry("paged_attention_tile16", "attention", "variant", "kernels/plans/paged_attention.yaml",
          f"{K}:paged_attention_tile16"),
    Entry("paged_attention_tile64", "attention", "variant", "kernels/plans/paged_attention.yaml",
          f"{K}:paged_attention_tile64"),
    Entry("paged_attention_fp32_pv", "attention", "variant", "kernels/plans/paged_attention.yaml",
          f"{K}:paged_attention_fp32_pv"),
    Entry("paged_attention_16bit_accumulator", "attention", "broken", "kernels/plans/paged_attention.yaml",
          f"{K}:paged_attention_16bit_accumulator", broken=ACCUMULATOR, gpu_only=True,
          inseparable=True),
    Entry("paged_attention_whole_blocks", "attention", "broken", "kernels/plans/paged_attention.yaml",
          "tests.broken.paged_attention_bugs:attends_whole_blocks", broken=("output 'out'",)),
    # vLLM's hazards, beside the values: padding isolation (CUDA-graph cells on a GPU, eager on a CPU machine), batch
    # invariance and determinism (eager), and compute-sanitizer's lanes (memcheck cells: racecheck, initcheck,
    # synccheck after memcheck). Correct kernels of several authors pass every one; each broken kernel has right
    # values and one hazard.
    *(Entry(f"{label}_hazards", "vLLM hazards", author, plan, dtypes=("bf16",), provider=provider,
            graph_modes=("eager", "cuda_graph", "memcheck"), numerics=(("batch_invariance", "required"),))
      for label, author, plan, provider in (
          ("rms_norm", "bundled", "plan.yaml", ""),
          ("vllm_rms_norm", "vLLM (compiled)", "plan.yaml", "vllm"),
          ("liger_rms_norm", "Liger-Kernel", "tests/thirdparty/liger_rms_norm.yaml", ""),
          ("fla_swiglu", "flash-linear-attention", "tests/thirdparty/fla_swiglu.yaml", ""),
          ("silu_and_mul", "bundled", "kernels/plans/silu_and_mul.yaml", ""))),
    Entry("hazard_reads_padding", "vLLM hazards", "broken", "plan.yaml", f"{H}:batch_absmax_scaled",
          broken=("padding isolation",), graph_modes=("eager", "cuda_graph"), dtypes=("bf16",)),
    Entry("hazard_split_by_batch", "vLLM hazards", "broken", "plan.yaml", f"{H}:split_by_batch",
          broken=("batch invariance",), dtypes=("fp32",), numerics=(("batch_invariance", "required"),),
          gpu_only=True),  # fp32: a bf16 output rounds the last bits away (an H100's bf16 rows were invariant)
    Entry("hazard_atomic_sum", "vLLM hazards", "broken", "plan.yaml", f"{H}:atomic_sum", broken=("determinism",),
          dtypes=("bf16",), gpu_only=True),  # the interpreter runs a launch's programs in order: deterministic
    *(Entry(f"hazard_{kernel}", "vLLM hazards", "broken", "plan.yaml", f"{S}:{kernel}", broken=(f"{lane}: ",),
            graph_modes=("eager", "memcheck"), dtypes=("bf16",), gpu_only=True)
      for kernel, lane in (("shared_race", "racecheck"), ("uninitialised_slots", "initcheck"),
                           ("split_barrier", "synccheck"))),
)


def entry_plan(entry: Entry) -> dict:
    """The entry's plan: its base plan with the kernel swapped and the matrix narrowed; no benchmark, no vLLM items.
    The plan's rules stay with its own kernel (vLLM's kernels' known refusals are `expect`ed there)."""
    plan = yaml.safe_load((ROOT / entry.plan).read_text())
    plan["op"]["name"] = f"cal_{entry.label}"
    if entry.kernel:
        plan["op"]["kernel"] = entry.kernel
    m = plan["matrix"]
    m.update(tp=[1], graph_mode=list(entry.graph_modes), sm=[s for s in m["sm"] if s in ("cpu", "sm90")],
             dtype=[d for d in entry.dtypes if d in m["dtype"]] or m["dtype"])
    # native and compiled (timed by no item here), and the implementation audited, as the base plan names it
    implementations = plan.pop("implementations", None) or {}
    plan["implementations"] = {"native": {}, "compiled": {}}
    if entry.provider:
        plan["implementations"][entry.provider] = {**implementations[entry.provider], "role": ["audited"]}
        for arg in plan["op"]["args"].values():
            if isinstance(arg, dict) and "layout" in arg:
                arg["layout"] = ["contiguous"]
        plan.setdefault("numerics", {})["awkward_sizes"] = False
        plan["numerics"]["int32_overflow"] = False
    plan.setdefault("numerics", {}).update(dict(entry.numerics))
    for section in ("benchmark", "vllm") + (("exclude", "expect") if entry.kernel else ()):  # no route into vLLM
        plan.pop(section, None)
    for section in ("exclude", "expect"):  # the rules narrowed with the matrix; a rule left matching nothing goes
        rules = []
        for rule in plan.pop(section, []):
            axes = {a: [v for v in (vs if isinstance(vs, list) else [vs]) if v in m[a]]
                    for a, vs in rule.items() if a in m}
            if all(axes.values()):
                rules.append({**rule, **axes})
        if rules:
            plan[section] = rules
    return plan


def write_plans(entries) -> dict[str, Path]:
    BUILD.mkdir(parents=True, exist_ok=True)
    paths = {}
    for e in entries:
        paths[e.label] = BUILD / f"{e.label}.yaml"
        paths[e.label].write_text(f"# generated by python -m tests.calibration from {e.plan}\n"
                                  + yaml.safe_dump(entry_plan(e), sort_keys=False))
    return paths


def run(path: Path, reports: Path, extra: list[str]) -> int:
    log = path.with_suffix(".log")
    # The numerics cells only: the vLLM items (routes, fusion passes, engines) prove an integration, not a check.
    cmd = [sys.executable, "-m", "pytest", "--plan", str(path), "-m", "not bench and not engine and not fusion",
           "-k", "not vllm-", "--cells", "all",
           "-p", "no:cacheprovider", "--reports-dir", str(reports), "-q", "-p", "no:randomly", *extra]
    with log.open("w") as out:
        return subprocess.call(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)


def cells_ran(reports: Path, entry: Entry) -> list[dict]:
    """The entry's cells this machine ran (from every results file of its op): its provider's, else its kernel's."""
    out = []
    for f in sorted((reports / f"cal_{entry.label}" / "results").glob("*.json")):
        out += [c for cell_id, c in json.loads(f.read_text())["cells"].items()
                if c["status"] in ("passed", "failed")
                and Cell.from_id(cell_id).provider == entry.provider]
    return out


def rows_of(entry: Entry, cells: list[dict], reduction: str) -> tuple[list[list[str]], bool]:
    """The entry's table rows and whether it holds (correct: no failure; broken: a failure for its reason)."""
    from harness.runtime.accumulation import LIMITS  # lazily: torch

    failed = [c for c in cells if c["status"] == "failed"]
    if entry.broken and entry.gpu_only and not cells:
        ok, verdict = True, "not run here: the cells that show it need a GPU"
    elif entry.broken and entry.gpu_only and cells and all(c["sm"] == "cpu" for c in cells) and not failed:
        said = next((v for k, v in cells[0]["facts"].items() if any(w.startswith(k) for w in entry.broken)),
                    cells[0]["facts"].get("accumulation") or "")  # what the cells said of the check it targets
        ok, verdict = True, "not visible on a CPU machine: " + said[:80]
    elif entry.broken and entry.inseparable and not failed:
        said = {c["facts"].get("accumulation", "") for c in cells}
        ok = any(s.startswith("inconclusive") for s in said)
        verdict = ("inconclusive for this op, as documented: a correct kernel of this kind shows more" if ok else
                   "MISSED, and its cells do not say inconclusive")
    elif entry.broken:
        right = [c for c in failed if any(w in c["reason"] for w in entry.broken)]
        ok = bool(right)
        verdict = ("fails: " + right[0]["reason"][:110]) if right else \
            ("FAILS FOR ANOTHER REASON: " + failed[0]["reason"][:90]) if failed else "MISSED: passed every cell"
    else:
        ok = not failed and bool(cells)
        verdict = f"passes ({len(cells)} cells)" if ok else \
            ("FALSE FAILURE: " + failed[0]["reason"][:100]) if failed else "not run here"
    rows = [[entry.label, entry.family, entry.author, "cells", f"{len(failed)} of {len(cells)} failed", "", verdict]]
    for stat in ("element", "row_shift"):
        seen = [c["readings"][stat] for c in cells if (c.get("readings") or {}).get(stat) is not None]
        if seen:
            lim = LIMITS[reduction][stat]
            rows.append(["", "", "", f"accumulation: {stat.replace('_', ' ')} ({reduction})", f"{max(seen):.2f}",
                         f"{lim.limit:g} / {lim.decisive:g}",
                         "fails" if max(seen) > lim.decisive else
                         "inconclusive" if max(seen) > lim.limit else "consistent"])
    return rows, ok or (not cells and not entry.broken)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.calibration", description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=int(os.environ.get("JOBS", "2")))
    parser.add_argument("--only", default=None, help="entries whose label contains this")
    parser.add_argument("--reports-dir", type=Path, default=BUILD / "reports")
    parser.add_argument("--table-only", action="store_true", help="print the table of the results in --reports-dir "
                        "(another machine's run) without running anything")
    args, extra = parser.parse_known_args(argv)
    entries = [e for e in CORPUS if not args.only or args.only in e.label]
    if not args.table_only:
        paths = write_plans(entries)
        with ThreadPoolExecutor(args.jobs) as pool:
            list(pool.map(lambda e: run(paths[e.label], args.reports_dir, extra), entries))
    table, holds = [], True
    for e in entries:
        reduction = entry_plan(e)["op"].get("reduction", "unknown")
        rows, ok = rows_of(e, cells_ran(args.reports_dir, e), reduction)
        table += rows
        holds &= ok
    print(tabulate(table, ["kernel", "family", "author", "check", "statistic", "limit / decisive", "verdict"],
                   tablefmt="github"))
    print("calibration:", "every correct kernel passed and every broken one failed for its reason" if holds else
          "NOT HELD (see the verdicts above; logs beside the plans in build/calibration/)")
    return 0 if holds else 1


if __name__ == "__main__":
    sys.exit(main())
