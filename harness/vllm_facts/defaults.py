"""vLLM's own defaults for its own kernels, as data: per kind of switch (a plan's implementations.vllm.switch says which
its kernel has), per platform and vLLM profile, whether vLLM turns it on by itself, with the file and symbol of the
installed vLLM each default comes from.

Seed 002 asks whether vLLM's own custom ops should be on by default per platform and profile. An op's plan times
vLLM's kernel (its `vllm` baseline) against native eager and Inductor; the decision for it
(harness.decisions.recommendations.vllm_kernel_recommendations) is set beside the default here on reports/README.md
(harness.rendering.defaults), with the switch that turns it on or off. The knowledge lives in one table rather
than in the code that renders it, so a new vLLM release is one edit here; it sits with vLLM's other facts below the
plan's layer (it writes settings with harness.vllm_facts.names), because decisions and pages both read it and
neither may import the other's layer upward.

Read from vLLM 0.32 (the installed vllm package):
- `custom_ops` gets its base mode in vllm/config/vllm.py `VllmConfig.__post_init__`: "none" where Inductor
  compiles (backend "inductor" and a compilation mode other than NONE), "all" otherwise; a CustomOp is on with
  "all" unless `-<name>`, with "none" only with `+<name>` (vllm/model_executor/custom_op.py `CustomOp.enabled`).
  A list without a base mode gets the profile's, so `["+silu_and_mul"]` alone works in either profile. On a CPU
  machine the default compilation mode is VLLM_COMPILE too, so the base mode is the same;
  vllm/platforms/cpu.py `CpuPlatform.check_and_update_config` then only changes how it compiles.
- The IR op priority (`--ir-op-priority`) comes from the platform: vllm/platforms/cuda.py
  `CudaPlatform.get_default_ir_op_priority` (and vllm/platforms/rocm.py `RocmPlatform...`) gives `["native"]`
  under Inductor and `["vllm_c", "native"]` without it; a CPU machine keeps vllm/platforms/interface.py
  `Platform.get_default_ir_op_priority`, `["native"]` in both, and vllm/kernels/vllm_c.py registers `vllm_c`
  for GPUs only (`supported=GPGPU_DEVICE`). RMSNorm's forward_cuda is its forward_native, which dispatches
  through the IR op, so its `custom_ops` entry does not choose its kernel: the IR priority does.
- On a CPU machine a CustomOp that is on runs its forward_cpu: RotaryEmbedding's calls vLLM's kernel, SiluAndMul's
  (but on POWER) and QuantFP8's (CustomOp.forward_cpu) are forward_native, so there vLLM's kernel never runs.
- The fused fp8 kernels run only where a fusion pass puts them (vllm/compilation/passes/fusion/rms_quant_fusion.py,
  act_quant_fusion.py), inside Inductor's post-grad passes: vllm/config/vllm.py `OPTIMIZATION_LEVEL_02` turns
  `fuse_norm_quant` / `fuse_act_quant` on only where `enable_norm_fusion` / `enable_act_fusion` find an unfused
  custom op or IR provider on, so not by default; without Inductor no pass runs (`OPTIMIZATION_LEVEL_00`).

Plain Python: nothing here imports vLLM. Where vLLM is installed, tests/test_vllm_ops.py checks the table against it
(the custom_ops base mode and fusion-pass flags its config gives per profile, its platform's IR op priority).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from harness.vllm_facts.names import custom_ops, ir_priority

if TYPE_CHECKING:  # type hints only: the plan's checks import these facts, never the other way
    from harness.plan.sections import VllmSwitch

# The switches vLLM has for one of its kernels: an IR op's provider priority, a CustomOp's `custom_ops` entry, a
# fusion pass's `pass_config` flag.
IR, CUSTOM_OP, FUSION_PASS = "ir", "custom_op", "fusion_pass"
# vLLM's platforms, and the SMs of the plan's matrix that run on each (gfx* are AMD GPUs).
CUDA, ROCM, CPU = "CUDA", "ROCm", "CPU"
INDUCTOR_ON, INDUCTOR_OFF = "Inductor on", "Inductor off"  # harness.decisions.recommendations.VLLM_PROFILES
NOT_REACHABLE = "none: vLLM runs its fusion passes inside Inductor only"


@dataclass(frozen=True)
class VllmDefault:
    """Whether vLLM turns a kind of switch on by itself on one platform in one profile, and where that is decided."""

    kind: str
    platform: str
    profile: str
    on: bool
    source: str  # file (under vllm/) and symbol
    value: str = ""  # what the default amounts to, where the switch's own value does not say it


_BASE_MODE = "vllm/config/vllm.py VllmConfig.__post_init__ (custom_ops base mode)"
DEFAULTS = (
    VllmDefault(IR, CUDA, INDUCTOR_ON, False, "vllm/platforms/cuda.py CudaPlatform.get_default_ir_op_priority"),
    VllmDefault(IR, CUDA, INDUCTOR_OFF, True, "vllm/platforms/cuda.py CudaPlatform.get_default_ir_op_priority"),
    VllmDefault(IR, ROCM, INDUCTOR_ON, False, "vllm/platforms/rocm.py RocmPlatform.get_default_ir_op_priority"),
    VllmDefault(IR, ROCM, INDUCTOR_OFF, True, "vllm/platforms/rocm.py RocmPlatform.get_default_ir_op_priority"),
    VllmDefault(IR, CPU, INDUCTOR_ON, False, "vllm/platforms/interface.py Platform.get_default_ir_op_priority"),
    VllmDefault(IR, CPU, INDUCTOR_OFF, False, "vllm/platforms/interface.py Platform.get_default_ir_op_priority"),
    *(VllmDefault(CUSTOM_OP, p, INDUCTOR_ON, False, _BASE_MODE) for p in (CUDA, ROCM, CPU)),
    *(VllmDefault(CUSTOM_OP, p, INDUCTOR_OFF, True, _BASE_MODE) for p in (CUDA, ROCM, CPU)),
    *(VllmDefault(FUSION_PASS, p, INDUCTOR_ON, False, "vllm/config/vllm.py OPTIMIZATION_LEVEL_02 (pass_config)")
      for p in (CUDA, ROCM, CPU)),
    *(VllmDefault(FUSION_PASS, p, INDUCTOR_OFF, False, "vllm/config/vllm.py OPTIMIZATION_LEVEL_00",
                  "no fusion pass runs") for p in (CUDA, ROCM, CPU)),
)


def platform_of(sm: str) -> str:
    """The vLLM platform an SM of the plan's matrix runs on."""
    return CPU if sm == "cpu" else ROCM if sm.startswith("gfx") else CUDA


