"""What keeps the checks' versions honest: per check, a hash of the code that can change its results, and the
committed manifest of those hashes beside the versions (checks_manifest.json, tests/test_checks_manifest.py).

A check's code is the import closure of the module that declares it (harness.results.checks) inside harness/: every
harness module it imports, at any depth, lazy imports inside functions included, with the `__init__.py` of each
package on the way (Python runs them); Triton's interpreter made faithful (harness/interpreter/) counts in the
interpreter check's alone, as it computes only on a CPU machine, where that check applies (INTERPRETER). Each module
counts by its AST with docstrings and the `CHECK_VERSIONS` literal left out, so comments, blank lines, formatting
and docstrings change no hash, and neither does raising a version (which would otherwise change the hash of every
check whose closure holds that module); a rename or a logic change does. Data a module reads from a folder beside it
(vllm/plugin_templates/, named in plugin_source.py as a string) counts by its raw text.

When a hash changes and the version did not, the manifest no longer matches: either the version rises (results may
differ) or `python -m harness manifest` rewrites the manifest (a refactor; results stand).

Plain Python: modules are parsed, never imported (no torch here).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
from pathlib import Path

from harness.results.checks import CHECKS, HARNESS_DIR, VERSION_LITERALS, declared_versions

MANIFEST = HARNESS_DIR / "results" / "checks_manifest.json"
PACKAGE = "harness"

# Modules under VERDICT_DIRS that change no verdict, each with why: they export, document, warn or warm caches.
# Every other module there must lie in some check's closure (uncovered_modules), so that new code that can change a
# result cannot escape the manifest.
VERDICT_DIRS = ("runtime", "interpreter", "vllm", "vllm_facts", "plan")
NO_VERDICT = {
    "plan/schema.py": "the plan file's JSON Schema export (python -m harness schema)",
    "plan/field_docs.py": "the plan fields in words (python -m harness fields, the README, the schema's hover text)",
    "runtime/mutants.py": "validate's wrong kernels made from the reference: they refuse a plan, in no record",
    "runtime/check_code.py": "warnings about a plan's code (validate's child, the run's start): printed, in no record",
    "runtime/preflight.py": "validate's run of the reference at the plan's sizes and on TP shards: it refuses a plan, "
                            "in no record",
    "runtime/upcast.py": "one of check_code's warnings (a native baseline computing in fp32): printed, in no record",
    "runtime/worker_preload.py": "the fork server's preload: imports, and workers.start_up() (fault isolation's "
                                 "closure) run ahead of the fork; each child runs start_up again",
    "runtime/bench/precompile.py": "warms Inductor's and Triton's caches before benchmarks; each item compiles and "
                                   "is checked on its own, and the autotuning done here is deleted again",
}


# Triton's interpreter made faithful (harness/interpreter/) is the interpreter check's code alone: it computes only
# where kernels run in Triton's interpreter, on a CPU machine, and that check applies to every record made there (CPU
# cells and integration items). Other checks' closures leave the package out where their modules reach it (the
# workers' and the engine probe's make_faithful(), the runner's and the modes' unfaithful(): on a GPU one patches
# nothing and the other finds nothing), so that a change to a patch stales CPU records and nothing else
# (tests/test_checks_manifest.py). The modules named here are the exception, each with why: code of theirs runs on a
# GPU too, so they count wherever they are imported.
INTERPRETER = "interpreter/"
INTERPRETER_ON_EVERY_MACHINE = {
    "interpreter/sites.py": "shown_path names the file of whatever a kernel raised, on a GPU too (runtime/runner.py)",
}


def _strip(tree: ast.Module) -> ast.Module:
    """The tree without docstrings (module, class, function) and without the top-level version literals."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                node.body = node.body[1:]
    tree.body = [n for n in tree.body if not _declares_versions(n)]
    return tree


def _declares_versions(node: ast.stmt) -> bool:
    targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) \
        else []
    return any(isinstance(t, ast.Name) and t.id in VERSION_LITERALS for t in targets)


def normalized_source(path: Path | str) -> str:
    """A module's code as it computes: its AST without docstrings or the CHECK_VERSIONS literal, no positions."""
    return _normalized(Path(path).read_text())


# Cached by the source text (so never stale): each check's closure parses the same modules again.
@functools.cache
def _normalized(text: str) -> str:
    return _dump(_strip(ast.parse(text)))


