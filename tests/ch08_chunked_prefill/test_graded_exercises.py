"""Chapter 08, focused tests for the graded exercises (python -m minipaged.lab.exercises list --chapter 08):
the chunk planner and the chunked scheduler's pass over the running requests, step by step against
plans worked out by hand. No model: the scheduler and a KV policy alone."""

from minipaged.kv import make_policy
from minipaged.lab.simulator.runner import SyntheticRunner
from minipaged.request import Sequence
from minipaged.sampling_params import SamplingParams
from minipaged.scheduler import Request, make_scheduler

BS = 4


def make(budget, max_num_seqs=4, num_blocks=256, mode="recompute", policy_name="on_demand"):
    policy = make_policy(policy_name, num_slots=num_blocks * BS, block_size=BS, max_model_len=64, watermark=0.0)
    sched = make_scheduler("continuous", policy, enable_chunked_prefill=True, max_num_batched_tokens=budget,
                           max_num_seqs=max_num_seqs, preemption_mode=mode)
    return policy, sched


def seq(seq_id, prompt_len, max_tokens=4, n=1, index=0):
    return Sequence(seq_id, [1 + i % 7 for i in range(prompt_len)],
                    SamplingParams(n=n, max_tokens=max_tokens, ignore_eos=True), eos_token_id=-1, max_model_len=64,
                    index=index)


def step(sched):
    """One engine step without a model: plan it, then sample a token for each sequence that completes."""
    plan = sched.schedule()
    for w in plan.work:
        assert len(w.slots) == w.num_new
    # every completed sequence samples token 5; parallel samples fork after the prompt
    sched.update_from_output(plan, SyntheticRunner(token_of=lambda s: 5).execute(plan), 0.0)
    return plan, {w.seq.seq_id: w.num_new for w in plan.work}


# ---- 08.1: the chunk planner ---------------------------------------------------------------------


def test_chunks_give_each_sequence_its_uncached_tokens_while_the_budget_lasts():
    policy, sched = make(budget=64)
    a, b, c = seq(0, 10), seq(1, 3), seq(2, 6)
    for s in (a, b, c):
        policy.allocate(s.seq_id, s.num_tokens, 4)
    policy.append_slots(0, 4)  # a: 4 of 10 computed, 6 to go
    policy.append_slots(1, 3)  # b: all computed, nothing to go
    group = Request("r", a.prompt_ids, a.params, [a, b, c], seqs=[a, b, c])  # c: 6 to go
    assert sched._chunks(group, 100) == [(0, 6), (2, 6)], "everything uncached; b has nothing and is left out"
    assert sched._chunks(group, 12) == [(0, 6), (2, 6)]
    assert sched._chunks(group, 8) == [(0, 6), (2, 2)], "the last one gets what the budget has left"
    assert sched._chunks(group, 6) == [(0, 6)], "a chunk of 0 tokens is no chunk"
    assert sched._chunks(group, 3) == [(0, 3)]
    assert sched._chunks(group, 0) == []
    assert [policy.num_tokens(i) for i in (0, 1, 2)] == [4, 3, 0], "planning chunks hands out no slots"


def test_a_long_prompt_is_cut_into_budget_sized_chunks():
    policy, sched = make(budget=6)
    sched.add(Request.of(seq(0, 20, max_tokens=2)))
    plans = [step(sched)[1] for _ in range(5)]
    assert plans == [{0: 6}, {0: 6}, {0: 6}, {0: 2}, {0: 1}], "6 + 6 + 6 + 2 = 20, then one decode"
    assert not sched.has_work() and not policy.seq_ids()


# ---- 08.1 and 08.2: steps worked out by hand ----------------------------------------------------


