"""Property-based: random fork / append / free / prune sequences against the "shared" policy.

Beside the policy, the test keeps what the engine would: a memory of slot -> value, where each
append writes fresh values after the copies the policy asked for have been made. After every step:

    * check_invariants() (reference count == tables holding the block, free <=> count 0, ...);
    * each block's count equals the number of tables holding it, recounted here from the tables;
    * every slot just written lies in a block with count 1, held by that sequence alone;
    * reading any sequence's tokens through its block table gives back exactly what it wrote
      (copy-on-write kept every sequence's view intact).
"""

from collections import Counter

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from minipaged.kv import NoFreeMemory, SharedPolicy

BLOCK_SIZE, NUM_BLOCKS, MAX_LEN = 4, 12, 40


class SharedPolicyMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.policy = SharedPolicy(NUM_BLOCKS * BLOCK_SIZE, block_size=BLOCK_SIZE, max_model_len=MAX_LEN, watermark=0)
        self.memory: dict[int, int] = {}  # slot -> the value last written there
        self.expected: dict[int, list[int]] = {}  # seq -> the values it wrote, in order
        self.next_seq = 0
        self.next_value = 0

    def _write(self, seq: int, n: int) -> None:
        before = self.policy.snapshot()
        try:
            slots = self.policy.append_slots(seq, n)
        except NoFreeMemory:
            assert self.policy.snapshot() == before, "a refused append changed the bookkeeping"
            return
        bs = BLOCK_SIZE
        for src, dst in self.policy.drain_copies():  # what the engine does before writing
            for offset in range(bs):
                if src * bs + offset in self.memory:
                    self.memory[dst * bs + offset] = self.memory[src * bs + offset]
        others = {b for s in self.policy.seq_ids() if s != seq for b in self.policy.allocated_blocks(s)}
        for slot in slots:
            block = slot // bs
            assert self.policy.ref_count(block) == 1, f"write into block {block} with count > 1"
            assert block not in others, f"write into block {block} that another table holds"
            self.memory[slot] = self.next_value
            self.expected[seq].append(self.next_value)
            self.next_value += 1

    @rule(prompt_len=st.integers(1, 10))
    def admit(self, prompt_len):
        if not self.policy.can_allocate(prompt_len, MAX_LEN - prompt_len):
            return
        seq = self.next_seq
        self.next_seq += 1
        self.policy.allocate(seq, prompt_len, MAX_LEN - prompt_len)
        self.expected[seq] = []
        self._write(seq, prompt_len)

    @precondition(lambda self: self.expected)
    @rule(data=st.data(), children=st.integers(1, 3))
    def fork(self, data, children):
        parent = data.draw(st.sampled_from(sorted(self.expected)))
        for _ in range(children):
            child = self.next_seq
            self.next_seq += 1
            self.policy.fork(parent, child)
            self.expected[child] = list(self.expected[parent])

    @precondition(lambda self: self.expected)
    @rule(data=st.data(), n=st.integers(1, 5))
    def append(self, data, n):
        seq = data.draw(st.sampled_from(sorted(self.expected)))
        if self.policy.num_tokens(seq) + n <= MAX_LEN:
            self._write(seq, n)

    @precondition(lambda self: self.expected)
    @rule(data=st.data())
    def free(self, data):  # a sequence finishes, is aborted or preempted
        seq = data.draw(st.sampled_from(sorted(self.expected)))
        self.policy.free(seq)
        del self.expected[seq]

    @precondition(lambda self: len(self.expected) >= 2)
    @rule(data=st.data())
    def beam_step(self, data):
        """What beam search does: some beams branch, the rest are pruned; survivors append a token."""
        beams = sorted(self.expected)
        keep = data.draw(st.lists(st.sampled_from(beams), min_size=1, max_size=len(beams)))
        taken = set()
        survivors = []
        for parent in keep:
            if parent in taken:  # a second child of the same parent forks it
                child = self.next_seq
                self.next_seq += 1
                self.policy.fork(parent, child)
                self.expected[child] = list(self.expected[parent])
                survivors.append(child)
            else:
                taken.add(parent)
                survivors.append(parent)
        for beam in beams:
            if beam not in taken:  # pruned
                self.policy.free(beam)
                del self.expected[beam]
        for beam in survivors:
            if self.policy.num_tokens(beam) < MAX_LEN:
                self._write(beam, 1)

    @invariant()
    def bookkeeping_holds(self):
        self.policy.check_invariants()
        holders = Counter(b for s in self.policy.seq_ids() for b in self.policy.allocated_blocks(s))
        for block in range(NUM_BLOCKS):
            assert self.policy.ref_count(block) == holders[block]
        assert self.policy.num_free_blocks == NUM_BLOCKS - len(holders)
        assert sorted(self.policy.seq_ids()) == sorted(self.expected)

    @invariant()
    def every_sequence_reads_back_what_it_wrote(self):
        for seq, values in self.expected.items():
            assert [self.memory.get(s) for s in self.policy.token_slots(seq)] == values, f"seq {seq} reads wrong K/V"

    def teardown(self):
        for seq in list(self.expected):
            self.policy.free(seq)
        self.policy.check_invariants()
        assert self.policy.num_free_blocks == NUM_BLOCKS, "blocks leaked"


SharedPolicyMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None,
                                                 suppress_health_check=[HealthCheck.too_slow])
TestSharedPolicy = SharedPolicyMachine.TestCase
