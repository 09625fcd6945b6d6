"""vLLM's fusion pass over vLLM's own layers, per profile: does its pattern match, which kernel the fused node calls.

The method of vLLM's own fusion tests (tests/compile/passes/test_fusion.py, test_silu_mul_quant_fusion.py):
vLLM's layers in sequence (RMSNorm → QuantFP8, SiluAndMul → QuantFP8) are compiled by Inductor with
vLLM's pass as the post-grad pass, after vLLM's no-op elimination and before its clean-up; the graph
is read before and after the pass, the pass's `matched_count` says how many sequences it rewrote, and
the ops new in the graph after it are the kernels the fused nodes call. The fused graph's output must
match the same layers compiled without the pass.

Where vLLM cannot run the pass (its CPU build registers none of the fused kernels the pass rewrites to,
so the pass's module does not import), the item is not run here, with the exact error. vLLM is
imported only when an item runs.
"""

from __future__ import annotations

import importlib
import time
from collections import Counter
from dataclasses import dataclass

import torch

from harness.vllm.routes import vllm_version
from harness.results.store import FusionOutcome, IntegrationRecord, Status
from harness.runtime.device import detect, memory_held_elsewhere
from harness.runtime.vllm_compiled import vllm_missing
from harness.plan.dtypes import DTYPE
from harness.plan.model import Plan
from harness.vllm_facts.fusion_cases import FUSION_DTYPE, FusionCase, FusionProfile, fusion_case, fusion_profiles

# The checks whose code is here, with their versions (harness.results.checks): raise one when its results may
# differ; a refactor rewrites the manifest instead (python -m harness manifest).
CHECK_VERSIONS = {"fusion": 1}

ROUTE = "fusion"
HIDDEN, NUM_TOKENS, EPS = 256, 257, 1e-6  # vLLM's fusion tests' shape: an odd token count, marked dynamic
SEQUENCES = 2  # layer sequences in the model: the pass must rewrite each


@dataclass(frozen=True)
class FusionTask:
    """One fusion item, as a worker runs it (run_fusion_item)."""

    plan: Plan
    profile: str  # FusionProfile.id
    sm: str


def item_name(profile: FusionProfile, sm: str) -> str:
    return f"{ROUTE}[{profile.id}-{FUSION_DTYPE}-{sm}]"


def fusion_items(plan: Plan, sm: str) -> list[tuple[str, FusionProfile]]:
    """(item name, profile) for a plan whose op is a fused kernel of one of vLLM's fusion passes; else none."""
    case = fusion_case(plan)
    if case is None or sm not in plan.matrix["sm"]:
        return []
    return [(item_name(p, sm), p) for p in fusion_profiles(case)]


def pass_unavailable(case: FusionCase) -> str:
    """Why vLLM's pass cannot run here ("" when it can): vLLM missing, or the pass's module failing to import, with
    the error and, where vLLM's pass manager leaves the pass out on this platform, that too. Imports vLLM."""
    if vllm_missing():
        return vllm_missing()
    module_name, _, cls = case.pass_path.partition(":")
    from vllm.platforms import current_platform

    platform = type(current_platform).__name__
    try:
        module = importlib.import_module(module_name)
        getattr(module, cls)
    except Exception as exc:
        why = (f"vLLM {vllm_version()} on {platform}: {module_name} does not import ({type(exc).__name__}: "
               f"{str(exc).strip()[:300]})")
        namespace, _, name = case.fused_kernel.partition(".")
        if not hasattr(getattr(torch.ops, namespace), name):
            why += f": this build registers no torch.ops.{case.fused_kernel}, the kernel the pass rewrites into"
        manager = importlib.import_module("vllm.compilation.passes.pass_manager")
        if not hasattr(manager, cls):
            why += f"; and vLLM's pass manager does not import {cls} on {platform}, so no deployment here runs it"
        return why
    return ""


