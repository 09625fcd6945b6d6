"""Performance plots beside the report: GB/s against token count per implementation, one PNG per SM.

Drawn by a run (and by `python -m harness plot`), never by the report: the page only links a plot
that exists, so it reads the same with or without matplotlib installed.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from harness.decisions.speedups import IMPL_ORDER
from harness.rendering.performance import plot_name
from harness.results.merge import collect
from harness.spec.plan import Plan

COLORS = {"kernel": "tab:red", "native": "tab:gray", "compiled": "tab:blue", "vllm": "tab:green"}
STYLES = ["-", "--", ":", "-."]


def draw_plots(plan: Plan, op_dir: Path) -> list[Path]:
    """Draw every SM's plot from the merged results; returns the files written ([] without matplotlib)."""
    try:  # optional: plots are extra, the tables in PLAN.md hold the same numbers
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import ScalarFormatter
    except ImportError:
        return []
    res = collect(plan, op_dir)
    written = []
    for sm in plan.matrix["sm"]:
        recs = [r for _, r in res.benchmarks if r.sm == sm]
        if not recs:
            continue
        lines = defaultdict(list)
        varying = [a for a in ("phase", "dtype", "graph_mode") if len({str(getattr(r, a)) for r in recs}) > 1]
        for r in recs:
            sizes = ", ".join(f"{k}={v}" for k, v in sorted(r.sizes.items()))
            for impl, t in sorted(r.impls.items()):
                if t.gbps is not None:
                    key = (IMPL_ORDER.index(impl) if impl in IMPL_ORDER else 9, impl, sizes,
                           *(str(getattr(r, a)) for a in varying))
                    lines[key].append((r.num_tokens, t.gbps))
        if not lines:
            continue
        fig = Figure(figsize=(12, 5), dpi=100)
        FigureCanvasAgg(fig)  # Agg: the same pixels on every machine with the same matplotlib
        ax = fig.subplots()
        variants = sorted({k[2:] for k in lines})
        for key, points in sorted(lines.items()):
            points.sort()
            label = ", ".join(p for p in (key[1], *key[2:]) if p)
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label,
                    color=COLORS.get(key[1], "black"), linestyle=STYLES[variants.index(key[2:]) % len(STYLES)])
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(ScalarFormatter())  # 64, not 2^6
        ax.set_xlabel("tokens")
        ax.set_ylabel("GB/s")
        ax.set_title(f"{plan.name} on {sm}")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the plot, not over it
        fig.tight_layout()
        path = Path(op_dir) / plot_name(sm)
        fig.savefig(path, format="png", metadata={"Software": None})
        written.append(path)
    return written
