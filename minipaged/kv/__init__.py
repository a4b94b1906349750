"""KV-cache bookkeeping: where every sequence's keys and values live, as plain Python (no torch).

One interface (``KVPolicy``, see base.py for the calls and the waste accounting), six policies,
one per chapter, all selectable by name through ``make_policy``:

    contiguous     ch01  one slab per request in one arena, first fit        contiguous.py
    fixed_blocks   ch02  fixed-size blocks, a contiguous run per request      fixed_blocks.py
    block_table    ch03  block table: any free block, reserved up front       block_table.py
    on_demand      ch04  block table grown one block at a time                on_demand.py
    shared         ch05  on_demand + reference counts, fork, copy-on-write    shared.py
    prefix_caching ch07  shared + full blocks found again by their tokens     prefix_cache.py
"""

from minipaged.kv.audit import Sharing
from minipaged.kv.base import KVPolicy, NoFreeMemory, ReservationExceeded, Usage
from minipaged.kv.block_table import BlockPool, BlockTablePolicy
from minipaged.kv.contiguous import RESERVATION_RULES, ContiguousArena, reservation_tokens
from minipaged.kv.factory import (
    ALL_POLICIES,
    POLICIES,
    PREFIX_POLICIES,
    RESERVING_POLICIES,
    SHARING_POLICIES,
    make_policy,
)
from minipaged.kv.fixed_blocks import FixedBlockPolicy
from minipaged.kv.on_demand import OnDemandPolicy
from minipaged.kv.prefix_cache import PrefixBlockPool, PrefixCachingPolicy
from minipaged.kv.shared import RefCountedBlockPool, SharedPolicy

__all__ = [
    "KVPolicy", "Usage", "NoFreeMemory", "ReservationExceeded", "RESERVATION_RULES", "reservation_tokens",
    "ContiguousArena", "FixedBlockPolicy", "BlockPool", "BlockTablePolicy", "OnDemandPolicy",
    "RefCountedBlockPool", "SharedPolicy", "Sharing", "PrefixBlockPool", "PrefixCachingPolicy",
    "POLICIES", "RESERVING_POLICIES", "SHARING_POLICIES", "PREFIX_POLICIES", "ALL_POLICIES", "make_policy",
]
