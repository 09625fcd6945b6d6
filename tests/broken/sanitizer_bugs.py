"""RMSNorm kernels with right values and a bug only one of compute-sanitizer's lanes sees (racecheck, initcheck,
synccheck: harness.runtime.memcheck), with the signature of `kernels.rms_norm.rms_norm` (out, x, weight, eps) -> None.
Each carries exactly ONE bug, named in its docstring and marked BUG.

Triton has no way to write a shared-memory race or a divergent barrier: it allocates shared memory and places the
barriers itself, and a program's control flow is the same for all its threads. Those two kernels are CUDA, compiled
by torch's NVRTC (torch.cuda._compile_kernel) on first call, on a GPU machine only (tests/test_gpu_checks.py); the
uninitialised read is Triton.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

THREADS = 256  # CUDA kernels: one row per block of 8 warps

# Each dtype's element type and conversions to and from float, in PTX: NVRTC compiles the kernels without CUDA's
# headers (the GPU machine needs torch's NVRTC only, no nvcc or toolkit).
ELEMENT = {
    torch.float32: "typedef float T;\n"
                   "__device__ __forceinline__ float ld(T v) { return v; }\n"
                   "__device__ __forceinline__ T st(float f) { return f; }\n",
    torch.bfloat16: "typedef unsigned short T;\n"
                    "__device__ __forceinline__ float ld(T v) { return __uint_as_float(((unsigned)v) << 16); }\n"
                    "__device__ __forceinline__ T st(float f) {\n"
                    "  T h; asm(\"cvt.rn.bf16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(f)); return h; }\n",
    torch.float16: "typedef unsigned short T;\n"
                   "__device__ __forceinline__ float ld(T v) {\n"
                   "  float f; asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"(f) : \"h\"(v)); return f; }\n"
                   "__device__ __forceinline__ T st(float f) {\n"
                   "  T h; asm(\"cvt.rn.f16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(f)); return h; }\n",
}

CUDA_SOURCE = r"""
#define THREADS 256
#define WARPS (THREADS / 32)

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ void write_row(T* out, const T* xr, const T* w, int hidden, float rstd) {
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) out[i] = st(ld(st(ld(xr[i]) * rstd)) * ld(w[i]));
}

// The sum of squares about a shift c taken from the row: mean(x^2) = mean((x-c)^2) + 2c mean(x-c) + c^2, which keeps
// the squared terms small where a row sits far from zero.
extern "C" __global__ void rms_norm_shared_race_kernel(T* out, const T* x, const T* w, int out_stride, int x_stride,
                                                       int hidden, double eps) {
  __shared__ float shift;
  __shared__ float partial[2][WARPS];
  const T* xr = x + (long long)blockIdx.x * x_stride;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  // BUG: the first lane of every warp writes the shift, where warp 0's alone should: writes of different values
  // from different warps to one __shared__ word, in no order (a race). Any element of the row is a valid shift,
  // and the barrier below puts every read after all the writes, so the values are right: only racecheck sees it.
  if (lane == 0) shift = ld(xr[min(warp * 32, hidden - 1)]);
  __syncthreads();
  const float c = shift;
  float s1 = 0.f, s2 = 0.f;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    const float d = ld(xr[i]) - c;
    s1 += d;
    s2 += d * d;
  }
  s1 = warp_sum(s1);
  s2 = warp_sum(s2);
  if (lane == 0) {
    partial[0][warp] = s1;
    partial[1][warp] = s2;
  }
  __syncthreads();
  float t1 = 0.f, t2 = 0.f;
  for (int i = 0; i < WARPS; ++i) {
    t1 += partial[0][i];
    t2 += partial[1][i];
  }
  const float rstd = rsqrtf(t2 / hidden + 2.f * c * (t1 / hidden) + c * c + (float)eps);
  write_row(out + (long long)blockIdx.x * out_stride, xr, w, hidden, rstd);
}

