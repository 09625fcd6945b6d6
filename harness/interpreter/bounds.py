"""Out-of-bounds loads and stores in Triton's interpreter: reported at the kernel's line, never performed.

On a GPU a read or write past a tensor is seen by compute-sanitizer's memcheck (a memcheck cell); in Triton's
interpreter the same access reads or writes the CPU memory beside the tensor, which shows only as a wrong value, a
corrupted neighbour or a crash, and a kernel whose stray lanes are never stored passes. Here every load, store and
atomic of an interpreted launch is checked before it runs: the bytes of each active lane (its mask true; a masked-off
lane is no access, as on a GPU) must lie inside the storage of a tensor the launch was given. The first access with a
lane outside raises OutOfBounds, which names the access, the kernel's source line, the program instance, how many
lanes were outside and where the first one is relative to the nearest tensor argument; none of it is performed.

The storages are the launch's tensor arguments as the interpreter holds them (GridExecutor._init_args_hst), by
address only: nothing of them is kept alive. A launch given a pointer that is not a torch tensor is not checked (its
extent is unknown), nor the rest of one that makes a pointer from an integer (an address held in a tensor may point
into memory no argument holds). An access whose lanes, or whose active lanes, all lie in one storage (most do) costs
a few reductions; any other is tested lane by lane, in numpy.
"""

from __future__ import annotations

import bisect
import os
import traceback
from dataclasses import dataclass

import numpy as np

from harness.interpreter.sites import chain, code_of, shown_path


class OutOfBounds(RuntimeError):
    """A load, store or atomic of an interpreted kernel with active lanes outside every tensor the launch was given;
    not performed. Raised inside the launch (the interpreter wraps it in its InterpreterError, as any error of a
    kernel's)."""


@dataclass(frozen=True)
class _Tensor:
    """A tensor argument of the launch, by address, for saying where a stray lane is."""

    name: str
    start: int
    itemsize: int
    extent: int  # elements from its first to one past its last, in memory (its numel where contiguous)
    words: str  # "shape [4, 96], float32, 384 elements"


class _Launch:
    """What a launch was given: its storages' address ranges [start, end) (disjoint, sorted) and its tensors."""

    def __init__(self, spans: list[tuple[int, int]], tensors: tuple[_Tensor, ...]):
        self.spans, self.tensors = spans, tensors
        self.first = [start for start, _ in spans]  # ints, for testing a whole access at once
        self.starts = np.array(self.first, dtype=np.uint64)  # arrays, for testing each lane
        self.ends = np.array([end for _, end in spans], dtype=np.uint64)

    def holds(self, lo: int, hi: int) -> bool:
        """Whether one storage holds the bytes [lo, hi)."""
        i = bisect.bisect_right(self.first, lo) - 1
        return i >= 0 and hi <= self.spans[i][1]


_launch: _Launch | None = None  # the launch running now; None where it holds a pointer of unknown extent


def _described(name: str, t) -> _Tensor:
    shape = list(t.shape)
    extent = 0 if t.numel() == 0 else 1 + sum((n - 1) * s for n, s in zip(shape, t.stride()))
    strides = "" if t.is_contiguous() else f", strides {list(t.stride())}"
    words = f"shape {shape}{strides}, {str(t.dtype).removeprefix('torch.')}, {t.numel()} elements"
    return _Tensor(name, t.data_ptr(), t.element_size(), extent, words)


def _tensors(name: str, arg, found: list) -> bool:
    """Adds the tensors of one launch argument (in tuples, a tensor descriptor's base) to `found`; False where it holds
    a pointer that is not a torch tensor."""
    import torch

    if isinstance(arg, tuple):
        return all(_tensors(f"{name}[{i}]", a, found) for i, a in enumerate(arg))
    if hasattr(arg, "base") and hasattr(arg, "block_shape"):  # a TensorDescriptor
        return _tensors(f"{name}.base", arg.base, found)
    while not isinstance(arg, torch.Tensor) and isinstance(getattr(arg, "base", None), torch.Tensor):
        arg = arg.base  # triton's TensorWrapper (a tensor reinterpreted as another dtype)
    if isinstance(arg, torch.Tensor):
        found.append((name, arg))
        return True
    return not hasattr(arg, "data_ptr")


