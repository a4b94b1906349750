"""``make_policy``: build any KV policy by name, so every stage stays selectable by configuration.

    make_policy("contiguous", num_slots=32768, reservation="max")     chapter 01
    make_policy("fixed_blocks", num_slots=32768, block_size=16)       chapter 02
    make_policy("block_table", num_slots=32768, block_size=16)        chapter 03
    make_policy("on_demand", num_slots=32768, block_size=16)          chapter 04
    make_policy("shared", num_slots=32768, block_size=16)             chapter 05 (fork, copy-on-write)
    make_policy("prefix_caching", num_slots=32768, block_size=16)     chapter 07 (shared + a block cache)

``reservation`` ("max", "pow2" or "oracle") applies to the three reserving policies; on_demand
shared and prefix_caching reserve nothing ahead and ignore it. The contiguous arena always has block_size 1.
"""

from __future__ import annotations

from minipaged.kv.base import KVPolicy
from minipaged.kv.block_table import BlockTablePolicy
from minipaged.kv.contiguous import RESERVATION_RULES, ContiguousArena
from minipaged.kv.fixed_blocks import FixedBlockPolicy
from minipaged.kv.on_demand import OnDemandPolicy
from minipaged.kv.prefix_cache import PrefixCachingPolicy
from minipaged.kv.shared import SharedPolicy

POLICIES = ("contiguous", "fixed_blocks", "block_table", "on_demand")
RESERVING_POLICIES = ("contiguous", "fixed_blocks", "block_table")
SHARING_POLICIES = ("shared",)  # chapter 05: on_demand plus reference counts and copy-on-write
PREFIX_POLICIES = ("prefix_caching",)  # chapter 07: shared plus full blocks found again by content
ALL_POLICIES = (*POLICIES, *SHARING_POLICIES, *PREFIX_POLICIES)


def make_policy(name: str, num_slots: int, block_size: int = 16, max_model_len: int = 2048,
                reservation: str = "max", **options) -> KVPolicy:
    """A fresh, empty policy. ``options`` go to the class (e.g. ``watermark`` for on_demand)."""
    if name not in ALL_POLICIES:
        raise ValueError(f"policy name={name!r} is not known; choose one of {list(ALL_POLICIES)}")
    if reservation not in RESERVATION_RULES:
        raise ValueError(f"reservation={reservation!r} is not known; choose one of {list(RESERVATION_RULES)}")
    if name == "contiguous":
        return ContiguousArena(num_slots, max_model_len=max_model_len, reservation=reservation, **options)
    if name == "fixed_blocks":
        return FixedBlockPolicy(num_slots, block_size=block_size, max_model_len=max_model_len,
                                reservation=reservation, **options)
    if name == "block_table":
        return BlockTablePolicy(num_slots, block_size=block_size, max_model_len=max_model_len,
                                reservation=reservation, **options)
    if name == "prefix_caching":
        return PrefixCachingPolicy(num_slots, block_size=block_size, max_model_len=max_model_len, **options)
    if name == "shared":
        return SharedPolicy(num_slots, block_size=block_size, max_model_len=max_model_len, **options)
    return OnDemandPolicy(num_slots, block_size=block_size, max_model_len=max_model_len, **options)
