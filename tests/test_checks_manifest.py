"""The checks' versions kept honest: the committed manifest (harness/results/checks_manifest.json) holds each check's
version and the hash of its code (the import closure of its module inside harness/, docstrings and comments left
out); a change to that code fails here until the check's version rises or the manifest is rewritten. Edits are
made on a copy of harness/ in tmp_path, never on the real files."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from pathlib import Path

from harness.results.checks import CHECKS, HARNESS_DIR, Subject
from harness.results.code_hash import (INTERPRETER_ON_EVERY_MACHINE, NO_VERDICT, code_hash, import_closure,
                                       manifest_now, manifest_problems, read_manifest, uncovered_modules,
                                       write_manifest)

COMPARISON = "count > allowed"


def harness_copy(tmp_path: Path) -> Path:
    """A copy of harness/ with its manifest written for the copy as it is (the real one may lag the tree while
    someone edits it; these tests are about what an edit does)."""
    root = tmp_path / "harness"
    shutil.copytree(HARNESS_DIR, root, ignore=shutil.ignore_patterns("__pycache__"))
    write_manifest(root)
    return root


def edit(root: Path, rel: str, old: str, new: str, every: bool = False) -> None:
    """`old` replaced by `new` in the copy's module `rel`: its first occurrence, or every one."""
    path = root / rel
    text = path.read_text()
    assert old in text, f"harness/{rel} no longer holds {old!r}: update this test"
    path.write_text(text.replace(old, new, -1 if every else 1))


def closure_checks(root: Path, rel: str) -> set[str]:
    """The checks whose code includes the module `rel`."""
    return {c.name for c in CHECKS if rel in import_closure(c.module, root)}


def test_committed_manifest_matches_the_tree():
    """Every check's code hash and version now are the manifest's: a changed check raised its version, or was a
    refactor and the manifest rewritten (`python -m harness manifest`)."""
    problems = manifest_problems()
    assert problems == [], "the checks' manifest does not match the code:\n" + "\n".join(problems)


def test_every_module_that_can_change_a_verdict_belongs_to_a_check():
    """Every module under runtime/, interpreter/, vllm/ and plan/ lies in some check's closure, or NO_VERDICT says
    why it changes no verdict: new code that can change a result cannot escape the manifest."""
    uncovered = uncovered_modules()
    assert uncovered == [], ("modules that can change a verdict in no check's import closure: import them from a "
                             "check's module, or add them to NO_VERDICT in harness/results/code_hash.py with why: "
                             f"{uncovered}")


def test_no_verdict_lists_only_modules_that_need_it():
    """Each NO_VERDICT entry names a module that exists and that no check's closure holds (else the entry is dead)."""
    covered = set().union(*(import_closure(c.module) for c in CHECKS))
    assert [rel for rel in NO_VERDICT if not (HARNESS_DIR / rel).is_file()] == []
    assert [rel for rel in NO_VERDICT if rel in covered] == []


def test_closure_follows_every_kind_of_import(tmp_path):
    """Absolute, `from package import submodule`, relative and function-level imports are followed, each package's
    __init__.py counted; a data folder a module names (plugin_templates) counts by its files."""
    root = tmp_path / "harness"
    for rel, text in {
        "__init__.py": "",
        "a/__init__.py": "",
        "a/top.py": "import harness.a.plain\nfrom harness.b import sub\nfrom .rel import x\n"
                    "def f():\n    from harness.c.lazy import y\n",
        "a/plain.py": "",
        "a/rel.py": "x = 1\n",
        "a/unused.py": "",
        "b/__init__.py": "",
        "b/sub.py": "from ..c import deep\n",
        "c/__init__.py": "",
        "c/lazy.py": "y = 2\n",
        "c/deep.py": "import os\nFOLDER = 'deep_templates'\n",
        "c/deep_templates/one.py.tmpl": "$x\n",
    }.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    assert import_closure("a/top.py", root) == [
        "__init__.py", "a/__init__.py", "a/plain.py", "a/rel.py", "a/top.py", "b/__init__.py", "b/sub.py",
        "c/__init__.py", "c/deep.py", "c/deep_templates/one.py.tmpl", "c/lazy.py"]
    assert "vllm/plugin_templates/ir.py.tmpl" in import_closure("vllm/routes.py")