def set_launch(arg_names, args, kwargs) -> None:
    """The launch about to run: its tensor arguments' storages are where its accesses may land."""
    global _launch
    found: list = []
    named = [*zip(arg_names, args), *kwargs.items()]
    if not all(_tensors(name, arg, found) for name, arg in named):
        _launch = None
        return
    spans = sorted((t.untyped_storage().data_ptr(), t.untyped_storage().data_ptr() + t.untyped_storage().nbytes())
                   for _, t in found)
    merged: list[tuple[int, int]] = []
    for start, end in spans:
        if end <= start:
            continue  # an empty storage admits no access
        if merged and start <= merged[-1][1]:  # views of one storage, or storages over one buffer
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    _launch = _Launch(merged, tuple(_described(name, t) for name, t in found))


def _outside(addresses: np.ndarray, size: int, mask, launch: _Launch) -> np.ndarray:
    """Per lane: active and some of its `size` bytes outside every storage of the launch."""
    addr = np.asarray(addresses).astype(np.uint64, copy=False)
    starts, lasts = launch.starts, launch.ends - np.uint64(size)  # a lane fits where start <= addr <= end - size
    if len(starts) == 0:
        inside = np.zeros(addr.shape, dtype=bool)
    elif len(starts) == 1:
        inside = (addr >= starts[0]) & (addr <= lasts[0])
    else:
        i = np.searchsorted(starts, addr, side="right") - 1  # the storage starting at or below each address
        inside = (i >= 0) & (addr <= lasts[np.maximum(i, 0)])
    return ~inside if mask is None else ~inside & np.asarray(mask, dtype=bool)


