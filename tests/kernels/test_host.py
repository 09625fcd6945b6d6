"""The kernels' plain-Python launch arithmetic gives Triton's answers: a wrong one would change launch configurations
(block sizes, grids) without any kernel test noticing at the sizes it draws."""

import triton

from kernels.host import cdiv, next_power_of_2, pow2_floor


def test_launch_arithmetic_matches_triton():
    sizes = [*range(4100), 5120, 8191, 8192, 8193, 11008, 14336, 28672, 65535, 65536, 65537, 1 << 31]
    assert [next_power_of_2(n) for n in sizes] == [triton.next_power_of_2(n) for n in sizes]
    assert [cdiv(n, b) for n in sizes for b in (1, 3, 64, 1024)] == \
        [triton.cdiv(n, b) for n in sizes for b in (1, 3, 64, 1024)]
    floors = {n: pow2_floor(n) for n in sizes[1:]}
    assert all(p <= n < 2 * p and p & (p - 1) == 0 for n, p in floors.items()), floors
