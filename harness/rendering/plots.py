"""Performance plots beside the report: GB/s against token count per implementation, one PNG per SM.

One panel per graph mode and dtype; in each, a colour per implementation, a line style per size combination, and
the copy bandwidth the run measured as the ceiling (a figure means something only beside its bound). The legend names
each colour and style once, so it stays short however many shapes a plan times.

Drawn by a run (and by `python -m harness plot`), never by the report: the page only links a plot
that exists, so it reads the same with or without matplotlib installed.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from harness.decisions.bounds import throughput
from harness.decisions.speedups import impl_order
from harness.rendering.performance import plot_name
from harness.results.merge import collect
from harness.plan.implementations import BUILTIN
from harness.plan.model import Plan

# The same colour for an implementation on every page; a plan's named baselines take the others in name order.
COLORS = dict(zip(("kernel", *BUILTIN), ("tab:red", "tab:gray", "tab:blue", "tab:green")))
NAMED_COLORS = ("tab:orange", "tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan")
LEGEND_COLUMNS = 4
STYLES = [(ls, m) for m in ("o", "s", "^", "D", "v") for ls in ("-", "--", ":", "-.")]


def draw_plots(plan: Plan, op_dir: Path) -> list[Path]:
    """Draw every SM's plot from the merged results; returns the files written ([] without matplotlib)."""
    try:  # optional: plots are extra, the tables in PLAN.md hold the same numbers
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.lines import Line2D
        from matplotlib.ticker import ScalarFormatter
    except ImportError:
        return []
    res = collect(plan, op_dir)
    written = []
    for sm in plan.matrix["sm"]:
        # (record, implementation, GB/s) of every timing at this SM with a byte model
        points = [(r, impl, gbps) for _, r in res.benchmarks if r.sm == sm for impl, t in r.impls.items()
                  if (gbps := throughput(r, t).gbps) is not None]
        recs = list({id(r): r for r, _, _ in points}.values())
        if not recs:
            continue
        modes = sorted({r.graph_mode for r in recs}, key=lambda m: (m != "eager", m))  # eager on top
        dtypes = [d for d in plan.matrix["dtype"] if any(r.dtype == d for r in recs)]
        impls = sorted({impl for _, impl, _ in points}, key=impl_order)
        named = [i for i in impls if i not in COLORS]
        color = {i: COLORS.get(i) or NAMED_COLORS[named.index(i) % len(NAMED_COLORS)] for i in impls}
        varying = sorted({k for r in recs for k, v in r.sizes.items() if len({q.sizes.get(k) for q in recs}) > 1})
        sizes = sorted({_sizes(r, varying) for r in recs})  # named by the sizes that differ between its lines
        lines, ceiling = defaultdict(list), defaultdict(set)
        for r in recs:
            if r.copy_bw_gbps:
                ceiling[r.graph_mode, r.dtype].add(r.copy_bw_gbps)
        for r, impl, gbps in points:  # one line per phase: decode and prefill points are not joined
            lines[(r.graph_mode, r.dtype), impl, _sizes(r, varying), r.phase].append((r.num_tokens, gbps))
        columns = LEGEND_COLUMNS if max(map(len, sizes)) <= 30 else LEGEND_COLUMNS // 2
        legend_rows = -(-(len(impls) + len(sizes) + 1) // columns)
        legend_in = 0.2 + 0.2 * legend_rows  # beneath the panels: long size names need the figure's width
        fig = Figure(figsize=(4.2 * len(dtypes) + 1.1, 3.2 * len(modes) + 0.6 + legend_in), dpi=100)
        FigureCanvasAgg(fig)  # Agg: the same pixels on every machine with the same matplotlib
        axes = fig.subplots(len(modes), len(dtypes), squeeze=False, sharex=True, sharey=True)
        for (panel, impl, size, _), points in sorted(lines.items()):
            ax = axes[modes.index(panel[0])][dtypes.index(panel[1])]
            ls, marker = STYLES[sizes.index(size) % len(STYLES)]
            points.sort()
            ax.plot([p[0] for p in points], [p[1] for p in points], linestyle=ls, marker=marker, markersize=3,
                    linewidth=1, color=color[impl])
        for row, mode in enumerate(modes):
            for col, dtype in enumerate(dtypes):
                ax = axes[row][col]
                for bw in ceiling[mode, dtype]:
                    ax.axhline(bw, color="black", linewidth=0.8, linestyle=(0, (1, 3)))
                ax.set_title(f"{dtype}, {mode}", fontsize="small")
                ax.set_xscale("log", base=2)
                ax.xaxis.set_major_formatter(ScalarFormatter())  # 64, not 2^6
                ax.grid(True, alpha=0.3)
                if row == len(modes) - 1:
                    ax.set_xlabel("tokens")
                if col == 0:
                    ax.set_ylabel("GB/s")
        handles = [Line2D([], [], color=color[impl], label=impl) for impl in impls]
        handles += [Line2D([], [], color="black", linestyle=STYLES[i % len(STYLES)][0],
                           marker=STYLES[i % len(STYLES)][1], markersize=3, label=size or "one size")
                    for i, size in enumerate(sizes)]
        handles.append(Line2D([], [], color="black", linewidth=0.8, linestyle=(0, (1, 3)), label="copy bandwidth"))
        fig.legend(handles=handles, loc="lower center", ncol=columns, fontsize="small", frameon=False)
        height = fig.get_figheight()
        fig.suptitle(f"{plan.op.name} on {sm}: GB/s against tokens")
        fig.subplots_adjust(left=0.9 / fig.get_figwidth(), right=1 - 0.2 / fig.get_figwidth(), top=1 - 0.6 / height,
                            bottom=(legend_in + 0.55) / height, hspace=0.3, wspace=0.08)
        path = Path(op_dir) / plot_name(sm)
        fig.savefig(path, format="png", metadata={"Software": None})
        written.append(path)
    return written


def _sizes(rec, keys: list[str]) -> str:
    return ", ".join(f"{k}={rec.sizes[k]}" for k in keys if k in rec.sizes)
