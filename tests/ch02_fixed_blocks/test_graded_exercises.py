"""Chapter 02: focused checks for the graded exercises (runs of free blocks, taking a run out of the
sorted free list and putting it back). The expected values are worked out in the comments."""

from minipaged.kv import FixedBlockPolicy


def pool(num_blocks, block_size=4, max_model_len=64):
    return FixedBlockPolicy(num_blocks * block_size, block_size=block_size, max_model_len=max_model_len,
                            reservation="oracle")


def test_free_runs_of_a_free_list_set_by_hand():
    p = pool(12)
    assert p.free_runs() == [(0, 12)]  # an empty pool is one run
    cases = [
        ([], []),
        ([5], [(5, 1)]),
        ([0, 1, 2, 7, 8, 11], [(0, 3), (7, 2), (11, 1)]),
        ([1, 3, 5, 7], [(1, 1), (3, 1), (5, 1), (7, 1)]),  # neighbours by one are not a run
        ([2, 3, 4, 5, 6, 7, 8, 9, 10, 11], [(2, 10)]),
    ]
    for free, runs in cases:
        p._free, p._runs_cache = list(free), None  # what _place and _release leave behind
        assert p.free_runs() == runs, free


def test_free_runs_split_and_merge():
    p = pool(8)
    assert p.free_runs() == [(0, 8)]  # an empty pool is one run
    for seq in "abcd":
        p.allocate(seq, 4, 4, final_len=8)  # 2 blocks each: a 0-1, b 2-3, c 4-5, d 6-7
    assert p.free_runs() == []
    p.free("b")
    assert p.free_runs() == [(2, 2)]
    p.free("d")
    assert p.free_runs() == [(2, 2), (6, 2)]
    p.free("c")  # 2-3, 4-5 and 6-7 are now one run
    assert p.free_runs() == [(2, 6)]
    p.free("a")
    assert p.free_runs() == [(0, 8)]
    p.check_invariants()


def test_free_runs_of_single_blocks():
    p = pool(5, block_size=1, max_model_len=4)
    for seq in "abcde":
        p.allocate(seq, 1, 1, final_len=1)  # one block each: a 0, b 1, c 2, d 3, e 4
    p.free("a")
    p.free("c")
    p.free("e")
    assert p.free_runs() == [(0, 1), (2, 1), (4, 1)]
    p.free("d")
    assert p.free_runs() == [(0, 1), (2, 3)]


def test_place_takes_the_first_run_that_is_long_enough():
    p = pool(10)
    p.allocate("a", 4, 4, final_len=8)  # 2 blocks: 0-1
    p.allocate("b", 4, 4, final_len=8)  # 2 blocks: 2-3
    p.allocate("c", 8, 4, final_len=12)  # 3 blocks: 4-6
    p.allocate("d", 8, 4, final_len=12)  # 3 blocks: 7-9
    assert p.num_free_blocks == 0 and p._free == []
    p.free("a")
    p.free("c")
    assert p._free == [0, 1, 4, 5, 6]
    p.allocate("e", 8, 4, final_len=12)  # 3 blocks: the run 0-1 is too short, 4-6 fits
    assert p.allocated_blocks("e") == range(4, 7)
    assert p._free == [0, 1] and p.free_runs() == [(0, 2)]
    p.allocate("f", 2, 2, final_len=4)  # 1 block: the lowest free one
    assert p.allocated_blocks("f") == range(0, 1)
    assert p._free == [1]
    p.check_invariants()


def test_place_can_split_a_run_in_the_middle_of_the_free_list():
    p = pool(12)
    for seq in "abcdef":
        p.allocate(seq, 4, 4, final_len=8)  # 2 blocks each: a 0-1, b 2-3, ..., f 10-11
    for seq in "bcdf":
        p.free(seq)  # free: 2-7 (one run of 6) and 10-11
    assert p._free == [2, 3, 4, 5, 6, 7, 10, 11]
    p.allocate("g", 8, 4, final_len=12)  # 3 blocks: 2-4, the front of the run
    assert p.allocated_blocks("g") == range(2, 5)
    assert p._free == [5, 6, 7, 10, 11]
    assert p.free_runs() == [(5, 3), (10, 2)]
    assert p.append_slots("g", 12) == list(range(8, 20))  # the slots of blocks 2, 3, 4
    p.check_invariants()


def test_release_puts_the_run_back_in_order():
    p = pool(10)
    for seq in "abcde":
        p.allocate(seq, 4, 4, final_len=8)  # 2 blocks each: a 0-1, b 2-3, c 4-5, d 6-7, e 8-9
    p.free("d")
    assert p._free == [6, 7]
    p.free("a")  # goes in front of 6, 7
    assert p._free == [0, 1, 6, 7]
    p.free("c")  # goes between them
    assert p._free == [0, 1, 4, 5, 6, 7]
    assert p.free_runs() == [(0, 2), (4, 4)]
    p.free("e")
    p.free("b")
    assert p._free == list(range(10)) and p.free_runs() == [(0, 10)]
    p.check_invariants()
    p.allocate("x", 40, 1, final_len=40)  # all 10 blocks in one run again
    assert p.allocated_blocks("x") == range(0, 10)
