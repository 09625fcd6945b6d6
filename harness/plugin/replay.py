"""A failed cell's failure kept for replaying: reports/<op>/failures/<cell-id>.json holds the leading failure's
example (every field build_args rebuilds its tensors from, exactly), the other distinct failures' examples, and how
often the cell failed in the runs since; <cell-id>.pt beside it holds the example's input tensors where they are
small (torch.save; harness.runtime.failures). `pytest --plan P --replay <cell-id>` checks that example alone
(runner.run_examples' `replay`), records nothing and says whether it reproduced.

The file is rewritten by every run of its cell: a failure saves its example anew, a pass counts a run."""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

from harness.results.store import Status, lead_reason
from harness.runtime.failures import example_data, example_from
from harness.runtime.inputs import Example

FORMAT = "harness-failure"
VERSION = 1
FOLDER = "failures"
SHRINK_NOTE = "; shrinking stopped after"  # harness.runtime.shrink_clock's note: not part of what failed


def failure_path(op_dir: Path, cell_id: str) -> Path:
    return Path(op_dir) / FOLDER / f"{cell_id}.json"


def read_failure(op_dir: Path, cell_id: str) -> dict | None:
    """The saved failure of a cell, or None where there is none (or it cannot be read)."""
    path = failure_path(op_dir, cell_id)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("format") == FORMAT else None


def saved_cells(op_dir: Path) -> list[str]:
    return sorted(p.stem for p in (Path(op_dir) / FOLDER).glob("*.json"))


def saved_example(data: dict) -> Example:
    return example_from(data["example"])


def _write(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(data, indent=1, sort_keys=True) + "\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def keep(op_dir: Path, op: str, cell_id: str, outcome) -> bool:
    """After a run of the cell (not a replay): a failure's examples (and inputs) saved, the counts of runs and
    failures carried on; a pass counted where a failure was saved before. True where the cell's failure is saved
    now (its reproduce command is then `--replay`)."""
    rec = outcome.record
    path = failure_path(op_dir, cell_id)
    old = read_failure(op_dir, cell_id)
    runs, failed = (old.get("runs", 0), old.get("failed", 0)) if old else (0, 0)
    lead = outcome.failing[0] if outcome.failing else None
    if rec.status == Status.FAILED and isinstance(lead, Example):
        more = outcome.failing[1:]
        data = {"format": FORMAT, "version": VERSION, "op": op, "cell": cell_id,
                "saved": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "reason": lead_reason(rec), "minimal_example": rec.minimal_example, "example": example_data(lead),
                "more": [{"reason": f.reason, "minimal_example": f.minimal_example,
                          "example": example_data(ex) if isinstance(ex, Example) else None}
                         for f, ex in zip(rec.more_failures or (), more)],
                "runs": runs + 1, "failed": failed + 1, "replays": 0, "reproduced": 0}
        inputs = path.with_suffix(".pt")
        if outcome.inputs is not None:
            inputs.parent.mkdir(parents=True, exist_ok=True)
            inputs.write_bytes(outcome.inputs)
            data["inputs"] = inputs.name
        else:
            inputs.unlink(missing_ok=True)  # another example's
            data["inputs_note"] = outcome.inputs_note or "the example rebuilds them"
        _write(path, data)
        return True
    if old is None or rec.status not in (Status.PASSED, Status.FAILED):
        return False
    # A pass, or a failure with no example to keep (a crash before any example): counted, the saved one kept.
    old.update(runs=runs + 1, failed=failed + (rec.status == Status.FAILED))
    _write(path, old)
    return rec.status == Status.FAILED


def history(data: dict) -> str:
    """How often the cell failed in the runs since its failure was saved, and how its replays went."""
    runs, failed = data.get("runs", 1), data.get("failed", 1)
    words = ("the cell failed in the one run recorded since this failure was saved" if runs == 1 else
             f"the cell failed in {failed} of the {runs} runs recorded since this failure was saved")
    if data.get("replays"):
        words += f"; {data.get('reproduced', 0)} of its {data['replays']} earlier replays reproduced it"
    return words


def replayed(op_dir: Path, cell_id: str, data: dict, rec) -> str:
    """The words of a replay's outcome (reproduced, failed otherwise, did not reproduce), the file's replay counts
    updated."""
    path = failure_path(op_dir, cell_id)
    said = f"replay of {cell_id} ({path}): the saved example {rec.minimal_example or data.get('minimal_example')}"
    lead = data.get("reason", "").split(SHRINK_NOTE, 1)[0]
    now = lead_reason(rec).split(SHRINK_NOTE, 1)[0]
    if rec.status == Status.FAILED:
        said += " failed again: reproduced" if now == lead else \
            f" failed, otherwise than saved (saved: {' '.join(lead.split())[:300]})"
    elif rec.status == Status.PASSED:
        said += f" passed: did not reproduce ({history(data)})"
    else:
        said += f" did not run: {rec.reason}"
    updated = {**data, "replays": data.get("replays", 0) + 1,
               "reproduced": data.get("reproduced", 0) + (rec.status == Status.FAILED and now == lead)}
    _write(path, updated)
    return said
