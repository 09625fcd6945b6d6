"""Command line: `python -m harness validate PLAN` and `python -m harness report PLAN`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    v = sub.add_parser("validate", help="check a plan file without running anything")
    v.add_argument("plan", nargs="+")
    r = sub.add_parser("report", help="rebuild reports/<op>/PLAN.md from stored results without running anything")
    r.add_argument("plan")
    r.add_argument("--reports-dir", default="reports", help="folder holding <op>/results (default: reports)")
    args = parser.parse_args(argv)

    from .hardware import use_triton_interpreter
    from .plan import PlanError, load_plan

    use_triton_interpreter()  # kernels are imported while validating
    status = 0
    plans = args.plan if args.command == "validate" else [args.plan]
    loaded = []
    for path in plans:
        try:
            loaded.append(load_plan(path))
        except PlanError as exc:
            print(f"error: {exc}", file=sys.stderr)
            status = 2
    if status or args.command == "validate":
        for plan in loaded:
            from .matrix import expand

            print(f"{plan.path}: ok ({plan.name}, {len(expand(plan))} cells)")
        return status
    from .report import write_report

    plan = loaded[0]
    path, problems = write_report(plan, Path(args.reports_dir) / plan.name)
    for problem in problems:
        print(f"warning: {problem}", file=sys.stderr)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
