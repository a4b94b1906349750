"""Chapter 09's parts alone: the proposer, the verification rule, the config, and giving back the
slots of rejected guesses (``policy.truncate``)."""

import pytest

from minipaged.kv import make_policy
from minipaged.kv.prefix_cache import PrefixCachingPolicy
from minipaged.spec import SpeculativeConfig, accept_greedy, propose_ngram, verify


def test_prompt_lookup_copies_what_followed_the_last_tokens_before():
    ids = [5, 1, 2, 3, 9, 8, 1, 2]
    assert propose_ngram(ids, 3) == [3, 9, 8]  # "1 2" came before, followed by 3 9 8
    assert propose_ngram(ids, 10) == [3, 9, 8, 1, 2]  # no further than the sequence goes
    assert propose_ngram([1, 2, 3, 4], 3) == []  # nothing repeats


def test_prompt_lookup_prefers_longer_matches_then_the_most_recent():
    # "7 1 2" matches once, early; "1 2" alone matches later too: the longer match wins
    ids = [7, 1, 2, 4, 4, 1, 2, 6, 6, 7, 1, 2]
    assert propose_ngram(ids, 2, max_n=3) == [4, 4]
    assert propose_ngram(ids, 2, max_n=2) == [6, 6]  # the most recent "1 2"
    assert propose_ngram([3, 3, 3], 2) == [3]  # overlapping occurrences are fine
    assert propose_ngram([1, 2, 9, 2], 2, max_n=2, min_n=2) == []  # "9 2" never came before


def test_greedy_acceptance_keeps_the_agreeing_prefix_and_one_more():
    assert accept_greedy([4, 5, 6, 7], [4, 5, 6]) == [4, 5, 6, 7]  # all right: a bonus token
    assert accept_greedy([4, 9, 6, 7], [4, 5, 6]) == [4, 9]  # the second guess was wrong: corrected
    assert accept_greedy([3, 5, 6, 7], [4, 5, 6]) == [3]  # the first was wrong: plain decoding
    assert accept_greedy([8], []) == [8]
    with pytest.raises(ValueError, match="one row per draft token"):
        accept_greedy([1, 2], [1, 2])


def test_verify_stops_when_the_sequence_finishes():
    emitted = []

    def emit(j):
        emitted.append(j)
        return [4, 5, 6, 7][j], j == 1  # the sequence ends on its second token (a stop token, say)
    assert verify([4, 5, 6], emit) == 2 and emitted == [0, 1]


@pytest.mark.parametrize("config, field", [
    ("ngram", "speculative_config must be a dict"),
    ({"method": "eagle"}, "method"),
    ({"num_speculative_tokens": 0}, "num_speculative_tokens"),
    ({"prompt_lookup_min": 3, "prompt_lookup_max": 2}, "prompt_lookup_min"),
    ({"draft_tokens": 3}, "unknown keys"),
])
def test_bad_configs_name_the_field(config, field):
    with pytest.raises(ValueError, match=field):
        SpeculativeConfig.from_dict(config)


def test_the_config_keeps_vllms_keys():
    c = SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 5})
    assert (c.method, c.num_speculative_tokens, c.prompt_lookup_max, c.prompt_lookup_min) == ("ngram", 3, 5, 1)
    assert SpeculativeConfig.from_dict(None) is None


@pytest.mark.parametrize("name", ["on_demand", "shared"])
def test_truncate_gives_back_the_blocks_of_rejected_tokens(name):
    p = make_policy(name, num_slots=64, block_size=4, max_model_len=64, watermark=0.0)
    p.allocate("s", 6, 20)
    p.append_slots("s", 6)
    before = p.num_free_blocks
    p.append_slots("s", 7)  # one own token and six guesses: 13 tokens, 4 blocks
    assert p.num_free_blocks == before - 2
    p.truncate("s", 9)  # the own token and two right guesses stay: 9 tokens, 3 blocks
    assert p.num_tokens("s") == 9 and p.num_free_blocks == before - 1 and len(p.block_table("s")) == 3
    p.truncate("s", 6)
    assert p.num_free_blocks == before, "the prompt's blocks stay, the rest goes back"
    assert p.append_slots("s", 1) == [p.block_table("s")[1] * 4 + 2]  # the next token goes after the prompt
    p.check_invariants()
    with pytest.raises(ValueError, match="num_tokens"):
        p.truncate("s", 8)


def test_truncate_keeps_a_reservation():
    p = make_policy("block_table", num_slots=64, block_size=4, max_model_len=64, reservation="oracle")
    p.allocate("s", 6, 10)
    held = p.allocated_blocks("s")
    p.append_slots("s", 10)
    p.truncate("s", 7)
    assert p.allocated_blocks("s") == held and p.num_tokens("s") == 7
    p.check_invariants()


def test_truncate_in_a_shared_block_leaves_the_other_holder_alone():
    p = make_policy("shared", num_slots=64, block_size=4, max_model_len=64, watermark=0.0)
    p.allocate("a", 6, 20)
    p.append_slots("a", 6)
    p.fork("a", "b")
    shared = p.block_table("a")
    p.append_slots("b", 3)  # b writes into the shared last block: copy on write, then a fresh block
    p.drain_copies()
    p.truncate("b", 6)
    assert p.block_table("a") == shared and p.ref_count(shared[0]) == 2
    p.check_invariants()


def test_the_prefix_cache_only_forgets_unwritten_tokens():
    p = PrefixCachingPolicy(64, block_size=4, watermark=0.0)
    ids = list(range(10, 20))
    p.allocate("s", 10, 10, token_ids=ids)
    p.append_slots("s", 10)
    p.commit_tokens("s", ids)
    p.append_slots("s", 5)  # guesses, not written as far as the cache knows
    p.truncate("s", 11)
    with pytest.raises(ValueError, match="written or promised"):
        p.truncate("s", 9)
    assert p.num_tokens("s") == 11
    p.check_invariants()
