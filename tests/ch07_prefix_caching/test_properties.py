"""Chapter 07 at random: whatever the order of admissions, decodes, forks, frees, swaps and cache
resets, every sequence reads back exactly its own tokens through its block table, and nothing leaks.

A fake KV cache stands in for the engine's tensors: each slot remembers what its "K/V" depends on,
the token written there and every token before it in its sequence. Copies on write are made before
writes, as the engine does. A cache hit that served the wrong block, or an eviction of a block someone
still reads, shows up as a wrong value read back. Prompts admitted side by side in one step, and
admissions dropped before anything was written, are in the mix. A two-letter alphabet and two-token
blocks make hits, sharing and eviction happen all the time.
"""

from hypothesis import given, settings
from hypothesis import strategies as st

from minipaged.kv import PrefixCachingPolicy
from minipaged.kv.swap import SwapSpace

BS, NUM_BLOCKS = 2, 12

ops = st.lists(st.one_of(
    st.tuples(st.just("admit"), st.lists(st.integers(0, 1), min_size=1, max_size=9)),
    st.tuples(st.just("admit_together"), st.lists(st.integers(0, 1), min_size=1, max_size=9),
              st.lists(st.integers(0, 1), min_size=1, max_size=9)),
    st.tuples(st.just("abort"), st.lists(st.integers(0, 1), min_size=1, max_size=9)),
    st.tuples(st.just("decode"), st.integers(0, 7), st.integers(0, 1)),
    st.tuples(st.just("fork"), st.integers(0, 7)),
    st.tuples(st.just("free"), st.integers(0, 7)),
    st.tuples(st.just("swap_out"), st.integers(0, 7)),
    st.tuples(st.just("swap_in"), st.integers(0, 7)),
    st.tuples(st.just("reset")),
), max_size=60)


class FakeEngine:
    def __init__(self):
        self.p = PrefixCachingPolicy(NUM_BLOCKS * BS, block_size=BS, max_model_len=24, watermark=0.0)
        self.slot_holds: dict[int, tuple] = {}  # slot -> the tokens up to the one written there
        self.tokens: dict[int, list[int]] = {}  # seq -> its tokens (the truth)
        self.ids = iter(range(10**6))
        self.space = SwapSpace(NUM_BLOCKS, BS)
        self.cpu_holds: dict[int, tuple] = {}  # the swap space's slots, likewise
        self.swapped: dict[int, list[int]] = {}  # swapped-out seq -> its tokens

    def write(self, seq, start, new_tokens, slots):
        for src, dst in self.p.drain_copies():  # copy-on-write first, as the engine does
            for off in range(BS):
                if src * BS + off in self.slot_holds:
                    self.slot_holds[dst * BS + off] = self.slot_holds[src * BS + off]
        for i, slot in enumerate(slots):  # K/V at position p depends on tokens 0..p
            self.slot_holds[slot] = tuple(self.tokens[seq][:start + i + 1])
        self.p.commit_tokens(seq, new_tokens)

    def admit(self, prompt, write=True):
        """Admit a prompt; with write=False, return what to write later (the step's forward pass)."""
        if not self.p.can_allocate(len(prompt), 8, token_ids=prompt):
            return []
        seq = next(self.ids)
        self.p.allocate(seq, len(prompt), 8, token_ids=prompt)
        cached = self.p.num_tokens(seq)
        assert cached % BS == 0 and cached < len(prompt)
        self.tokens[seq] = list(prompt)
        todo = [(seq, cached, prompt[cached:], self.p.append_slots(seq, len(prompt) - cached))]
        if write:
            self.write(*todo[0])
            return []
        return todo

    def admit_together(self, first, second):
        """Two prompts admitted in one step: the second may hit the first's promised blocks."""
        for todo in self.admit(first, write=False) + self.admit(second, write=False):
            self.write(*todo)

    def abort(self, prompt):
        """Admitted, then dropped before the forward pass wrote anything."""
        for seq, *_ in self.admit(prompt, write=False):
            self.p.drain_copies()
            self.p.free(seq)
            del self.tokens[seq]

    def pick(self, i):
        live = sorted(self.tokens)
        return live[i % len(live)] if live else None

    def decode(self, i, tok):
        seq = self.pick(i)
        if seq is None or len(self.tokens[seq]) >= 24 or not self.p.can_append_slots(seq, 1):
            return
        self.tokens[seq].append(tok)
        self.write(seq, len(self.tokens[seq]) - 1, [tok], self.p.append_slots(seq, 1))

    def fork(self, i):
        seq = self.pick(i)
        if seq is not None:
            child = next(self.ids)
            self.p.fork(seq, child)
            self.tokens[child] = list(self.tokens[seq])

    def free(self, i):
        seq = self.pick(i)
        if seq is not None:
            self.p.free(seq)
            del self.tokens[seq]

    def swap_out(self, i):
        seq = self.pick(i)
        if seq is None or not self.space.can_swap_out(self.p, [seq]):
            return
        # copied out before anyone reuses the block
        for dev, cpu in self.space.swap_out({seq: self.p.detach(seq)}):
            for off in range(BS):
                self.cpu_holds[cpu * BS + off] = self.slot_holds.get(dev * BS + off)
        self.swapped[seq] = self.tokens.pop(seq)

    def swap_in(self, i):
        if not self.swapped:
            return
        seq = sorted(self.swapped)[i % len(self.swapped)]
        if not self.space.can_swap_in(self.p, [seq]):
            return
        for cpu, dev in self.space.swap_in([seq], self.p.attach_swapped(self.space.tables_of([seq]))):
            for off in range(BS):
                self.slot_holds[dev * BS + off] = self.cpu_holds.get(cpu * BS + off)
        self.tokens[seq] = self.swapped.pop(seq)

    def reset(self):
        self.p.reset_cache()

    def check(self):
        self.p.check_invariants()
        for seq, toks in self.tokens.items():
            read = [self.slot_holds.get(slot) for slot in self.p.token_slots(seq)]
            truth = [tuple(toks[:i + 1]) for i in range(len(toks))]
            assert read == truth, f"seq {seq} reads {read} through its table, but its tokens are {toks}"


@settings(max_examples=300, deadline=None)
@given(ops)
def test_every_sequence_reads_back_its_own_tokens(program):
    engine = FakeEngine()
    for op, *args in program:
        getattr(engine, op)(*args)
        engine.check()
    for seq in list(engine.tokens):
        engine.p.free(seq)
    for seq in list(engine.swapped):
        engine.space.drop(seq)
    engine.p.check_invariants()
    engine.space.check_invariants()
    assert engine.p.num_free_blocks == NUM_BLOCKS and not engine.p.seq_ids(), "a block leaked"
    assert not engine.space.seq_ids(), "the swap space leaked"


def test_the_random_programs_do_hit_and_evict():
    """Guard for the test above: the alphabet and sizes really do make hits and evictions."""
    engine = FakeEngine()
    for k in range(200):
        engine.admit([k % 2, 0, 1, (k // 2) % 2, 1, k % 3 % 2, 0])
        engine.decode(k, k % 2)
        engine.check()
        if len(engine.tokens) >= 2:
            engine.free(k)
    assert engine.p.stats["hit_tokens"] > 100 and engine.p.evictions > 10
