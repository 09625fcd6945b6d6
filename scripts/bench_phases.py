"""Where one plan's benchmark items spend their wall time, by phase: compiles, each implementation's timing (and,
indented, the steps inside it: estimates, graph capture, the timed samples, the launch-inclusive samples), the
checks after timing, input sets. The items run one after another in this process (no pytest, no precompile step),
with harness.runtime.bench's and harness.runtime.timing's functions wrapped in wall clocks (no profiler);
docs/performance.md and docs/changelog.md read from it.

    python scripts/bench_phases.py PLAN [MAX_ITEMS] [RECORDS.json] [NAME=VALUE ...] [field=value ...]

NAME=VALUE overrides a harness.runtime.timing or harness.runtime.bench.* constant for the run (e.g. TARGET_MS=10.0 \
"EAGER_SAMPLES=(50,200)"), to see
what a timing budget costs and what it does to the intervals: the median relative width of the speedups against
each baseline is printed, and RECORDS.json gets every item's speedups. A lower-case field=value keeps the items
whose BenchSpec field has that value (graph_mode=cuda_graph, dtype=bf16, phase=decode).
"""

import ast
import collections
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import harness.runtime.implementations as hi  # noqa: E402
import harness.runtime.bench.measure as hm  # noqa: E402
import harness.runtime.bench.specs as hs  # noqa: E402
from harness.decisions.speedups import baselines, shape_speedup  # noqa: E402
from harness.runtime.device import detect  # noqa: E402
from harness.plan.load import load_plan  # noqa: E402
import harness.runtime.timing as ht  # noqa: E402
from harness.runtime.tasks import BenchTask  # noqa: E402

spent: dict[str, float] = collections.defaultdict(float)
count: collections.Counter = collections.Counter()
impl_of: dict[int, str] = {}  # id of an implementation's call -> its name
context: list[str] = []  # the timing in progress, which its steps are filed under


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def clocked(fn, label):
    """`fn` with its wall time (device work included) added to spent[label(*args)]."""
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            _sync()
            name = label(*args, **kwargs)
            spent[name] += time.perf_counter() - start
            count[name] += 1
    return wrapper


def _timing_label(call, sets, device, graph=False) -> str:
    return f"time {impl_of.get(id(call), 'copy-bandwidth probe')} {'graph' if graph else 'eager'}"


def instrument() -> None:
    implementations, compiled_reference = hm.implementations, hi.compiled_reference

    def named_implementations(plan, device, spec=None):
        impls = implementations(plan, device, spec)
        impl_of.update({id(call): name for name, call in impls.items() if callable(call)})
        return impls

    def first_call_clocked(reference, shape):
        """The compiled reference, its first call (Dynamo, Inductor, Triton, autotuning) clocked as the compile."""
        fn = compiled_reference(reference, shape)
        if getattr(fn, "clocked", False):
            return fn
        state = {"first": True}

        def call(*args, **kwargs):
            if not state["first"]:
                return fn(*args, **kwargs)
            state["first"] = False
            # Inside a timing (its first call) it is a step of that timing, not a phase beside it: counted once.
            return clocked(fn, lambda *a, **k: f"  {context[-1]}: compile (first call)" if context
                           else "compile (first call)")(*args, **kwargs)
        call.clocked = True
        hi._compiled_cache[(reference, shape)] = call  # later items of the shape get this one
        return call

    hm.implementations, hi.compiled_reference = named_implementations, first_call_clocked
    time_calls = hm.time_calls

    def time_calls_by_step(call, sets, device, graph=False):
        """One timing, and inside it the steps of that timing: estimates, capture, samples, launch samples."""
        context.append(_timing_label(call, sets, device, graph))
        try:
            return time_calls(call, sets, device, graph)
        finally:
            context.pop()
    hm.time_calls = ht.time_calls = clocked(time_calls_by_step, _timing_label)  # copy_bandwidth_gbps calls ht's
    for name in ("_estimate", "_events_host_ahead", "_isolated_calls"):
        setattr(ht, name, clocked(getattr(ht, name), lambda *a, name=name, **k: f"  {context[-1]}: {name}"))
    graph = torch.cuda.graph

    class captured(graph):  # torch.cuda.graph is a class; its capture ends in __exit__
        def __enter__(self):
            self.clock = time.perf_counter()
            return super().__enter__()

        def __exit__(self, *exc):
            out = super().__exit__(*exc)
            where = f"  {context[-1]}: capture" if context else "capture (checks, launch counts)"
            spent[where] += time.perf_counter() - self.clock
            count[where] += 1
            return out
    torch.cuda.graph = captured
    for name in ("check", "count_launches", "input_sets"):
        setattr(hm, name, clocked(getattr(hm, name), lambda *a, name=name, **k: name))
    hm.CheckInputs.build = classmethod(clocked(hm.CheckInputs.build.__func__, lambda *a, **k: "CheckInputs.build"))


def main() -> int:
    args = [a for a in sys.argv[1:] if "=" not in a]
    keep = {}
    for assignment in (a for a in sys.argv[1:] if "=" in a):
        name, value = assignment.split("=", 1)
        if name.islower():
            keep[name] = value
            continue
        module = next((m for m in (ht, hm, hi, hs) if hasattr(m, name)), hm)
        setattr(module, name, ast.literal_eval(value))
        print("set", name, "=", getattr(module, name))
    instrument()
    plan = load_plan(args[0])
    specs = [s for s in hs.bench_specs(plan, detect().sm)
             if all(str(getattr(s, name)) == value for name, value in keep.items())]
    specs = specs[: int(args[1]) if len(args) > 1 else None]
    records, per_item = {}, []
    start = time.perf_counter()
    for spec in specs:
        t = time.perf_counter()
        out = hm.run_benchmark(BenchTask(plan, spec))
        shapes = {k: shape_speedup(out.record, k) for k in baselines(out.record)}
        records[spec.id] = {k: [v.value, v.low, v.high] for k, v in shapes.items() if v is not None}
        per_item.append((time.perf_counter() - t, spec.id))
    total = time.perf_counter() - start
    print(f"total {total:.1f} s for {len(specs)} items")
    top = sum(v for k, v in spent.items() if not k.startswith(" "))
    print(f"{'outside the clocked phases':32s} {total - top:8.2f} s")
    for name in sorted(spent, key=spent.get, reverse=True):
        print(f"{name:32s} {spent[name]:8.2f} s  n={count[name]}")
    for base in ("compiled", "native", "vllm"):
        widths = [(high - low) / value for r in records.values() for k, (value, low, high) in r.items() if k == base]
        if widths:
            print(f"width vs {base}: median {100 * statistics.median(widths):.2f}% "
                  f"mean {100 * statistics.mean(widths):.2f}% n={len(widths)}")
    if len(args) > 2:
        Path(args[2]).write_text(json.dumps(records))
    print("slowest items:")
    for seconds, item in sorted(per_item, reverse=True)[:15]:
        print(f"  {seconds:6.2f} {item}")
    from torch._dynamo.utils import compile_times

    print(compile_times(repr="str", aggregate=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
