"""The compile-time resource report: ptxas's figures for the kernels, the load widths read from the PTX,
and the occupancy arithmetic, checked by hand and against what Nsight Compute read on an H200."""

import importlib.util

import pytest

from minipaged.lab.kernels import resources
from minipaged.lab.kernels.resources import global_loads, occupancy


def _has_ptxas() -> bool:
    try:
        resources.ptxas_path()
        return True
    except FileNotFoundError:
        return False


needs_ptxas = pytest.mark.skipif(not _has_ptxas(), reason="ptxas is missing: pip install -e \".[kernels]\"")


@pytest.mark.parametrize("regs, smem, threads, expected", [
    # 127 x 32 = 4,064 -> 4,096 a warp; 16,384 / 4,096 = 4 warps a quarter, 16 = 4 blocks of 4
    # (Nsight Compute on v1: "Block Limit Registers 4")
    (127, 23104, 128, (4, 0.25, "registers")),
    # 164 x 32 = 5,248 -> 5,376 a warp; 16,384 // 5,376 = 3 warps a quarter, 12 = 3 blocks
    (164, 23104, 128, (3, 0.1875, "registers")),
    # 40 x 32 = 1,280 a warp; a quarter of the register file (16,384) holds 12 warps, so 48 = 24 blocks of 2
    # (Nsight Compute on the merge kernel: "Block Limit Registers 24", theoretical occupancy 75%)
    (40, 0, 64, (24, 0.75, "registers")),
    # 48 KiB + 1 KiB reserved a block: 228 KiB // 49 KiB = 4 blocks; registers would allow 16
    (32, 48 * 1024, 128, (4, 0.25, "shared memory")),
    # 1,024 threads: 2,048 / 1,024 = 2 blocks, every warp slot filled
    (16, 0, 1024, (2, 1.0, "threads")),
    # one warp a block: 32 blocks at most, half the warp slots
    (16, 0, 32, (32, 0.5, "blocks")),
])
def test_occupancy_arithmetic_by_hand(regs, smem, threads, expected):
    assert occupancy(regs, smem, threads, (9, 0)) == expected


def test_occupancy_refuses_what_cannot_launch():
    with pytest.raises(ValueError, match="registers=256"):
        occupancy(256, 0, 128)
    with pytest.raises(ValueError, match="shared_bytes"):
        occupancy(32, 228 * 1024, 128)
    with pytest.raises(ValueError, match="cc="):
        occupancy(32, 0, 128, (7, 5))


def test_load_widths_are_read_from_the_ptx():
    ptx = """
        ld.global.u16 %rs1, [%rd4];
        ld.global.s32 %r2, [%rd5+4];
        ld.global.v2.u32 {%r3, %r4}, [%rd6];
        ld.global.nc.v4.f32 {%f1, %f2, %f3, %f4}, [%rd7];
        ld.global.u64 %rd8, [%rd9];
        ld.shared.f32 %f5, [%r1];
        st.global.u16 [%rd4], %rs1;
    """
    by_width, by_type = global_loads(ptx)
    assert by_width == {2: 1, 4: 1, 8: 2, 16: 1}
    assert by_type == {"s32": 1, "u16": 1, "u64": 1, "v2.u32": 1, "v4.f32": 1}


def test_a_missing_ptxas_names_the_package(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="nvidia-cuda-nvcc"):
        resources.ptxas_path()


@pytest.fixture(scope="module")
def today():
    pytest.importorskip("numba", reason="numba is not installed: pip install -e \".[test]\"")
    rows = resources.kernel_resources_in_subprocess(head_dims=(64,), dtypes=("float16",),
                                                    kernels=("v1", "v2_partition"))
    return {r.kernel: r for r in rows}


@needs_ptxas
def test_ptxas_gives_what_nsight_compute_read_on_the_h200(today):
    """Nsight Compute at the target shape (fp16, head dim 64): v1 127 registers, the v2 partition kernel
    164, 23,104 B of static shared memory each, no local memory."""
    assert today["v1"].registers == 127 and today["v2_partition"].registers == 164
    for r in today.values():
        assert r.shared_bytes == 23104 and r.threads_per_block == 128
        assert (r.stack_bytes, r.spill_store_bytes, r.spill_load_bytes) == (0, 0, 0)
        assert r.limited_by == "registers"
    assert (today["v1"].blocks_per_sm, today["v1"].occupancy) == (4, 0.25)


@needs_ptxas
def test_v1_and_v2_load_the_fp16_cache_two_bytes_at_a_time(today):
    """The finding the wider loads of v3 answer: v1 and v2 read fp16 K and V with ld.global.u16."""
    for r in today.values():
        assert r.global_loads.get(2, 0) >= 16, r.global_loads
