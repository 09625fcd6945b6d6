"""The dtypes a plan names, in one table: every other dtype list or map of the harness is a lookup into it.

Two vocabularies share it: a cell's dtype (`matrix.dtype`: fp32, bf16, fp8_e4m3fn, ...) and a fixed-dtype
argument's (`op.args.<name>.dtype`: torch's own names, float32, int32, ..., and `fp8`, the platform's fp8).
Plain Python: a row names its torch dtype as a string (`getattr(torch, DTYPE[name].torch)`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DType:
    name: str  # as a plan writes it
    torch: str  # the torch attribute (on CUDA and CPU machines)
    bytes: int  # per element
    kind: str  # "float", "fp8", "int" or "bool"
    cell: bool = False  # a value of matrix.dtype (a cell's activation dtype)
    arg: bool = False  # a fixed dtype of op.args.<name>.dtype
    fp8_max: float | None = None  # the largest finite value (torch.finfo), for fp8 formats
    rocm: str | None = None  # the torch attribute on ROCm where it differs (`fp8`: the fnuz variant)
    rocm_only: bool = False  # a ROCm format: cells of it run on AMD GPUs only

    @property
    def bits(self) -> int:
        return 8 * self.bytes

    @property
    def quantized(self) -> bool:
        """A quantized output's dtype (compared in its quantized domain)."""
        return self.kind == "fp8" or self.name in ("int8",)

    def torch_name(self, hip: bool = False) -> str:
        """The torch attribute on this platform (`hip`: a ROCm build of torch)."""
        return self.rocm if hip and self.rocm else self.torch


_ROWS = (
    DType("fp32", "float32", 4, "float", cell=True),
    DType("fp16", "float16", 2, "float", cell=True),
    DType("bf16", "bfloat16", 2, "float", cell=True),
    DType("fp8_e4m3fn", "float8_e4m3fn", 1, "fp8", cell=True, fp8_max=448.0),
    DType("fp8_e4m3fnuz", "float8_e4m3fnuz", 1, "fp8", cell=True, fp8_max=240.0, rocm_only=True),
    DType("float32", "float32", 4, "float", arg=True),
    DType("float16", "float16", 2, "float", arg=True),
    DType("bfloat16", "bfloat16", 2, "float", arg=True),
    DType("float64", "float64", 8, "float", arg=True),
    DType("int8", "int8", 1, "int", cell=True, arg=True),
    DType("int32", "int32", 4, "int", arg=True),
    DType("int64", "int64", 8, "int", arg=True),
    DType("uint8", "uint8", 1, "int", arg=True),
    DType("bool", "bool", 1, "bool", arg=True),
    DType("float8_e4m3fn", "float8_e4m3fn", 1, "fp8", arg=True, fp8_max=448.0),
    DType("float8_e5m2", "float8_e5m2", 1, "fp8", arg=True, fp8_max=57344.0),
    DType("float8_e4m3fnuz", "float8_e4m3fnuz", 1, "fp8", arg=True, fp8_max=240.0, rocm_only=True),
    # the platform's fp8: float8_e4m3fn on CUDA, float8_e4m3fnuz on ROCm's CDNA GPUs
    DType("fp8", "float8_e4m3fn", 1, "fp8", arg=True, fp8_max=448.0, rocm="float8_e4m3fnuz"),
)
DTYPE: dict[str, DType] = {d.name: d for d in _ROWS}

CELL_DTYPES = tuple(d.name for d in _ROWS if d.cell)  # fp32, fp16, bf16, fp8_e4m3fn, fp8_e4m3fnuz, int8
ARG_DTYPES = tuple(d.name for d in _ROWS if d.arg)  # torch's names, and fp8
QUANTIZED_DTYPES = tuple(d.name for d in _ROWS if d.arg and d.quantized)  # what a quantized output may be
# The cell dtype of each torch dtype that is one (torch attribute -> cell name): float32 -> fp32.
CELL_OF_TORCH = {d.torch: d.name for d in _ROWS if d.cell}
