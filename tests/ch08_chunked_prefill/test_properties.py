"""Chapter 08 at random: whatever the budget, the pool, the preemption mode and the KV policy, a
prompt computed in chunks gives each request exactly the tokens it would get computed whole, no step
goes over its budget, and no running decode is left out of a step.

The engine's loop, with the model replaced by a fake K/V cache and a fake sampler. Each slot
remembers what its "K/V" depends on: the token written there and every token before it in its
sequence. The next token is a function of what the sequence reads back through its block table, so
a chunk written to the wrong slot, a chunk that sampled before its prompt was done, or a chunk
skipped or computed twice, gives a wrong token. The true outputs have a closed form:
``out[i] = next_token(prompt + out[:i])``.
"""

from hypothesis import event, given, settings
from hypothesis import strategies as st

from minipaged.kv import make_policy
from minipaged.kv.swap import SwapSpace
from minipaged.lab.simulator.runner import SyntheticRunner
from minipaged.request import Sequence
from minipaged.sampling_params import SamplingParams
from minipaged.scheduler import Request, make_scheduler

BS = 2


def next_token(context: tuple) -> int:
    return (sum(context) * 31 + len(context)) % 3


def expected_outputs(prompt, n_out):
    out = []
    for _ in range(n_out):
        out.append(next_token(tuple(prompt + out)))
    return out


def serve(requests, *, policy_name, num_blocks, budget, max_num_seqs, mode, n):
    """Run the requests through the chunked scheduler; returns {seq_id: (seq, expected outputs)}."""
    policy = make_policy(policy_name, num_slots=num_blocks * BS, block_size=BS, max_model_len=40, watermark=0.0)
    swap = SwapSpace(num_blocks, BS) if mode == "swap" else None
    sched = make_scheduler("continuous", policy, enable_chunked_prefill=True, max_num_batched_tokens=budget,
                           max_num_seqs=max_num_seqs, preemption_mode=mode, swap_space=swap)
    holds, cpu_holds, seqs, ids = {}, {}, {}, iter(range(10**6))
    for prompt, n_out in requests:
        params = SamplingParams(n=n, max_tokens=n_out, ignore_eos=True)
        group = [Sequence(next(ids), list(prompt), params, eos_token_id=-1, max_model_len=40, index=i)
                 for i in range(n)]
        for s in group:
            seqs[s.seq_id] = (s, expected_outputs(list(prompt), n_out))
        sched.add(Request.of(group[0], group[1:]))
    steps = partial = 0
    refused = set()
    while sched.has_work():
        steps += 1
        assert steps < 5000, "no end"
        decoding = {s.seq_id for g in sched.running for s in g.seqs
                    if s.num_tokens - policy.num_tokens(s.seq_id) == 1}
        plan = sched.schedule()
        refused.update(s.seq_id for r in plan.refused for s in r.samples)  # could never fit: the others go on
        # only a lone request with more samples than the budget may go over it, by its decodes alone
        assert plan.num_tokens <= max(budget, len(decoding)), f"{plan.num_tokens} tokens, budget {budget}"
        planned = {w.seq.seq_id for w in plan.work}
        still_running = {s.seq_id for g in sched.running for s in g.seqs}
        assert decoding & still_running <= planned, "a running decode was left out of the step"
        for dev, cpu in plan.swap_out:  # the engine's order: swap-outs, swap-ins, copies on write
            for off in range(BS):
                cpu_holds[cpu * BS + off] = holds.get(dev * BS + off)
        for cpu, dev in plan.swap_in:
            for off in range(BS):
                holds[dev * BS + off] = cpu_holds.get(cpu * BS + off)
        for src, dst in plan.copies:
            for off in range(BS):
                holds[dst * BS + off] = holds.get(src * BS + off)
        for w in plan.work:  # "the forward pass": every chunk's K/V is written before anyone reads
            for i, slot in enumerate(w.slots):
                holds[slot] = tuple(w.seq.all_ids[:w.cached + i + 1])
        for w in plan.work:
            seq = w.seq
            read = [holds.get(slot) for slot in policy.token_slots(seq.seq_id)]
            assert read == [tuple(seq.all_ids[:i + 1]) for i in range(w.cached + w.num_new)], (
                f"seq {seq.seq_id} reads back wrong K/V after its chunk at {w.cached}..{w.cached + w.num_new}")
            partial += not w.completes
        # each completed sequence's next token follows from what it read back (the samples forked
        # from it read the same), and the scheduler applies the step
        sample = SyntheticRunner(token_of=lambda s: next_token(tuple(s.all_ids)))
        sched.update_from_output(plan, sample.execute(plan), 0.0)
        policy.check_invariants()
    assert not policy.seq_ids(), "blocks leaked"
    if swap is not None:
        assert not swap.seq_ids(), "the swap space leaked"
    return seqs, {**sched.stats, "partial_chunks": partial, "refused_ids": refused}


requests = st.lists(st.tuples(st.lists(st.integers(0, 1), min_size=1, max_size=30), st.integers(1, 6)),
                    min_size=1, max_size=8)


@settings(max_examples=200, deadline=None)
@given(requests, st.sampled_from(["on_demand", "shared", "prefix_caching"]), st.integers(10, 40),
       st.integers(1, 4), st.integers(0, 12), st.sampled_from(["recompute", "swap"]), st.integers(1, 2))
def test_chunks_give_the_same_tokens_as_whole_prompts(reqs, policy_name, num_blocks, max_num_seqs, extra, mode, n):
    n = n if policy_name != "on_demand" else 1  # forks need a sharing policy
    seqs, stats = serve(reqs, policy_name=policy_name, num_blocks=num_blocks, budget=max_num_seqs + extra,
                        max_num_seqs=max_num_seqs, mode=mode, n=n)
    event(f"preempted: {stats['preemptions'] > 0}")
    for seq, expected in seqs.values():
        if seq.seq_id in stats["refused_ids"]:
            assert seq.finish_reason == "abort" and not seq.output_ids
        else:
            assert seq.output_ids == expected, f"seq {seq.seq_id}: {seq.output_ids} != {expected}"


def test_the_random_programs_do_chunk_and_preempt():
    """Guard for the test above: its sizes really do split prompts and preempt requests."""
    reqs = [([(k >> j) & 1 for j in range(3)] * 3, 6) for k in range(8)]
    for mode in ("recompute", "swap"):
        seqs, stats = serve(reqs, policy_name="shared", num_blocks=24, budget=8, max_num_seqs=8, mode=mode, n=2)
        assert stats["preemptions"] > 0 and stats["partial_chunks"] >= 8, stats
    assert all(seq.output_ids == expected for seq, expected in seqs.values())