def test_formatting_comments_and_docstrings_change_no_hash(tmp_path):
    """Reformatting a module, editing its docstrings and comments, and raising a version (the CHECK_VERSIONS
    literal is no code) leave every check's code hash as it was."""
    root = harness_copy(tmp_path)
    before = manifest_now(root)
    numerics = root / "runtime/numerics.py"
    text = numerics.read_text()
    # Reformatted: blank lines, a line split inside brackets, a trailing comment.
    text = text.replace("\n\n\n", "\n\n\n\n").replace(COMPARISON, "(count >  # why not\n        allowed)")
    text = text.replace('"""Comparing one output with the reference', '"""Comparing, in other words, one output with '
                                                                       'the reference')
    text = text.replace('"""Worst errors seen over a cell\'s examples."""', '"""The worst errors a cell saw."""')
    numerics.write_text("# a comment at the top\n" + text)
    edit(root, "plan/model.py", '"""', '"""Also: ')  # a docstring of a module in nearly every closure
    edit(root, "runtime/numerics.py", '"quantized steps": 2', '"quantized steps": 3')
    after = manifest_now(root)
    assert {n: e["code"] for n, e in after.items()} == {n: e["code"] for n, e in before.items()}
    assert after["quantized steps"]["version"] == before["quantized steps"]["version"] + 1


def test_a_renamed_private_function_asks_for_a_manifest_rewrite(tmp_path):
    """A rename is code: the checks whose closure holds the module change hash and manifest_problems names them;
    `python -m harness manifest` (write_manifest) then clears it with no version changed."""
    root = harness_copy(tmp_path)
    before = manifest_now(root)
    edit(root, "runtime/accumulation.py", "_rms(", "_root_mean_square(", every=True)
    holding = closure_checks(root, "runtime/accumulation.py")
    assert "accumulation" in holding and "tf32" not in holding
    after = manifest_now(root)
    assert {n for n in after if after[n]["code"] != before[n]["code"]} == holding
    problems = manifest_problems(root)
    assert len(problems) == len(holding)
    for name in holding:
        assert any(f"check {name!r}" in p and "its code changed but its version did not" in p for p in problems)
    changes = write_manifest(root)
    assert len(changes) == len(holding) and not any("version" in line for line in changes)
    assert manifest_problems(root) == []
    assert {n: e["version"] for n, e in read_manifest(root).items()} == {n: e["version"] for n, e in before.items()}


def test_a_changed_comparison_needs_its_version_raised(tmp_path):
    """`>` made `>=` in the quantized-steps check is a problem naming the check and its module until its version
    rises; raising CHECK_VERSIONS there and rewriting the manifest clears it."""
    root = harness_copy(tmp_path)
    edit(root, "runtime/numerics.py", COMPARISON, "count >= allowed")
    problems = manifest_problems(root)
    quantized = [p for p in problems if "check 'quantized steps'" in p]
    assert len(quantized) == 1
    assert "harness/runtime/numerics.py" in quantized[0] and "its version did not" in quantized[0]
    assert "CHECK_VERSIONS['quantized steps']" in quantized[0]

    edit(root, "runtime/numerics.py", '"quantized steps": 2', '"quantized steps": 3')
    quantized = [p for p in manifest_problems(root) if "check 'quantized steps'" in p]
    assert len(quantized) == 1 and "version rose from 2 to 3" in quantized[0] and "python -m harness manifest" \
        in quantized[0]
    changes = write_manifest(root)
    assert any(line.startswith("quantized steps: version 2 → 3, code ") for line in changes)
    assert manifest_problems(root) == []
    assert read_manifest(root)["quantized steps"]["version"] == 3


def test_manifest_entries_out_of_step_are_problems(tmp_path):
    """A version lower than the manifest's, a check the manifest lacks, and an entry for a check that no longer
    exists each make one problem; no manifest at all is one too."""
    root = harness_copy(tmp_path)
    manifest = read_manifest(root)
    manifest["values"]["version"] += 1
    del manifest["tf32"]
    manifest["retired check"] = {"version": 3, "code": "0123456789ab"}
    (root / "results/checks_manifest.json").write_text(json.dumps(manifest))
    problems = manifest_problems(root)
    assert len(problems) == 3, problems
    assert re.search(r"check 'values' .*version went down from 2 to 1", problems[0])
    assert "check 'tf32' (harness/runtime/tf32.py) is not in the manifest" in problems[1]
    assert "'retired check', which no longer exists" in problems[2]
    (root / "results/checks_manifest.json").unlink()
    assert len(manifest_problems(root)) == 1 and "no manifest" in manifest_problems(root)[0]


