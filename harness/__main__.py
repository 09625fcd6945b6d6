"""Command line: `python -m harness validate PLAN...`, `report PLAN`, `plot PLAN`, `diff PLAN`, `overview PLAN...`,
`merge SOURCE...`, `schema` and `manifest`.

Plain Python: report, plot, diff, overview and merge read plans and results only; validate imports the plans' code in a
child process (harness.runtime.resolve), so none of them imports torch here.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.rendering.overview import write_overview
from harness.rendering.plots import draw_plots
from harness.rendering.report import write_report
from harness.rendering.toolchains import diff_text
from harness.results.code_hash import MANIFEST, write_manifest
from harness.results.merge import collect
from harness.results.store import fold_files
from harness.runtime.resolve import resolve_in_child
from harness.plan.load import load_plan
from harness.cells.matrix import expand
from harness.plan.model import PlanError
from harness.plan.field_docs import fields_table
from harness.plan.schema import json_schema_text


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    v = sub.add_parser("validate", help="check plan files, and that the code they name imports and takes their "
                                        "arguments, without running anything")
    v.add_argument("plan", nargs="+")
    sub.add_parser("schema", help="print the JSON Schema of a plan file (plan.schema.json)")
    sub.add_parser("fields", help="print the table of every plan field (the README's), in Markdown")
    sub.add_parser("manifest", help="rewrite harness/results/checks_manifest.json, each check's version and code "
                                    "hash, after a refactor (results stand) or a version raised")
    for name, text in (("report", "rebuild reports/<op>/PLAN.md from stored results without running anything"),
                       ("plot", "draw reports/<op>/perf-<sm>.png from stored results (needs matplotlib)")):
        p = sub.add_parser(name, help=text)
        p.add_argument("plan")
        p.add_argument("--reports-dir", default="reports", help="folder holding <op>/results (default: reports)")
    d = sub.add_parser("diff", help="what changed with the toolchain: per cell and benchmark, the stored results of "
                                    "the latest two toolchains (torch, Triton, vLLM) on each GPU, old -> new")
    d.add_argument("plan")
    d.add_argument("--sm", help="one SM's results only (sm90)")
    d.add_argument("--reports-dir", default="reports", help="folder holding <op>/results (default: reports)")
    o = sub.add_parser("overview", help="rebuild reports/README.md, the decisions across ops, from stored results")
    o.add_argument("plan", nargs="+")
    o.add_argument("--reports-dir", default="reports", help="folder holding <op>/results (default: reports)")
    m = sub.add_parser("merge", help="fold the results files of other runs (CI artifacts, other checkouts' reports/) "
                                     "into reports/, record by record: the latest result wins, 'not run here' never "
                                     "replaces a result, and two runs' files of one name both keep their records")
    m.add_argument("source", nargs="+", help="a folder holding <op>/results/<machine>.json files, at any depth")
    m.add_argument("--reports-dir", default="reports", help="folder holding <op>/results (default: reports)")
    args = parser.parse_args(argv)
    if args.command in ("schema", "fields"):
        sys.stdout.write(json_schema_text() if args.command == "schema" else fields_table())
        return 0
    if args.command == "manifest":
        changes = write_manifest()
        print("\n".join(changes) or "no check changed")
        print(f"wrote {MANIFEST}")
        return 0

    if args.command == "merge":
        status = 0
        for source in args.source:
            done, problems = fold_files(Path(args.reports_dir), Path(source))
            print("\n".join(done) or f"{source}: no results files under it")
            for problem in problems:
                print(f"error: {problem} (left as it is)", file=sys.stderr)
            status = status or (2 if problems or not done else 0)
        return status

    status = 0
    loaded = []
    for path in args.plan if args.command in ("validate", "overview") else [args.plan]:
        try:
            loaded.append(load_plan(path))
        except PlanError as exc:
            print(f"error: {exc}", file=sys.stderr)
            status = 2
    owners: dict[str, str] = {}
    for plan in loaded:  # one op.name per plan: each op's page and results are its own (reports/<op.name>/)
        first = owners.setdefault(plan.op.name, str(plan.path))
        if first != str(plan.path):
            print(f"error: {plan.path}:{plan.where('op.name')}: op.name: {plan.op.name!r} is already the op of "
                  f"{first}: "
                  "the two would write one page and one results folder", file=sys.stderr)
            status = 2
    if status or args.command == "validate":
        warned: dict[str, list[str]] = {}
        resolved = resolve_in_child([str(plan.path) for plan in loaded], warnings=warned) \
            if args.command == "validate" else {}
        for plan in loaded:
            for warning in (*plan.warnings, *warned.get(str(plan.path), ())):
                print(f"warning: {warning}", file=sys.stderr)
            error = resolved.get(str(plan.path))
            if error:
                if not error.startswith(str(plan.path)):  # it crashed or hung, not a PlanError
                    error = f"{plan.path}: its code does not resolve: {error}"
                print(f"error: {error}", file=sys.stderr)
                status = 2
                continue
            code = "; its code resolves" if str(plan.path) in resolved else ""
            also = "".join(f", and {len(expand(plan, p))} of {p}" for p in plan.providers)
            print(f"{plan.path}: ok ({plan.op.name}, {len(expand(plan))} cells{also}){code}")
        return status
    if args.command == "overview":
        path, problems = write_overview(loaded, Path(args.reports_dir))
        for problem in problems:
            print(f"warning: {problem}", file=sys.stderr)
        print(f"wrote {path}")
        return 0
    plan, op_dir = loaded[0], Path(args.reports_dir) / loaded[0].op.name
    if args.command == "diff":
        res = collect(plan, op_dir)
        for problem in res.problems:
            print(f"warning: {problem}", file=sys.stderr)
        print(diff_text(res, args.sm))
        return 0
    if args.command == "plot":
        for path in draw_plots(plan, op_dir):
            print(f"wrote {path}")
        return 0
    path, problems = write_report(plan, op_dir)
    for problem in problems:
        print(f"warning: {problem}", file=sys.stderr)
    stale = collect(plan, op_dir).stale_summary()
    if stale:
        print(f"warning: {stale}", file=sys.stderr)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