def test_decodes_come_first_and_the_prompt_gets_what_the_budget_has_left():
    """Budget 6. A (3-token prompt, 4 outputs), B (14-token prompt, 2 outputs), C (2-token prompt, 2 outputs).
    Step 1: A's whole prompt, then B starts with the 3 tokens left; C waits (no budget left).
    Steps 2-3: A decodes (1), B gets the other 5 each time. Step 4: A decodes, B's last token, and the 4
    tokens left admit C whole. Step 5: B and C decode (A finished in step 4)."""
    policy, sched = make(budget=6)
    sched.add(Request.of(seq(0, 3, max_tokens=4)))
    sched.add(Request.of(seq(1, 14, max_tokens=2)))
    sched.add(Request.of(seq(2, 2, max_tokens=2)))
    plans = []
    while sched.has_work():
        plan, work = step(sched)
        assert plan.num_tokens <= 6
        plans.append(work)
    assert plans == [{0: 3, 1: 3}, {0: 1, 1: 5}, {0: 1, 1: 5}, {0: 1, 1: 1, 2: 2}, {1: 1, 2: 1}]
    assert not policy.seq_ids()


def test_every_running_decode_is_planned_even_past_the_budget():
    """Budget 4, and one request of 6 parallel samples (admitted, as nothing else runs): its prompt is
    one chunk, then all 6 samples decode in one step. A decode never waits for the budget."""
    policy, sched = make(budget=4, max_num_seqs=4, policy_name="shared")
    sched.add(Request.of(seq(0, 3, max_tokens=2, n=6), [seq(i, 3, max_tokens=2, n=6, index=i) for i in range(1, 6)]))
    sched.add(Request.of(seq(6, 9, max_tokens=1)))
    plans = []
    while sched.has_work():
        plans.append(step(sched)[1])
    assert plans == [{0: 3}, {i: 1 for i in range(6)}, {6: 4}, {6: 4}, {6: 1}]
    assert not policy.seq_ids()


# ---- 08.2: when a chunk cannot get memory ------------------------------------------------------


def refuse_chunks_of(policy, seq_ids):
    """Make the policy say "no room" to any chunk (more than one token) of these sequences."""
    can_append_all = policy.can_append_all

    def refusing(appends):
        if any(s in seq_ids and n > 1 for s, n in appends):
            return False
        return can_append_all(appends)

    policy.can_append_all = refusing


def test_a_chunk_that_must_wait_for_memory_holds_back_new_requests():
    policy, sched = make(budget=8)
    sched.add(Request.of(seq(0, 2, max_tokens=5)))
    sched.add(Request.of(seq(1, 20, max_tokens=2)))
    sched.add(Request.of(seq(2, 3, max_tokens=1)))
    assert step(sched)[1] == {0: 2, 1: 6}
    refused = set()
    refuse_chunks_of(policy, refused)
    refused.add(1)
    plan, work = step(sched)
    assert work == {0: 1}, "A's decode goes on; B's chunk waits, and C may not jump ahead of it"
    assert plan.preempted == 0 and policy.num_tokens(1) == 6 and len(sched.waiting) == 1
    refused.clear()
    assert step(sched)[1] == {0: 1, 1: 7}
    assert step(sched)[1] == {0: 1, 1: 7}
    assert step(sched)[1] == {0: 1, 1: 1, 2: 3}
    while sched.has_work():
        step(sched)
    assert not policy.seq_ids()


def test_a_lone_chunk_without_memory_is_preempted_as_in_chapter_06():
    policy, sched = make(budget=4)
    sched.add(Request.of(seq(0, 10, max_tokens=1)))
    assert step(sched)[1] == {0: 4}
    refused = {0}
    refuse_chunks_of(policy, refused)
    plan, work = step(sched)
    assert work == {} and plan.preempted == 1, "nothing else runs, so nothing will give memory back: preempt"
    assert 0 not in policy.seq_ids() and [g.seqs[0].seq_id for g in sched.waiting] == [0]
    refused.clear()
    plans = []
    while sched.has_work():
        plans.append(step(sched)[1])
    assert plans == [{0: 4}, {0: 4}, {0: 2}], "recomputed from its first token"
    assert not policy.seq_ids()
