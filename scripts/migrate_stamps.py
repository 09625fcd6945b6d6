"""Stamp the records of results files made before records were stamped per check, once.

Until then a run stamped its provenance with one hash per kind of record ("numerics", "integration", "bench") over the
bytes of some harness modules and of the whole plan file. A record whose run's hash equals the one the last such
harness computes for its plan was made by the checks as they are when this harness's check versions start (every
check at version 1): it gets the stamp a run of this harness would give it, with the plan and implementation
fingerprints of the tree where it is stamped. Its implementation fingerprint is taken from the kernel's source at the
commit its run names, so a kernel edited since makes it stale. Records of other hashes keep no stamp: they were
stale before and stay so ("made before records were stamped per check"). The after-timing check's fraction of
quantized elements one step off, which such records kept only in words, becomes the number benchmark records now
keep (ImplFigures.step_fraction), judged again by each page.

    python scripts/migrate_stamps.py LEGACY_HARNESS_DIR [REPORTS_DIR]

LEGACY_HARNESS_DIR: a checkout of the last harness that stamped provenance (its harness/ folder; `git worktree add
/tmp/legacy <commit>`). Prints per results file how many records it stamped and how many it left unstamped.
"""

from __future__ import annotations

import glob
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

from harness.results.stamps import stamp
from harness.results.store import load, write_atomic
from harness.plan.load import load_plan
from harness.cells.matrix import Cell

ROOT = Path(__file__).resolve().parents[1]
KIND = {"cells": "numerics", "integration": "integration", "benchmarks": "bench"}
STEPS = re.compile(r"(?:; )?wrong result after timing: output '\w+': ([\d.]+)% of quantized elements are one step "
                   r"from the reference \(at most [\d.]+% allowed: [\w.]+\)")


def legacy_versions(legacy_harness: Path):
    spec = importlib.util.spec_from_file_location("legacy_checks", legacy_harness / "results" / "checks_version.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.HARNESS_DIR = legacy_harness
    return module.checks_version


def commit_of(prov: dict) -> str | None:
    """The harness commit a run names ("0.1.0 (aa16c0f6e440+dirty)" or a plain commit), if git knows it."""
    text = prov.get("harness") or prov.get("commit") or ""
    match = re.search(r"([0-9a-f]{7,40})", text)
    if not match:
        return None
    ok = subprocess.run(["git", "cat-file", "-e", f"{match.group(1)}^{{commit}}"], cwd=ROOT, capture_output=True)
    return match.group(1) if ok.returncode == 0 else None


def kernel_source_changed(plan, commit: str | None) -> bool:
    """Whether the kernel module's file differs between `commit` and the working tree (unknown commit: assume so)."""
    module = plan.op.kernel.partition(":")[0].replace(".", "/") + ".py"
    if commit is None:
        return True
    diff = subprocess.run(["git", "diff", "--quiet", commit, "--", module], cwd=ROOT)
    return diff.returncode != 0


def migrate(plan_path: Path, reports: Path, checks_version) -> str:
    plan = load_plan(plan_path)
    legacy = checks_version(plan_path)
    results_dir = reports / plan.op.name / "results"
    lines = []
    for path in sorted(results_dir.glob("*.json")):
        if "." in path.stem:
            continue
        raw = json.loads(path.read_text())
        results = load(path, plan.op.name)
        stamped = left = steps = 0
        for section in ("cells", "integration", "benchmarks"):
            for key, rec in results.section(section).items():
                prov = raw["runs"].get(rec.run, {})
                if section == "benchmarks":  # the fraction one step off, kept in words until now
                    for impl in rec.impls.values():
                        for field in ("differs", "error"):
                            text = getattr(impl, field) or ""
                            found = STEPS.search(text)
                            if found:
                                impl.step_fraction = float(found.group(1)) / 100
                                setattr(impl, field, STEPS.sub("", text) or None)
                                steps += 1
                if rec.stamp is not None:
                    continue
                if (prov.get("checks") or {}).get(KIND[section]) != legacy[KIND[section]]:
                    left += 1
                    continue
                provider = Cell.from_id(key).provider if section == "cells" else ""
                rec.stamp = stamp(plan, rec, provider)
                if provider == "" and kernel_source_changed(plan, commit_of(prov)):
                    rec.stamp = type(rec.stamp)(rec.stamp.checks, rec.stamp.plan, "kernel changed since", provider)
                stamped += 1
        write_atomic(path, results)
        lines.append(f"{path}: {stamped} stamped, {left} left unstamped (other checks made them), "
                     f"{steps} step fractions read from words")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    legacy = legacy_versions(Path(argv[0]))
    reports = Path(argv[1]) if len(argv) > 1 else ROOT / "reports"
    plans = ["plan.yaml", *sorted(glob.glob("kernels/plans/*.yaml")), *sorted(glob.glob("tests/thirdparty/*.yaml"))]
    for plan in plans:
        print(migrate(ROOT / plan, reports, legacy))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
