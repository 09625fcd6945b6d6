"""The results file: per cell its status, reason and figures, with the provenance of the run that produced it.

One JSON file per machine kind under `reports/<op>/results/` (e.g. `cpu.json`,
`sm90-nvidia-h200.json`). A run folds its cells into that file; every write goes to a temporary
file that replaces the old one atomically, after each cell, so an interrupted run (Ctrl-C,
SIGTERM, SIGKILL) leaves a valid file holding every finished cell. xdist workers write files of
their own, folded in at the end of the run (or by the next run or `python -m harness report`).
Merging across files: per cell, the latest result wins.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path

FORMAT, VERSION = "harness-results", 1
SECTIONS = ("cells", "benchmarks", "integration")  # per-item results; "runs" holds their provenance


class ResultsError(Exception):
    """A results file that cannot be merged: named, with why."""


def machine_key(prov: dict) -> str:
    if prov["sm"] == "cpu":
        return "cpu"
    return f"{prov['sm']}-" + re.sub(r"[^a-z0-9]+", "-", prov["gpu"].lower()).strip("-")


def empty(op: str) -> dict:
    return {"format": FORMAT, "version": VERSION, "op": op, "runs": {}, "cells": {}, "benchmarks": {}, "integration": {}}


def load(path: Path, op: str | None = None) -> dict:
    """Read and check one results file; ResultsError names the file and what is wrong with it."""
    try:
        data = json.loads(Path(path).read_text())
    except json.JSONDecodeError as exc:
        raise ResultsError(f"{path}: not valid JSON (truncated or corrupt?): {exc}") from None
    except OSError as exc:
        raise ResultsError(f"{path}: cannot be read: {exc.strerror}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ResultsError(f"{path}: not a harness results file (format {data.get('format') if isinstance(data, dict) else None!r})")
    if data.get("version") != VERSION:
        raise ResultsError(f"{path}: results format version {data.get('version')!r}; this harness reads version {VERSION}")
    if op is not None and data.get("op") != op:
        raise ResultsError(f"{path}: results for op {data.get('op')!r}, not {op!r}")
    for key in SECTIONS:
        data.setdefault(key, {})  # files written before a section existed
    for key in ("runs",) + SECTIONS:
        if not isinstance(data.get(key), dict):
            raise ResultsError(f"{path}: missing or malformed '{key}'")
    return data


def write_atomic(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes it private; results are shared files
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _own_sm(data: dict, rec: dict) -> bool:
    """Whether a record was made on a machine of the cell's own SM (not another machine's 'not run here')."""
    return (data["runs"].get(rec.get("run")) or {}).get("sm") == rec.get("sm")


def fold(into: dict, other: dict) -> dict:
    """Merge `other` into `into`: runs are unioned; per cell and benchmark the latest result wins,
    except that a machine of another SM saying "not run here" never replaces a real result."""
    into["runs"].update(other["runs"])
    for section in SECTIONS:
        for key, rec in other[section].items():
            old = into[section].get(key)
            if old is None or (_own_sm(into, rec), rec.get("finished", "")) >= \
                    (_own_sm(into, old), old.get("finished", "")):
                into[section][key] = rec
    return into


def merge_dir(directory: Path, op: str) -> tuple[dict, list[str]]:
    """Every results file of an op merged; problems with single files are returned, not swallowed."""
    merged, problems = empty(op), []
    for path in sorted(Path(directory).glob("*.json")):
        try:
            fold(merged, load(path, op))
        except ResultsError as exc:
            problems.append(str(exc))
    return merged, problems


class Recorder:
    """The running pytest process's results file, rewritten atomically after every cell."""

    def __init__(self, directory: Path, op: str, provenance: dict, run_id: str, worker: str | None = None):
        key = machine_key(provenance)
        self.path = Path(directory) / (f"{key}.{worker}.json" if worker else f"{key}.json")
        self.data = empty(op)
        if self.path.exists():
            try:
                self.data = load(self.path, op)
            except ResultsError:
                # Never overwrite what we cannot read: keep it beside, and start afresh.
                self.path.replace(self.path.with_suffix(".unreadable"))
        self.run_id = run_id
        self.data["runs"][run_id] = provenance

    def record(self, section: str, key: str, rec: dict) -> None:
        self.data[section][key] = {**rec, "run": self.run_id}
        write_atomic(self.path, self.data)

    def fold_worker_files(self) -> None:
        """Fold xdist workers' files (and those an interrupted run left) into this machine's file."""
        for path in sorted(self.path.parent.glob(f"{self.path.stem}.*.json")):
            try:
                fold(self.data, load(path, self.data["op"]))
            except ResultsError:
                continue  # reported by the report step, which reads every file
            write_atomic(self.path, self.data)
            path.unlink()
        write_atomic(self.path, self.data)
