"""In-repo runs load the plugin from the source tree (installed, it also loads through its pytest11 entry
point, registered under the same name, so it is loaded once either way).

On a machine without CUDA the Triton interpreter is switched on here (TRITON_INTERPRET=1, which must precede
triton's first import, and which every worker and pytest run the tests start inherits), but not made faithful: as in
`pytest --plan`, whose main process runs no kernel, the patches (harness.interpreter.make_faithful) are applied only
where kernels run: in the workers, and in the test modules that call kernels in this process, through the
`faithful_interpreter` fixture below (`pytestmark = pytest.mark.usefixtures("faithful_interpreter")`).
"""

import os
import sys

# Bytecode cached across the suite's processes. Where Python writes none (PYTHONDONTWRITEBYTECODE, as on this
# machine image), every pytest process the tests start (a pytester run, `pytest --plan` in a subprocess) compiles
# the harness's sources again and assertion-rewrites every module of every pytest plugin's package (hypothesis,
# pytest-benchmark, anyio, ...) again, and every worker it spawns compiles the harness's sources again: about 3 s
# of a 2-core CPU machine's 11 s per `pytest --plan ... --collect-only`. Cleared here, before the workers and
# subprocesses start (they inherit it) and before this process imports torch and the harness.
if os.environ.pop("PYTHONDONTWRITEBYTECODE", None) is not None:
    sys.dont_write_bytecode = False

import pytest

from harness.interpreter import switch_on

switch_on()  # the environment variable only: nothing of triton is patched in this process

pytest_plugins = ["harness.plugin", "pytester"]

# What a test's pytester runs keep imported: pytester drops every module first imported during an in-process run
# (`runpytest_inprocess`, which many tests use to skip a fresh interpreter's imports of torch and the harness) and
# during the test. Dropped and imported again, the harness's plan schema gets new classes its checks do not know (a
# valid plan rejected), torch's and the kernels' modules register their ops a second time (torch raises), sympy's
# classes stop comparing. Only what the test's runs imported from its own folder (a user's kernels and test files,
# which the next test may write again under the same names) is dropped.
@pytest.fixture
def pytester(pytester, tmp_path_factory):
    from _pytest.pytester import SysModulesSnapshot  # pytester's own snapshot, with our rule of what stays

    temp = str(tmp_path_factory.getbasetemp())

    def elsewhere(name: str) -> bool:
        return not (getattr(sys.modules.get(name), "__file__", None) or "").startswith(temp)

    pytester._sys_modules_snapshot = SysModulesSnapshot(preserve=elsewhere)  # restored at the test's end
    pytester._Pytester__take_sys_modules_snapshot = lambda: SysModulesSnapshot(preserve=elsewhere)  # each run's
    return pytester


@pytest.fixture(scope="session")
def faithful_interpreter():
    """Triton's interpreter in this process made to compute what a GPU computes, as it is in every worker: for the
    tests that call kernels here (on a CUDA machine, a no-op). Applied once, for the rest of this process; returns
    what the probe still finds unfaithful ({} when nothing)."""
    from harness.interpreter import make_faithful

    return make_faithful()


def _interpreted() -> set:
    """The @triton.jit functions Triton's interpreter has run in this process (its cache of their rewritten code)."""
    interp = sys.modules.get("triton.runtime.interpreter")
    return set(getattr(getattr(interp, "InterpretedFunction", None), "rewritten_fn", None) or ())


@pytest.fixture(autouse=True)
def _kernels_here_run_faithful(request):
    """A test that runs a kernel in this process without asking for faithful_interpreter fails: it would run it in
    Triton's interpreter as shipped (unless a test before it in this process happened to ask), which computes bf16
    and fp8 unlike a GPU, and in which no worker runs a kernel. Seen by the interpreter's cache of the functions it
    ran: a kernel this process ran before is not seen again."""
    before = _interpreted()
    yield
    ours = ("triton", "harness.interpreter")  # triton's own device functions, the probe's kernels
    ran = {fn for fn in _interpreted() - before if not (fn.__module__ or "").startswith(ours)}
    if ran and "faithful_interpreter" not in request.fixturenames:
        names = ", ".join(sorted(f"{fn.__module__}.{fn.__name__}" for fn in ran))
        pytest.fail(f"{request.node.nodeid} ran kernels in this process ({names}) without the faithful_interpreter "
                    "fixture (pytestmark = pytest.mark.usefixtures(\"faithful_interpreter\")): a worker runs them in "
                    "Triton's interpreter made faithful", pytrace=False)


@pytest.fixture
def run_plan(pytester, monkeypatch):
    """`run_plan(plan, *args)`: `pytest --plan plan` in pytester's folder and this process (a fresh interpreter would
    import torch and the harness again), under the ci profile, its reports in pytester's folder."""
    monkeypatch.setenv("PYTHONPATH", os.path.dirname(os.path.abspath(__file__)))

    def run(plan, *args: str):
        return pytester.runpytest_inprocess("-p", "harness.plugin", "--plan", str(plan), "--plan-profile", "ci",
                                            "--reports-dir", str(pytester.path / "reports"), "-p", "no:cacheprovider",
                                            *args)
    return run


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """`--dist loadgroup` (scripts/test.sh) sends the items of one `xdist_group` to one worker by the `@<group>`
    suffix its worker hook appends to their node ids. pytest-xdist 3.8 appends it by setting `item._nodeid`, which
    pytest 9.2's structured node ids no longer read (pytest-dev/pytest-xdist#1386): nothing fails, the groups are
    simply dealt out like any item, and tests/test_engine.py's engines start once on each worker. Where the suffix
    did not take, it is set here, after xdist's hook; where it did (an older pytest or a fixed xdist), nothing is
    done. tests/test_engine.py checks that every grouped test carries it."""
    if not getattr(config.option, "loadgroup", False):  # set on xdist's workers under --dist loadgroup
        return
    for item in items:
        names = {str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                 for m in item.iter_markers("xdist_group")}
        suffix = "@" + "_".join(sorted(names))
        if names and not item.nodeid.endswith(suffix) and hasattr(item, "_id"):
            item._id = type(item._id).parse(item.nodeid + suffix)
