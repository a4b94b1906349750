"""Chapter 09 at random: whatever the guesses, the pool, the preemption mode and the KV policy, a
request decoded with drafts gets exactly the tokens of plain greedy decoding, the K/V it keeps is
its own tokens', and the slots of wrong guesses go back.

The engine's loop with a fake model. Each slot remembers what its "K/V" depends on: the token
written there and every token before it. The "model" reads a sequence back through its block table
and its next token is a function of what it reads, so a guess accepted wrongly, a K/V slot not
given back, or a truncation that cut a valid token, gives a wrong token or a wrong read. The
proposer is random: some guesses are the true next tokens (copied from the closed form), some not.
"""

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from minipaged.kv import make_policy
from minipaged.kv.swap import SwapSpace
from minipaged.request import Sequence
from minipaged.sampling import step_outputs
from minipaged.sampling_params import SamplingParams
from minipaged.scheduler import Request, make_scheduler
from minipaged.spec import SpeculativeConfig
from minipaged.step import RunnerOutput, Sampled

BS = 2


def next_token(context: tuple) -> int:
    return (sum(context) * 31 + len(context)) % 3


def truth(prompt, n_out):
    out = []
    for _ in range(n_out):
        out.append(next_token(tuple(prompt + out)))
    return out


def serve(requests, *, policy_name, num_blocks, max_num_seqs, mode, k, right, seed):
    options = {"reservation": "oracle"} if policy_name == "block_table" else {"watermark": 0.0}
    policy = make_policy(policy_name, num_slots=num_blocks * BS, block_size=BS, max_model_len=48, **options)
    swap = SwapSpace(num_blocks, BS) if mode == "swap" else None
    rng = random.Random(seed)
    expected = {}

    def proposer(seq, n):  # each guess is the true next token with probability `right`
        full = expected[seq.seq_id]
        start = len(seq.output_ids)
        return [full[start + i] if rng.random() < right else rng.randrange(3) for i in range(n)
                if start + i < len(full)]

    sched = make_scheduler("continuous", policy, max_num_seqs=max_num_seqs, preemption_mode=mode, swap_space=swap,
                           speculative_config=SpeculativeConfig(num_speculative_tokens=k))
    sched.proposer = proposer
    holds, cpu_holds, seqs = {}, {}, []
    for i, (prompt, n_out) in enumerate(requests):
        seq = Sequence(i, list(prompt), SamplingParams(temperature=0, max_tokens=n_out, ignore_eos=True),
                       eos_token_id=-1, max_model_len=48)
        expected[i] = truth(list(prompt), n_out + k + 1)  # a little past the end: the proposer may look there
        seqs.append(seq)
        sched.add(Request.of(seq))
    steps = 0
    while sched.has_work():
        steps += 1
        assert steps < 5000, "no end"
        plan = sched.schedule()
        assert not plan.refused
        for dev, cpu in plan.swap_out:
            for off in range(BS):
                cpu_holds[cpu * BS + off] = holds.get(dev * BS + off)
        for cpu, dev in plan.swap_in:
            for off in range(BS):
                holds[dev * BS + off] = cpu_holds.get(cpu * BS + off)
        for src, dst in plan.copies:
            for off in range(BS):
                holds[dst * BS + off] = holds.get(src * BS + off)
        for w in plan.work:  # the forward pass: the sequence's own tokens, then its guesses
            ids = w.seq.all_ids[:w.cached] + w.tokens
            for i, slot in enumerate(w.slots):
                holds[slot] = tuple(ids[:w.cached + i + 1])
        rows = []
        for w in plan.work:
            seq = w.seq
            read = [holds.get(slot) for slot in policy.token_slots(seq.seq_id)]
            ids = seq.all_ids[:w.cached] + w.tokens
            assert read == [tuple(ids[:i + 1]) for i in range(len(ids))], f"seq {seq.seq_id} reads wrong K/V"
            # row j: what was read at the position of the own token + j; its next token follows from it
            rows.append([read[w.cached + w.num_own - 1 + j] for j in range(1 + len(w.draft))])
        def draw(i, j, seq, before, rows=rows):
            return Sampled(next_token(rows[i][j]))

        output = RunnerOutput(step_outputs(plan.work, draw, None))
        sched.update_from_output(plan, output, 0.0)  # verifies the drafts, gives back the rejected slots
        policy.check_invariants()
        for g in sched.running:  # after the step no sequence holds a slot for a rejected guess
            for s in g.seqs:
                assert policy.num_tokens(s.seq_id) == s.num_tokens - 1
    assert not policy.seq_ids(), "blocks leaked"
    if swap is not None:
        assert not swap.seq_ids(), "the swap space leaked"
    return seqs, {**sched.stats, "accepted": sched.stats["spec_accepted_tokens"], "steps": steps}, expected


requests = st.lists(st.tuples(st.lists(st.integers(0, 2), min_size=1, max_size=12), st.integers(1, 12)),
                    min_size=1, max_size=6)


@settings(max_examples=200, deadline=None)
@given(requests, st.sampled_from(["on_demand", "shared", "prefix_caching", "block_table"]), st.integers(16, 40),
       st.integers(1, 4), st.sampled_from(["recompute", "swap"]), st.integers(1, 5), st.floats(0, 1),
       st.integers(0, 10**6))
def test_drafts_give_the_tokens_of_plain_decoding(reqs, policy_name, num_blocks, max_num_seqs, mode, k, right, seed):
    if policy_name == "block_table":
        mode = "recompute"  # it reserves whole requests up front and never preempts
    seqs, _, expected = serve(reqs, policy_name=policy_name, num_blocks=num_blocks, max_num_seqs=max_num_seqs,
                              mode=mode, k=k, right=right, seed=seed)
    for seq in seqs:
        assert seq.output_ids == expected[seq.seq_id][:len(seq.output_ids)]
        assert len(seq.output_ids) == seq.params.max_tokens


def test_the_random_programs_do_accept_reject_and_preempt():
    """Guard for the test above: guesses are accepted and rejected, and the pool is tight enough."""
    reqs = [([k % 3, 1, 2, 0, 1], 12) for k in range(6)]
    for mode in ("recompute", "swap"):
        seqs, stats, expected = serve(reqs, policy_name="shared", num_blocks=16, max_num_seqs=4, mode=mode, k=4,
                                      right=0.7, seed=1)
        assert stats["preemptions"] > 0, stats
        assert 0 < stats["accepted"] < stats["spec_draft_tokens"], stats
        assert all(s.output_ids == expected[s.seq_id][:12] for s in seqs)