def _dump(node) -> str:
    """The tree as text, alike on every Python that parses it alike: fields left empty are left out, as newer Pythons
    add empty ones (3.12's type_params) and ast.dump writes them; ast.unparse is no help, it quotes f-strings
    differently from one Python to the next. A fingerprint taken on a GPU machine's Python must equal a CPU
    machine's."""
    if isinstance(node, ast.AST):
        fields = ((name, _dump(getattr(node, name, None))) for name in node._fields)
        return f"{type(node).__name__}(" + ",".join(f"{k}={v}" for k, v in fields if v not in ("None", "[]")) + ")"
    if isinstance(node, list):
        return "[" + ",".join(_dump(item) for item in node) + "]"
    return repr(node)


@functools.cache
def _parsed(text: str) -> tuple[list[tuple[int, str, tuple[str, ...]]], set[str]]:
    """A module's imports anywhere in it, as (level, module, names) (level -1: `import module`), and its string
    constants that could name a folder."""
    imports, strings = [], set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            imports += [(-1, alias.name, ()) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            imports.append((node.level, node.module or "", tuple(alias.name for alias in node.names)))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.isidentifier():
            strings.add(node.value)
    return imports, strings


def _module_file(dotted: str, root: Path) -> str | None:
    """harness.a.b → "a/b.py" or "a/b/__init__.py" (relative to root), or None where it is no harness module."""
    parts = dotted.split(".")
    if parts[0] != PACKAGE:
        return None
    base = root.joinpath(*parts[1:])
    if (base / "__init__.py").is_file():
        return (base / "__init__.py").relative_to(root).as_posix()
    if base.with_suffix(".py").is_file() and len(parts) > 1:
        return base.with_suffix(".py").relative_to(root).as_posix()
    return None


def _with_packages(dotted: str, root: Path) -> list[str]:
    """The module's file and the __init__.py of every package above it: importing harness.a.b runs harness/a's."""
    parts = dotted.split(".")
    found = [_module_file(".".join(parts[:i]), root) for i in range(1, len(parts) + 1)]
    return [f for f in found if f]


def _imports(rel: str, root: Path) -> set[str]:
    """The harness files one module imports (anywhere in it, lazy imports included), relative to root."""
    package = [PACKAGE, *Path(rel).parent.parts]  # this module's package, for relative imports
    found: set[str] = set()
    for level, module, names in _parsed((root / rel).read_text())[0]:
        if level == -1:
            found.update(_with_packages(module, root))
            continue
        # Relative: level 1 is this package, each further level one package up.
        base = ".".join(package[:len(package) - level + 1] + ([module] if module else [])) if level else module
        found.update(_with_packages(base, root))
        for name in names:
            # `from harness.a import b` where b is a submodule imports harness/a/b.py too.
            sub = _module_file(f"{base}.{name}", root)
            if sub:
                found.add(sub)
    return found


def _data_files(rel: str, root: Path) -> list[str]:
    """Files in a data folder (a folder beside the module with no __init__.py) that the module names as a string:
    the plugin's templates, which plugin_source.py reads."""
    here = (root / rel).parent
    found = []
    for name in sorted(_parsed((root / rel).read_text())[1]):
        folder = here / name
        if folder.is_dir() and not (folder / "__init__.py").exists():
            found += [p.relative_to(root).as_posix() for p in sorted(folder.iterdir()) if p.is_file()]
    return found


def import_closure(module_rel: str, root: Path = HARNESS_DIR) -> list[str]:
    """The module's transitive import closure inside harness/ (itself included), relative to harness/, sorted; with
    the data files its modules read (see _data_files). Outside harness/interpreter/, the closure leaves that package
    out but INTERPRETER_ON_EVERY_MACHINE (see INTERPRETER)."""
    seen: set[str] = set()
    todo = [module_rel, *_with_packages(".".join([PACKAGE, *Path(module_rel).with_suffix("").parts]), root)]
    elsewhere = not module_rel.startswith(INTERPRETER)  # a check outside the interpreter: its modules left out
    while todo:
        rel = todo.pop()
        if rel in seen or (elsewhere and rel.startswith(INTERPRETER) and rel not in INTERPRETER_ON_EVERY_MACHINE):
            continue
        seen.add(rel)
        if rel.endswith(".py"):
            todo += _imports(rel, root) - seen
            seen.update(_data_files(rel, root))
    return sorted(seen)


def code_hash(module_rel: str, root: Path = HARNESS_DIR) -> str:
    """12 hex digits of the sha256 of the closure's modules, each as its path and normalized source (data files by
    their raw text): the path too, so that moving code between modules changes the hash."""
    digest = hashlib.sha256()
    for rel in import_closure(module_rel, root):
        path = root / rel
        text = normalized_source(path) if rel.endswith(".py") else path.read_text()
        digest.update(rel.encode() + b"\0" + text.encode() + b"\0")
    return digest.hexdigest()[:12]


def manifest_now(root: Path = HARNESS_DIR) -> dict[str, dict]:
    """Per check, its version now and its code hash now: what the manifest would hold if written now."""
    hashes: dict[str, str] = {}  # several checks share a module
    out = {}
    for check in CHECKS:
        if check.module not in hashes:
            hashes[check.module] = code_hash(check.module, root)
        # Uncached: the files as they are now, not as this process first read them.
        versions = declared_versions.__wrapped__(check.module, root)
        out[check.name] = {"version": versions[check.name], "code": hashes[check.module]}
    return out


def _manifest_path(root: Path) -> Path:
    return root / MANIFEST.relative_to(HARNESS_DIR)


def read_manifest(root: Path = HARNESS_DIR) -> dict[str, dict]:
    """The committed manifest ({} where there is none)."""
    path = _manifest_path(root)
    return json.loads(path.read_text()) if path.is_file() else {}


def write_manifest(root: Path = HARNESS_DIR) -> list[str]:
    """Writes the manifest for the tree now; returns what changed, one line per check ("values: code a1b2 → c3d4",
    "values: version 1 → 2", "values: added", "values: removed")."""
    old, new = read_manifest(root), manifest_now(root)
    changes = []
    for name, entry in new.items():
        was = old.get(name)
        if was is None:
            changes.append(f"{name}: added (version {entry['version']}, code {entry['code']})")
            continue
        parts = [f"{key} {was.get(key)} → {entry[key]}" for key in ("version", "code") if was.get(key) != entry[key]]
        if parts:
            changes.append(f"{name}: {', '.join(parts)}")
    changes += [f"{name}: removed" for name in old if name not in new]
    _manifest_path(root).write_text(json.dumps(new, sort_keys=True, indent=1) + "\n")
    return changes


def manifest_problems(root: Path = HARNESS_DIR) -> list[str]:
    """Where the committed manifest and the tree disagree, one readable line each; [] when they agree."""
    if not _manifest_path(root).is_file():
        return [f"no manifest at harness/{_manifest_path(root).relative_to(root).as_posix()}: "
                "run `python -m harness manifest`"]
    old, new = read_manifest(root), manifest_now(root)
    modules = {c.name: c.module for c in CHECKS}
    rewrite = "run `python -m harness manifest` to record it"
    problems = []
    for name, entry in new.items():
        module, was = f"harness/{modules[name]}", old.get(name)
        if was is None:
            problems.append(f"check {name!r} ({module}) is not in the manifest: {rewrite}")
        elif entry["version"] < was["version"]:
            problems.append(f"check {name!r} ({module}): its version went down from {was['version']} to "
                            f"{entry['version']}: a version only rises (records made since would read as current)")
        elif entry["version"] > was["version"]:
            problems.append(f"check {name!r} ({module}): its version rose from {was['version']} to "
                            f"{entry['version']} and the manifest still holds {was['version']}: {rewrite}")
        elif entry["code"] != was["code"]:
            problems.append(f"check {name!r} ({module} and its imports): its code changed but its version did not: "
                            f"raise CHECK_VERSIONS[{name!r}] in {module} if its results may differ, or run "
                            "`python -m harness manifest` if this is a refactor (results stand)")
    problems += [f"the manifest holds check {name!r}, which no longer exists: run `python -m harness manifest`"
                 for name in old if name not in new]
    return problems


def uncovered_modules(root: Path = HARNESS_DIR) -> list[str]:
    """Modules that can change a verdict (every .py under VERDICT_DIRS but NO_VERDICT's) in no check's closure."""
    covered = set().union(*(import_closure(m, root) for m in {c.module for c in CHECKS}))
    candidates = (p.relative_to(root).as_posix() for d in VERDICT_DIRS for p in (root / d).rglob("*.py"))
    return sorted(rel for rel in candidates if rel not in covered and rel not in NO_VERDICT)
