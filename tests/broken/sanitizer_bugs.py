"""RMSNorm kernels with right values and a bug only one of compute-sanitizer's lanes sees (racecheck, initcheck,
synccheck: harness.runtime.memcheck), with the signature of `kernels.rms_norm.rms_norm` (out, x, weight, eps) -> None.
Each carries exactly ONE bug, named in its docstring and marked BUG.

Triton has no way to write a shared-memory race or a divergent barrier: it allocates shared memory and places the
barriers itself, and a program's control flow is the same for all its threads. Those two kernels are CUDA, compiled
with torch.utils.cpp_extension.load_inline on first call (nvcc, on a GPU machine only; tests/test_gpu_checks.py);
the uninitialised read is Triton.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

EXTENSION = "harness_sanitizer_bugs"
THREADS = 256  # CUDA kernels: one row per block of 8 warps

CPP_SOURCE = """
void shared_race_rms_norm(at::Tensor out, at::Tensor x, at::Tensor weight, double eps);
void split_barrier_rms_norm(at::Tensor out, at::Tensor x, at::Tensor weight, double eps);
"""

CUDA_SOURCE = r"""
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

constexpr int THREADS = 256;
constexpr int WARPS = THREADS / 32;

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <typename T>
__device__ __forceinline__ void write_row(T* out, const T* xr, const T* w, int hidden, float rstd) {
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    const float y = static_cast<float>(static_cast<T>(static_cast<float>(xr[i]) * rstd)) * static_cast<float>(w[i]);
    out[i] = static_cast<T>(y);
  }
}

// The sum of squares about a shift c taken from the row: mean(x^2) = mean((x-c)^2) + 2c mean(x-c) + c^2, which keeps
// the squared terms small where a row sits far from zero.
template <typename T>
__global__ void rms_norm_shared_race_kernel(T* out, const T* x, const T* w, int64_t out_stride, int64_t x_stride,
                                            int hidden, float eps) {
  __shared__ float shift;
  __shared__ float partial[2][WARPS];
  const T* xr = x + blockIdx.x * x_stride;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  // BUG: the first lane of every warp writes the shift, where warp 0's alone should: writes of different values
  // from different warps to one __shared__ word, in no order (a race). Any element of the row is a valid shift,
  // and the barrier below puts every read after all the writes, so the values are right: only racecheck sees it.
  if (lane == 0) shift = static_cast<float>(xr[min(warp * 32, hidden - 1)]);
  __syncthreads();
  const float c = shift;
  float s1 = 0.f, s2 = 0.f;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    const float d = static_cast<float>(xr[i]) - c;
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
  const float rstd = rsqrtf(t2 / hidden + 2.f * c * (t1 / hidden) + c * c + eps);
  write_row(out + blockIdx.x * out_stride, xr, w, hidden, rstd);
}

template <typename T>
__global__ void rms_norm_split_barrier_kernel(T* out, const T* x, const T* w, int64_t out_stride, int64_t x_stride,
                                              int hidden, float eps) {
  __shared__ float partial[WARPS];
  const T* xr = x + blockIdx.x * x_stride;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float ss = 0.f;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    const float v = static_cast<float>(xr[i]);
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
  write_row(out + blockIdx.x * out_stride, xr, w, hidden, rsqrtf(total / hidden + eps));
}

static void launch(bool race, at::Tensor out, at::Tensor x, at::Tensor weight, double eps) {
  TORCH_CHECK(x.is_cuda() && x.dim() == 2 && x.stride(1) == 1 && out.stride(1) == 1 && weight.is_contiguous(),
              "rows of contiguous elements on a CUDA device");
  const at::cuda::OptionalCUDAGuard guard(x.device());
  const int rows = static_cast<int>(x.size(0)), hidden = static_cast<int>(x.size(1));
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::ScalarType::Half, at::ScalarType::BFloat16, x.scalar_type(), "sanitizer_bugs",
                                  [&] {
    auto kernel = race ? rms_norm_shared_race_kernel<scalar_t> : rms_norm_split_barrier_kernel<scalar_t>;
    kernel<<<rows, THREADS, 0, stream>>>(out.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(),
                                         weight.data_ptr<scalar_t>(), out.stride(0), x.stride(0), hidden,
                                         static_cast<float>(eps));
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void shared_race_rms_norm(at::Tensor out, at::Tensor x, at::Tensor weight, double eps) {
  launch(true, out, x, weight, eps);
}

void split_barrier_rms_norm(at::Tensor out, at::Tensor x, at::Tensor weight, double eps) {
  launch(false, out, x, weight, eps);
}
"""


@functools.cache
def _extension():
    """The CUDA kernels, built once per machine (torch's extension cache) with line numbers for the sanitizer."""
    from torch.utils.cpp_extension import load_inline  # nvcc and ninja: imported where a kernel is first called

    return load_inline(name=EXTENSION, cpp_sources=CPP_SOURCE, cuda_sources=CUDA_SOURCE,
                       functions=["shared_race_rms_norm", "split_barrier_rms_norm"],
                       extra_cuda_cflags=["-O3", "-lineinfo"])


def shared_race(out, x, weight, eps):
    """Bug (CUDA): every warp writes the row's shift into one __shared__ word, racing: right values (any row element
    is a valid shift, read after a barrier), a write-after-write hazard between warps (racecheck only)."""
    if x.shape[0]:
        _extension().shared_race_rms_norm(out, x, weight, eps)


def split_barrier(out, x, weight, eps):
    """Bug (CUDA): warp 0 and the other warps wait at two different __syncthreads() calls: right values on sm70 and
    later, where both are barrier 0, a barrier error (synccheck only)."""
    if x.shape[0]:
        _extension().split_barrier_rms_norm(out, x, weight, eps)


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