extern "C" __global__ void rms_norm_split_barrier_kernel(T* out, const T* x, const T* w, int out_stride,
                                                         int x_stride, int hidden, double eps) {
  __shared__ float partial[WARPS];
  const T* xr = x + (long long)blockIdx.x * x_stride;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float ss = 0.f;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    const float v = ld(xr[i]);
    ss += v * v;
  }
  ss = warp_sum(ss);
  if (warp == 0) {
    // BUG: warp 0 waits at this __syncthreads() and the other warps at the one in the else branch: the block meets
    // at two different barrier calls. Both are barrier 0 to sm70 and later, so the values are right, but CUDA asks
    // the whole block to reach the same call: only synccheck sees it.
    if (lane == 0) partial[0] = ss;
    __syncthreads();
  } else {
    if (lane == 0) partial[warp] = ss;
    __syncthreads();
  }
  float total = 0.f;
  for (int i = 0; i < WARPS; ++i) total += partial[i];
  write_row(out + (long long)blockIdx.x * out_stride, xr, w, hidden, rsqrtf(total / hidden + (float)eps));
}
"""


@functools.cache
def _kernel(name: str, dtype: torch.dtype):
    """One CUDA kernel for one dtype, compiled once per process by torch's NVRTC with line numbers for the
    sanitizer."""
    return torch.cuda._compile_kernel(ELEMENT[dtype] + CUDA_SOURCE, name, nvcc_options=["-lineinfo"])


def _launch(name: str, out, x, weight, eps) -> None:
    if not (x.is_cuda and x.dim() == 2 and x.stride(1) == 1 and out.stride(1) == 1 and weight.is_contiguous()):
        raise ValueError("rows of contiguous elements on a CUDA device")
    with torch.cuda.device(x.device):
        _kernel(name, x.dtype)(grid=(x.shape[0], 1, 1), block=(THREADS, 1, 1),
                               args=[out, x, weight, out.stride(0), x.stride(0), x.shape[1], float(eps)])


def shared_race(out, x, weight, eps):
    """Bug (CUDA): every warp writes the row's shift into one __shared__ word, racing: right values (any row element
    is a valid shift, read after a barrier), a write-after-write hazard between warps (racecheck only)."""
    if x.shape[0]:
        _launch("rms_norm_shared_race_kernel", out, x, weight, eps)


def split_barrier(out, x, weight, eps):
    """Bug (CUDA): warp 0 and the other warps wait at two different __syncthreads() calls: right values on sm70 and
    later, where both are barrier 0, a barrier error (synccheck only)."""
    if x.shape[0]:
        _launch("rms_norm_split_barrier_kernel", out, x, weight, eps)


# ----------------------------------------------------------------------------- Triton


CHUNK = 256  # the columns each program of the first pass sums


@triton.jit
def _chunk_sums_kernel(ws_ptr, x_ptr, x_row_stride, hidden, SLOTS: tl.constexpr, CHUNK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    cols = chunk * CHUNK + tl.arange(0, CHUNK)
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=cols < hidden, other=0.0).to(tl.float32)
    tl.store(ws_ptr + row * SLOTS + chunk, tl.sum(x * x, axis=0))


@triton.jit
def _rms_norm_from_slots_kernel(
    out_ptr, x_ptr, w_ptr, ws_ptr, out_row_stride, x_row_stride, hidden, chunks, eps, BLOCK: tl.constexpr,
    SLOTS: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    slots = tl.arange(0, SLOTS)
    # BUG: every slot of the row's workspace is loaded, and those past `chunks` were never written (torch.empty).
    # The where discards them, so the values are right, but the load reads uninitialised memory inside the
    # allocation (memcheck sees nothing out of bounds): only initcheck sees it.
    sums = tl.where(slots < chunks, tl.load(ws_ptr + row * SLOTS + slots), 0.0)
    rstd = tl.rsqrt(tl.sum(sums, axis=0) / hidden + eps)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = (x * rstd).to(x_ptr.dtype.element_ty).to(tl.float32) * w
    tl.store(out_ptr + row * out_row_stride + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def uninitialised_slots(out, x, weight, eps):
    """Bug: two passes through a per-row workspace from torch.empty, a power of two of slots wide with at least one
    to spare past the row's chunks; the second pass loads every slot and discards the unwritten ones: right values,
    reads of memory nothing wrote (initcheck only)."""
    n, hidden = x.shape
    if n == 0:
        return
    chunks = triton.cdiv(hidden, CHUNK)
    slots = triton.next_power_of_2(chunks + 1)
    ws = torch.empty((n, slots), dtype=torch.float32, device=x.device)
    _chunk_sums_kernel[(n, chunks)](ws, x, x.stride(0), hidden, SLOTS=slots, CHUNK=CHUNK)
    block = triton.next_power_of_2(hidden)
    _rms_norm_from_slots_kernel[(n,)](out, x, weight, ws, out.stride(0), x.stride(0), hidden, chunks, eps,
                                      BLOCK=block, SLOTS=slots, num_warps=min(max(block // 256, 1), 16))