def _where(address: int, size: int, launch: _Launch) -> str:
    """Where a stray lane's address is, relative to the nearest tensor argument."""
    if not launch.tensors:
        return "the launch was given no tensor"

    def distance(t: _Tensor) -> int:
        end = t.start + t.extent * t.itemsize
        return t.start - address if address < t.start else max(address + size - end, 0)

    t = min(launch.tensors, key=distance)
    offset = address - t.start
    unit, k, n = ("element", offset // t.itemsize, t.extent) if offset % t.itemsize == 0 else \
        ("byte", offset, t.extent * t.itemsize)
    side = f"{-k} before its start" if k < 0 else f"{k - n + 1} past its end" if k >= n else "running past its end"
    return f"{unit} {k} of `{t.name}` ({t.words}), {side}"


def _site() -> str:
    """The kernel's source line on the stack (the innermost frame outside triton, numpy and this package)."""
    import triton

    skip = tuple(os.path.dirname(os.path.abspath(m.__file__)) + os.sep for m in (triton, np)) + \
        (os.path.dirname(os.path.abspath(__file__)) + os.sep,)
    for frame in reversed(traceback.extract_stack()[:-1]):
        if not os.path.abspath(frame.filename).startswith(skip):
            return f"{shown_path(frame.filename)}:{frame.lineno} in {frame.name} (`{code_of(frame.line or '')}`)"
    return "an unknown line"


def check(builder, access: str, addresses: np.ndarray, size: int, mask=None) -> None:
    """Raise OutOfBounds where an active lane of this access lies outside the launch's tensors."""
    launch = _launch
    if launch is None or not addresses.size:
        return
    # Most accesses fall in one tensor, masked-off lanes and all: two reductions decide them. Most others do once
    # their masked-off lanes (a row's tail past the end of a tensor) are left out.
    if launch.holds(int(addresses.min()), int(addresses.max()) + size):
        return
    if mask is not None:
        if np.shape(mask) != addresses.shape:
            addresses, mask = np.broadcast_arrays(addresses, mask)
        live = addresses[np.asarray(mask, dtype=bool)]
        if not live.size or launch.holds(int(live.min()), int(live.max()) + size):
            return
    stray = _outside(addresses, size, mask, launch)
    if not stray.any():
        return
    first = int(np.flatnonzero(stray)[0])
    lane = np.unravel_index(first, stray.shape) if stray.ndim else (0,)
    lane_words = str(int(lane[0])) if len(lane) == 1 else str(tuple(int(i) for i in lane))
    active = stray.size if mask is None else int(np.count_nonzero(np.broadcast_to(mask, stray.shape)))
    address = int(np.asarray(addresses).astype(np.uint64).reshape(-1)[first])
    pid = tuple(int(i) for i in (builder.grid_idx or ()))
    raise OutOfBounds(f"{access} at {_site()}, program {pid}: {int(stray.sum())} of {active} active lanes outside "
                      f"every tensor the kernel was given; the first, lane {lane_words}, is "
                      f"{_where(address, size, launch)}; not performed")


# ----------------------------------------------------------------------------- patches (faithful._patch_points)


def patch_launch_args(interp, original):
    def _init_args_hst(self, args_dev, kwargs):
        # The arguments as the kernel's programs see them (on a CPU the same storages as the caller's).
        args_hst, kwargs_hst = original(self, args_dev, kwargs)
        set_launch(self.arg_names, args_hst, kwargs_hst)
        return args_hst, kwargs_hst

    return _init_args_hst


def patch_int_to_ptr(interp, original):
    def create_int_to_ptr(self, src, dst_type):
        # An address from an integer (a table of pointers, an address passed as an int) may lie in memory the launch
        # was not given as a tensor but may use: the rest of this launch is not checked, rather than failed.
        global _launch
        _launch = None
        return original(self, src, dst_type)

    return create_int_to_ptr


def patch_masked_load(interp, original):
    np_dtype = interp._get_np_dtype

    def create_masked_load(self, ptrs, mask, other, cache_policy, is_volatile):
        # tl.load (unmasked loads, atomic loads and tensor descriptors' loads come here too)
        check(self, "load", ptrs.data, np.dtype(np_dtype(ptrs.get_element_ty())).itemsize, mask.data)
        return original(self, ptrs, mask, other, cache_policy, is_volatile)

    return create_masked_load


def patch_masked_store(interp, original):
    def create_masked_store(self, ptrs, value, mask, cache_policy):
        check(self, "store", ptrs.data, value.data.itemsize, mask.data)
        return original(self, ptrs, value, mask, cache_policy)

    return create_masked_store


def patch_atomic_rmw(interp, original):
    def create_atomic_rmw(self, rmwOp, ptr, val, mask, sem, scope):
        check(self, "atomic read-modify-write", ptr.data, val.data.itemsize, mask.data)
        return original(self, rmwOp, ptr, val, mask, sem, scope)

    return create_atomic_rmw


def patch_atomic_cas(interp, original):
    def create_atomic_cas(self, ptr, cmp, val, sem, scope):
        check(self, "atomic compare-and-swap", ptr.data, val.data.itemsize)
        return original(self, ptr, cmp, val, sem, scope)

    return create_atomic_cas


# ----------------------------------------------------------------------------- probe

_KERNEL = None


def probe() -> dict[str, str]:
    """{"out-of-bounds load": ..., "out-of-bounds store": ...}: "" where the interpreter in this process lets lanes
    masked off past a tensor's end be and reports an active one; else one line. The tensors are slices of a buffer the
    probe owns, so that an interpreter that performs the access touches nothing else."""
    global _KERNEL
    import torch

    if _KERNEL is None:
        import triton
        import triton.language as tl

        @triton.jit
        def copy(src_ptr, dst_ptr, n_load, n_store, N: tl.constexpr):
            i = tl.arange(0, N)
            tl.store(dst_ptr + i, tl.load(src_ptr + i, mask=i < n_load, other=0.0), mask=i < n_store)

        _KERNEL = copy
    n = 8
    buffer = np.zeros(4 * n, dtype=np.float32)
    src, dst = torch.from_numpy(buffer[:n]), torch.from_numpy(buffer[2 * n:3 * n])
    try:
        _KERNEL[(1,)](src, dst, n, n, N=2 * n)  # lanes past the ends masked off: no access
    except Exception as e:  # noqa: BLE001 - the probe reports whatever the interpreter raises
        said = f"lanes masked off past a tensor's end raised {type(e).__name__}"
        return {"out-of-bounds load": said, "out-of-bounds store": said}
    result = {}
    for access, n_load, n_store in (("load", n + 1, n), ("store", n, n + 1)):
        try:
            _KERNEL[(1,)](src, dst, n_load, n_store, N=2 * n)
            result[f"out-of-bounds {access}"] = f"a {access} one element past a tensor's end ran unreported"
        except Exception as e:  # noqa: BLE001
            reported = any(isinstance(c, OutOfBounds) and str(c).startswith(f"{access} at ") for c in chain(e))
            result[f"out-of-bounds {access}"] = "" if reported else f"raised {type(e).__name__}, not OutOfBounds"
    return result