def _layers(case: FusionCase, dtype: torch.dtype, device: str) -> torch.nn.Module:
    """vLLM's own layer sequence, twice, built inside the current vLLM config (as vLLM's fusion tests build it)."""
    from vllm.model_executor.layers.activation import SiluAndMul
    from vllm.model_executor.layers.layernorm import RMSNorm
    from vllm.model_executor.layers.quantization.input_quant_fp8 import QuantFP8
    from vllm.model_executor.layers.quantization.utils.quant_utils import GroupShape

    class Sequences(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.first = torch.nn.ModuleList(
                [SiluAndMul() if case.layer_custom_op == "silu_and_mul" else RMSNorm(HIDDEN, EPS, dtype=dtype)
                 for _ in range(SEQUENCES)])
            self.quant = torch.nn.ModuleList([QuantFP8(static=True, group_shape=GroupShape.PER_TENSOR)
                                              for _ in range(SEQUENCES)])
            self.scales = [torch.tensor([0.02 * (i + 1)], dtype=torch.float32, device=device)
                           for i in range(SEQUENCES)]

        def forward(self, x, residual):
            x = torch.relu(x)  # so that no pattern's argument is a graph input (as vLLM's tests do)
            outs = []
            for first, quant, scale in zip(self.first, self.quant, self.scales):
                if case.residual:
                    y, residual = first(x, residual)
                else:
                    y = first(x)
                q, _ = quant(y, scale)
                outs.append(q.float())  # compared in the quantized domain
                x = torch.relu(x + 1)
            return outs

    return Sequences().to(device)


def _ops(graph) -> Counter:
    """The graph's calls per op, auto-functionalized calls under the op they wrap (as vLLM's find_op_nodes)."""
    from torch._higher_order_ops.auto_functionalize import auto_functionalized

    ops = Counter()
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        target = node.args[0] if node.target is auto_functionalized else node.target
        name = target.name() if hasattr(target, "name") else getattr(target, "__name__", str(target))
        ops[name] += 1
    return ops


class PassBackend:
    """Inductor with passes run as its post-grad custom pass, the graph's ops read before and after them."""

    def __init__(self, passes: list, inductor_config: dict):
        self.passes, self.before, self.after = passes, Counter(), Counter()
        # No compiled-graph cache (a hit would skip the passes; AOTAutograd's is off in check_fusion), but Inductor's
        # other caches kept: with every cache off, its CPU vector-ISA probes compiled again at each check (17 of a
        # CPU machine's 40 s for one check).
        self.config = {**inductor_config, "fx_graph_cache": False, "post_grad_custom_post_pass": self.post_pass}

    def __call__(self, graph, example_inputs):
        from torch._inductor.compile_fx import compile_fx

        return compile_fx(graph, example_inputs, config_patches=self.config)

    def post_pass(self, graph) -> None:
        self.before = _ops(graph)
        for p in self.passes:
            p(graph)
        self.after = _ops(graph)


def check_fusion(plan: Plan, case: FusionCase, profile: FusionProfile) -> FusionOutcome:
    """The pass over vLLM's layers under one profile: matched count, the kernels the fused nodes call, the outputs
    compared with the layers compiled without the pass (a mismatch raises AssertionError)."""
    import vllm.config
    from vllm.compilation.passes.utility.noop_elimination import NoOpEliminationPass
    from vllm.compilation.passes.utility.post_cleanup import PostCleanupPass
    from vllm.config import CompilationConfig, CompilationMode, KernelConfig, PassConfig, VllmConfig
    from vllm.config.kernel import IrOpPriorityConfig

    module_name, _, cls = case.pass_path.partition(":")
    pass_cls = getattr(importlib.import_module(module_name), cls)
    dtype, device = getattr(torch, DTYPE[FUSION_DTYPE].torch), detect().device
    config = VllmConfig(
        compilation_config=CompilationConfig(mode=CompilationMode.VLLM_COMPILE, custom_ops=list(profile.custom_ops),
                                             pass_config=PassConfig(**{case.pass_flag: True}, eliminate_noops=True)),
        kernel_config=KernelConfig(ir_op_priority=IrOpPriorityConfig(**profile.ir_priorities(case))))
    outcome = FusionOutcome(profile=profile.id, custom_ops=list(profile.custom_ops),
                            ir_priority=profile.ir_priorities(case), pass_name=cls)
    with vllm.config.set_current_vllm_config(config), config.kernel_config.ir_op_priority.set_priority(), \
            torch._functorch.config.patch(enable_autograd_cache=False):
        torch.manual_seed(0)
        fusion_pass = pass_cls(config)
        noop, cleanup = NoOpEliminationPass(config), PostCleanupPass(config)
        inductor_config = config.compilation_config.inductor_compile_config
        fused, unfused = PassBackend([noop, fusion_pass, cleanup], inductor_config), \
            PassBackend([noop, cleanup], inductor_config)
        model = _layers(case, dtype, device)
        width = 2 * HIDDEN if case.layer_custom_op == "silu_and_mul" else HIDDEN
        x = torch.rand(NUM_TOKENS, width, dtype=dtype, device=device)
        residual = torch.rand(NUM_TOKENS, width, dtype=dtype, device=device) if case.residual else None

        def inputs():  # fresh copies (the fused add writes its residual), the token dimension dynamic
            copies = [t.clone() if t is not None else None for t in (x, residual)]
            for t in copies:
                if t is not None:
                    torch._dynamo.mark_dynamic(t, 0)
            return copies

        got = torch.compile(model, backend=fused)(*inputs())
        torch._dynamo.reset()
        want = torch.compile(model, backend=unfused)(*inputs())
    outcome.matched = int(fusion_pass.matched_count)
    outcome.fused_kernels = sorted(op for op in fused.after if op not in fused.before)
    outcome.ops_before = sorted(op for op in fused.before if _is_custom(op))
    outcome.ops_after = sorted(op for op in fused.after if _is_custom(op))
    # One fp8 step apart at most: e4m3 keeps 3 mantissa bits (a step is 1/8 of the value's power of two), and its
    # smallest subnormal is 2^-9; the fused kernel may round an intermediate differently from the unfused ops.
    for i, (a, b) in enumerate(zip(got, want)):
        torch.testing.assert_close(a, b, atol=2 ** -9, rtol=0.125, msg=lambda m: f"sequence {i}: the fused graph's "
                                   f"fp8 output is more than one step from the unfused one's: {m}")
    return outcome


def _is_custom(op: str) -> bool:
    """An op of vLLM's or a plugin's library (namespace::name), not an aten or Python one."""
    return "::" in op and not op.startswith(("aten::", "prims::"))


def run_fusion_item(task: FusionTask) -> IntegrationRecord:
    """One fusion item: not run where the pass cannot run here, else the pass's outcome."""
    start = time.monotonic()
    plan = task.plan
    case = fusion_case(plan)
    profile = next(p for p in fusion_profiles(case) if p.id == task.profile)
    rec = IntegrationRecord(route=ROUTE, phase="all", dtype=FUSION_DTYPE, tp=1, graph_mode="torch_compile",
                            sm=task.sm, status=Status.PASSED, vllm=vllm_version(),
                            fusion=FusionOutcome(profile=profile.id, custom_ops=list(profile.custom_ops),
                                                 ir_priority=profile.ir_priorities(case), pass_name=case.pass_class))
    why = pass_unavailable(case)
    if why:
        rec.status, rec.reason = Status.NOT_RUN, why
    else:
        try:
            rec.fusion = check_fusion(plan, case, profile)
            rec.reason = describe(case, rec.fusion)
        except AssertionError as exc:
            rec.status, rec.reason = Status.FAILED, str(exc)[:800]
        except Exception as exc:
            said = f"{case.pass_class} under {profile.id} raised {type(exc).__name__}: {str(exc).strip()[:500]}"
            # Everything called here is vLLM's (its layers, its pass, its kernels): a kernel its build here lacks
            # (NotImplementedError: another platform's build, a kernel left out) is this machine's, as is memory
            # other processes hold; never a failure of the op's kernel.
            held = memory_held_elsewhere(str(exc))
            if isinstance(exc, NotImplementedError) or held:
                rec.status, rec.reason = Status.NOT_RUN, held or f"vLLM cannot run its own layers here: {said}"
            else:
                rec.status, rec.reason = Status.FAILED, said
    rec.duration_s = round(time.monotonic() - start, 3)
    return rec


def describe(case: FusionCase, outcome: FusionOutcome) -> str:
    """The outcome in words: matched or not, and the fused node's kernel."""
    if outcome.matched:
        kernels = ", ".join(outcome.fused_kernels) or "no new op"
        return f"matched {outcome.matched} of {SEQUENCES} sequences; the fused node calls {kernels}"
    return (f"no match: the graph keeps {', '.join(outcome.ops_after) or 'only torch ops'} "
            f"where {case.fused_kernel} would be")