def vllm_default(switch: VllmSwitch, sm: str, profile: str) -> VllmDefault | None:
    """vLLM's default for a switch of one of its kernels (a plan's implementations.vllm.switch) on the platform of
    `sm` in a profile; None where this table has none."""
    if switch.cpu_runs_native and platform_of(sm) == CPU:
        return VllmDefault(switch.kind, CPU, profile, False, switch.cpu_runs_native,
                           "forward_cpu runs forward_native, whatever custom_ops says")
    return next((d for d in DEFAULTS if (d.kind, d.platform, d.profile) == (switch.kind, platform_of(sm), profile)),
                None)


def default_value(switch: VllmSwitch, default: VllmDefault) -> str:
    """What vLLM's default amounts to for the switch: the IR priority, the custom_ops base mode, the pass flag."""
    if default.value:
        return default.value
    if switch.kind == IR:
        return f"{switch.name} IR priority " + ('["vllm_c", "native"]' if default.on else '["native"]')
    if switch.kind == CUSTOM_OP:
        return f"custom_ops {'all' if default.on else 'none'}"
    return f"{switch.name} false"


def switch_setting(switch: VllmSwitch, on: bool, inductor: bool) -> str:
    """The setting that turns vLLM's kernel on (or off) for its layer in a profile."""
    if switch.kind == IR:
        return ir_priority(switch.name, ["vllm_c", "native"] if on else ["native"])
    if switch.kind == CUSTOM_OP:  # vLLM adds the profile's base mode ("none" / "all") to a list without one
        return custom_ops([f"{'+' if on else '-'}{switch.name}"])
    if on and not inductor:
        return NOT_REACHABLE
    return f"""--compilation-config '{{"pass_config": {{"{switch.name}": {'true' if on else 'false'}}}}}'"""