def on_a_gpu(check) -> bool:
    """Whether the check applies to some record made on a GPU (any section, axis or flag)."""
    flags = [f.name for f in dataclasses.fields(Subject) if f.type in (bool, "bool")]
    return any(check.applies(Subject(section, "sm90", dtype, tp, mode, route, **dict.fromkeys(flags, flag)))
               for section in ("cells", "integration", "benchmarks") for dtype in ("fp32", "bf16") for tp in (1, 2)
               for mode in ("eager", "torch_compile", "cuda_graph", "memcheck")
               for route in ("", "ir", "fusion", "engine", "attention_backend") for flag in (False, True))


def test_a_change_to_the_interpreters_patches_stales_cpu_records_only(tmp_path):
    """Triton's interpreter made faithful (harness/interpreter/) computes only on a CPU machine: a change to any of
    its modules (the patches, what they raise, the package's own) changes the interpreter check's hash and no hash of
    a check that applies on a GPU, though the workers, the runner and vLLM's engine probe import it. Its modules that
    a GPU's records use too (INTERPRETER_ON_EVERY_MACHINE) count where they are imported."""
    root = harness_copy(tmp_path)
    assert not on_a_gpu(next(c for c in CHECKS if c.name == "interpreter"))
    assert on_a_gpu(next(c for c in CHECKS if c.name == "cell runner"))
    patches = sorted(p.relative_to(root).as_posix() for p in (root / "interpreter").glob("*.py")
                     if p.relative_to(root).as_posix() not in INTERPRETER_ON_EVERY_MACHINE)
    assert {"interpreter/__init__.py", "interpreter/faithful.py", "interpreter/lang.py", "interpreter/libdevice.py",
            "interpreter/unfaithful.py"} <= set(patches)
    # The harness's other modules do import the package (the workers, the runner: else this test proves nothing).
    elsewhere = "".join(p.read_text() for p in root.rglob("*.py") if not p.is_relative_to(root / "interpreter"))
    imported = {rel for rel in patches
                if f"harness.{Path(rel).with_suffix('').as_posix().replace('/', '.')}".removesuffix(".__init__")
                in elsewhere}
    assert {"interpreter/__init__.py", "interpreter/unfaithful.py"} <= imported
    edits = {"interpreter/faithful.py": ("np.uint32(0x7FFF)", "np.uint32(0x7FFE)"),  # rounding to bf16
             "interpreter/lang.py": ('"mov.b32 $0, $1;", ', ""),  # an inline asm it computes
             "interpreter/unfaithful.py": ("exc.__cause__ or exc.__context__", "exc.__cause__")}
    for rel in patches:
        before = manifest_now(root)
        if rel in edits:
            edit(root, rel, *edits[rel])
        else:
            (root / rel).write_text((root / rel).read_text() + "\n\ndef _edited():\n    return 1\n")
        after = manifest_now(root)
        changed = {n for n in after if after[n]["code"] != before[n]["code"]}
        assert changed == {"interpreter"}, (rel, changed)
        assert not any(on_a_gpu(c) for c in CHECKS if c.name in changed)
    for rel in INTERPRETER_ON_EVERY_MACHINE:
        assert "cell runner" in closure_checks(root, rel), f"harness/{rel} is imported by no check on a GPU: " \
                                                           "drop it from INTERPRETER_ON_EVERY_MACHINE"


def test_checks_sharing_a_module_share_its_hash():
    """The four numerics checks are one module's code: one hash."""
    now = manifest_now()
    assert len({now[n]["code"] for n in ("values", "nan origin", "unchanged inputs", "quantized steps")}) == 1
    assert now["values"]["code"] == code_hash("runtime/numerics.py")


def test_the_normalized_code_is_alike_on_every_python():
    """A GPU machine's Python (3.12) adds empty fields to the tree (a function's type_params) that 3.11's lacks, and
    ast.unparse quotes f-strings differently across versions: the normalized text leaves empty fields out, so a
    fingerprint taken on one Python equals another's."""
    import ast

    from harness.results.code_hash import _dump

    tree = ast.parse('def f(x):\n    return f"{x!r} in {\'a\'}"\n')
    bare = _dump(tree)
    tree.body[0].type_params = []  # as 3.12 parses it
    assert _dump(tree) == bare and "type_params" not in bare
