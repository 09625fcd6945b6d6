"""Command line: `python -m harness validate PLAN...`, `report PLAN`, `plot PLAN` and `overview PLAN...`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.spec.matrix import expand
from harness.rendering.overview import write_overview
from harness.spec.plan import PlanError, load_plan
from harness.rendering.plots import draw_plots
from harness.rendering.report import write_report


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    v = sub.add_parser("validate", help="check plan files without running anything")
    v.add_argument("plan", nargs="+")
    for name, text in (("report", "rebuild reports/<op>/PLAN.md from stored results without running anything"),
                       ("plot", "draw reports/<op>/perf-<sm>.png from stored results (needs matplotlib)")):
        p = sub.add_parser(name, help=text)
        p.add_argument("plan")
        p.add_argument("--reports-dir", default="reports", help="folder holding <op>/results (default: reports)")
    o = sub.add_parser("overview", help="rebuild reports/README.md, the decisions across ops, from stored results")
    o.add_argument("plan", nargs="+")
    o.add_argument("--reports-dir", default="reports", help="folder holding <op>/results (default: reports)")
    args = parser.parse_args(argv)

    status = 0
    loaded = []
    for path in args.plan if args.command in ("validate", "overview") else [args.plan]:
        try:
            loaded.append(load_plan(path))
        except PlanError as exc:
            print(f"error: {exc}", file=sys.stderr)
            status = 2
    if status or args.command == "validate":
        for plan in loaded:
            for warning in plan.warnings:
                print(f"warning: {warning}", file=sys.stderr)
            print(f"{plan.path}: ok ({plan.name}, {len(expand(plan))} cells)")
        return status
    if args.command == "overview":
        path, problems = write_overview(loaded, Path(args.reports_dir))
        for problem in problems:
            print(f"warning: {problem}", file=sys.stderr)
        print(f"wrote {path}")
        return 0
    plan, op_dir = loaded[0], Path(args.reports_dir) / loaded[0].name
    if args.command == "plot":
        for path in draw_plots(plan, op_dir):
            print(f"wrote {path}")
        return 0
    path, problems = write_report(plan, op_dir)
    for problem in problems:
        print(f"warning: {problem}", file=sys.stderr)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
