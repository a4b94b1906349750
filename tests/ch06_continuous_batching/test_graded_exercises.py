"""Chapter 06's graded exercises, pinned down: requeueing, preemption and admission (no model).

The exercises build on each other in this order, and so do their tests: 06.1's call ``_requeue``
(through ``_preempt``) on requests started by hand, 06.2's call ``_schedule_running`` alone, and
06.3's run whole scheduler steps. ``step`` is the engine core's loop with "every sequence samples
token 7" in place of the forward pass: it asks for a plan and hands the scheduler an output whose
every row samples token 7 (``update_from_output`` forks the samples waiting on a prompt that is now
cached, appends one token to every sequence whose tokens are all computed, and finishes the ones
that are done). The pools are tiny (block size 4, no watermark), so every expected plan below
can be counted by hand; the comments do the counting.
"""

from minipaged.kv import make_policy
from minipaged.lab.simulator.runner import SyntheticRunner
from minipaged.request import Sequence
from minipaged.sampling_params import SamplingParams
from minipaged.scheduler import ContinuousScheduler, Request, StaticScheduler
from minipaged.step import StepPlan

BS = 4


def policy(num_blocks, name="on_demand"):
    return make_policy(name, num_slots=num_blocks * BS, block_size=BS, max_model_len=64, watermark=0)


def seq(seq_id, prompt_len, max_tokens, index=0, params=None):
    params = params or SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    return Sequence(seq_id, [1] * prompt_len, params, eos_token_id=-1, max_model_len=64, index=index)


def samples(first_id, n, prompt_len, max_tokens):
    params = SamplingParams(n=n, max_tokens=max_tokens, ignore_eos=True)
    return [seq(first_id + i, prompt_len, max_tokens, index=i, params=params) for i in range(n)]


def add(sched, first, children=(), beam=None):
    """Queue a request of one sequence (and the samples to fork from it), as the engine core does."""
    request = Request(f"r{first.seq_id}", first.prompt_ids, first.params, [] if beam else [first, *children],
                      seqs=[first], children=list(children), beam=beam)
    return sched.add(request)


def sample_tokens(sched, plan):
    """What the engine does after the forward pass: every row samples token 7, and the scheduler
    applies that output (forks, one token per completed sequence, finishes)."""
    sched.update_from_output(plan, SyntheticRunner().execute(plan), 0.0)
    sched.policy.check_invariants()
    return plan


def step(sched):
    return sample_tokens(sched, sched.schedule())


def start(sched, first, children=(), beam=None):
    """Admit a request by hand (what ``_admit`` does when there is room) and run its prefill."""
    group = add(sched, first, children, beam)
    sched.waiting.remove(group)
    assert sched._allocate(group)
    sched.running.append(group)
    plan = StepPlan()
    sched._plan(group, plan)
    sample_tokens(sched, plan)
    return group


def decode_pass(sched):
    """One pass over the running requests only (exercise 06.2), then the sampled tokens."""
    plan = StepPlan()
    sched._schedule_running(plan)
    return sample_tokens(sched, plan)


def planned(plan):
    return [(w.seq.seq_id, w.cached, w.num_new) for w in plan.work]


def waiting(sched):
    return [[s.seq_id for s in g.seqs] for g in sched.waiting]


def running(sched):
    return [[s.seq_id for s in g.seqs] for g in sched.running]


def run_to_the_end(sched, max_steps=200):
    for _ in range(max_steps):
        if not sched.has_work():
            break
        step(sched)
    assert not sched.has_work(), "the requests did not finish"
    assert sched.policy.seq_ids() == [], "blocks leaked"


class RecordingScheduler(ContinuousScheduler):
    """Remembers each ``_on_split(group, part)``: static batching needs it to keep the parts."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.splits = []

    def _on_split(self, group, part):
        self.splits.append((group, part))


# ---- 06.1: ContinuousScheduler._requeue --------------------------------------------------------------


def test_preempted_requests_go_back_to_the_head_of_the_queue_oldest_first():
    sched = ContinuousScheduler(policy(16))
    a, b, c = seq(0, 6, 4), seq(1, 6, 4), seq(2, 6, 4)
    start(sched, a)
    start(sched, b)
    add(sched, c)  # waiting behind them
    plan = StepPlan()
    sched._preempt(sched.running.pop(), plan)  # the newest first: b, then a
    assert waiting(sched) == [[1], [2]]
    sched._preempt(sched.running.pop(), plan)
    assert waiting(sched) == [[0], [1], [2]] and not sched.running
    assert sched.policy.seq_ids() == [] and a.output_ids == b.output_ids == [7]  # recomputed with its output
    assert sched.stats["preempted_recompute"] == 2


def test_preempted_samples_come_back_as_one_request_each_in_order():
    sched = RecordingScheduler(policy(16, "shared"))
    s = samples(0, 3, 6, 4)
    group = start(sched, s[0], s[1:])  # prefill once, fork the two others
    assert [x.seq_id for x in group.seqs] == [0, 1, 2] and sorted(sched.policy.seq_ids()) == [0, 1, 2]
    add(sched, seq(3, 4, 4))
    plan = StepPlan()
    sched._preempt(sched.running.pop(), plan)
    assert waiting(sched) == [[0], [1], [2], [3]]
    parts = list(sched.waiting)[:3]
    assert parts[0] is group and len({id(g) for g in parts}) == 3
    assert len({g.uid for g in parts}) == 3  # each part is a request of its own
    assert all(not g.children and g.beam is None for g in parts)
    assert all(g.root is group for g in parts)  # the client's request is still the first one
    assert all(g.seqs == [x] for x, g in zip(s, parts))  # each part runs one sample, in the request's order
    assert sorted((id(old), id(part)) for old, part in sched.splits) == sorted((id(group), id(p)) for p in parts[1:])


def test_a_preempted_beam_search_starts_over_whole():
    from minipaged.beam_search import BeamSearchParams, BeamSearchSequence, BeamState

    sched = ContinuousScheduler(policy(16, "shared"))
    sched.next_seq_id = iter(range(100, 200)).__next__  # the ids it makes stay clear of the ones made here
    add(sched, seq(9, 4, 4))  # waiting
    beam = seq(0, 4, 4)
    search = BeamState(BeamSearchParams(beam_width=2, max_tokens=4), beam.prompt_ids, 4,
                       [BeamSearchSequence(beam.prompt_ids)], [beam])
    group = start(sched, beam, beam=search)  # its first step branches: two beams share the prompt block
    assert len(group.seqs) == 2 and search.steps == 1 and sorted(sched.policy.seq_ids()) == [0, 100]
    other = group.seqs[1]
    plan = StepPlan()
    sched._preempt(sched.running.pop(), plan)
    assert sched.waiting[0] is group and len(group.seqs) == 1 and search.seqs == group.seqs and search.steps == 0
    fresh = group.seqs[0]
    assert fresh not in (beam, other) and fresh.all_ids == beam.prompt_ids  # its prompt alone, as one sequence
    assert group.beam_width == 2 and sched.policy.seq_ids() == [] and waiting(sched)[1] == [9]


# ---- 06.2: ContinuousScheduler._schedule_running -----------------------------------------------------


def test_the_newest_is_preempted_to_make_room_for_the_oldest():
    sched = ContinuousScheduler(policy(6))
    a, b, c = seq(0, 8, 4), seq(1, 8, 4), seq(2, 8, 4)
    for s in (a, b, c):
        start(sched, s)  # 2 blocks each, none free
    # each now needs a third block for its 9th token: c goes, and its 2 blocks serve a and b
    plan = decode_pass(sched)
    assert plan.preempted == 1 and planned(plan) == [(0, 8, 1), (1, 8, 1)]
    assert running(sched) == [[0], [1]] and waiting(sched) == [[2]]
    assert 2 not in sched.policy.seq_ids() and sched.policy.num_free_blocks == 0


def test_preemption_goes_on_until_the_older_ones_fit_and_can_take_the_one_that_is_short():
    sched = ContinuousScheduler(policy(3))
    for i in range(3):
        start(sched, seq(i, 4, 6))
    add(sched, seq(3, 4, 6))  # no room: waits
    # all three need a second block, none is free: 2 goes and 0 takes its block; then 1 is short,
    # and the newest running request is 1 itself
    plan = decode_pass(sched)
    assert plan.preempted == 2 and planned(plan) == [(0, 4, 1)]
    assert running(sched) == [[0]] and waiting(sched) == [[1], [2], [3]]
    assert sched.policy.seq_ids() == [0] and sched.policy.num_free_blocks == 1


def test_requests_that_fit_run_in_admission_order_without_preempting_anyone():
    sched = ContinuousScheduler(policy(8))
    start(sched, seq(0, 6, 4))  # 2 blocks: room for two more tokens in its second one
    start(sched, seq(1, 8, 4))  # 2 full blocks
    start(sched, seq(2, 3, 4))  # 1 block
    plan = decode_pass(sched)  # 1 takes one of the 3 free blocks, the others write in place
    assert plan.preempted == 0 and planned(plan) == [(0, 6, 1), (1, 8, 1), (2, 3, 1)]
    assert sched.policy.num_free_blocks == 2 and not sched.waiting


def test_a_request_that_is_short_itself_is_the_one_preempted_when_it_is_the_newest():
    sched = ContinuousScheduler(policy(4))
    start(sched, seq(0, 6, 4))
    start(sched, seq(1, 8, 4))
    plan = decode_pass(sched)  # 0 writes in place; 1 needs a block and none is free: 1 (the newest) goes
    assert plan.preempted == 1 and planned(plan) == [(0, 6, 1)] and waiting(sched) == [[1]]
    plan = decode_pass(sched)
    assert plan.preempted == 0 and planned(plan) == [(0, 7, 1)]


def test_samples_are_preempted_together_for_an_older_request():
    sched = ContinuousScheduler(policy(4, "shared"))
    start(sched, seq(0, 4, 4))  # 1 block
    s = samples(1, 3, 6, 3)
    start(sched, s[0], s[1:])  # 2 blocks, shared by the three samples
    # 0 takes the free block for its 5th token; the samples' 7th tokens need 2 copies of their shared
    # last block (the third writer writes in place): none left, so the whole request goes
    plan = decode_pass(sched)
    assert plan.preempted == 1 and planned(plan) == [(0, 4, 1)]
    assert running(sched) == [[0]] and waiting(sched) == [[1], [2], [3]]


# ---- 06.3: ContinuousScheduler._admit ----------------------------------------------------------------


def test_nobody_jumps_the_queue():
    sched = ContinuousScheduler(policy(8))
    for s in (seq(0, 20, 4), seq(1, 20, 4), seq(2, 4, 4)):
        add(sched, s)
    plan = step(sched)  # 0 takes 5 of 8 blocks; 1 needs 5, 3 are free: 1 waits, and so does 2 behind it
    assert planned(plan) == [(0, 0, 20)]
    assert waiting(sched) == [[1], [2]]
    assert sched.policy.num_free_blocks == 3  # 2's one block was not taken either


def test_max_num_seqs_counts_the_sequences_already_running():
    sched = ContinuousScheduler(policy(32), max_num_seqs=2)
    add(sched, seq(0, 4, 8))
    assert planned(step(sched)) == [(0, 0, 4)]
    for i in (1, 2, 3):
        add(sched, seq(i, 4, 8))
    plan = step(sched)  # one sequence runs: room for one more, not three
    assert planned(plan) == [(0, 4, 1), (1, 0, 4)]
    assert waiting(sched) == [[2], [3]]


def test_a_request_of_several_samples_counts_each_sample():
    sched = ContinuousScheduler(policy(32, "shared"), max_num_seqs=3)
    add(sched, seq(0, 4, 8))
    s = samples(1, 3, 4, 8)
    add(sched, s[0], s[1:])
    add(sched, seq(4, 4, 8))
    plan = step(sched)  # 1 + 3 > 3: the three samples wait, and the request behind them waits too
    assert planned(plan) == [(0, 0, 4)]
    assert waiting(sched) == [[1], [4]]


def test_with_nothing_running_the_head_is_admitted_whatever_its_size():
    sched = ContinuousScheduler(policy(32, "shared"), max_num_seqs=2)
    s = samples(0, 3, 6, 4)
    add(sched, s[0], s[1:])
    plan = step(sched)  # 3 samples > max_num_seqs, but waiting for room would wait forever
    assert planned(plan) == [(0, 0, 6)] and not plan.refused
    assert sorted(sched.policy.seq_ids()) == [0, 1, 2]  # the two others were forked from the prompt
    run_to_the_end(sched)


def test_a_request_that_never_fits_is_refused_and_the_queue_moves_on():
    sched = ContinuousScheduler(policy(4))
    add(sched, seq(0, 4, 4))
    add(sched, seq(1, 30, 10))  # needs 10 blocks at its longest, the pool has 4
    add(sched, seq(2, 4, 4))
    plan = step(sched)
    assert [r.request_id for r in plan.refused] == ["r1"] and plan.refused[0].status.name == "REFUSED"
    assert "can never fit" in plan.refused[0].refusal_reason and plan.refused[0].samples[0].finish_reason == "abort"
    assert planned(plan) == [(0, 0, 4), (2, 0, 4)] and not sched.waiting
    run_to_the_end(sched)


def test_the_token_budget_stops_admission_in_order():
    sched = ContinuousScheduler(policy(64), max_num_batched_tokens=20)
    for i, prompt_len in enumerate((8, 8, 4, 2)):
        add(sched, seq(i, prompt_len, 4))
    plan = step(sched)  # 8 + 8 = 16; + 4 = 20 is still within the budget; + 2 is not
    assert planned(plan) == [(0, 0, 8), (1, 0, 8), (2, 0, 4)] and waiting(sched) == [[3]]
    plan = step(sched)  # three decodes (3 tokens) + 2 = 5
    assert planned(plan) == [(0, 8, 1), (1, 8, 1), (2, 4, 1), (3, 0, 2)]


def test_preempted_requests_keep_their_place_at_the_head():
    sched = ContinuousScheduler(policy(3))
    for i in range(3):
        add(sched, seq(i, 4, 6))
    assert planned(step(sched)) == [(0, 0, 4), (1, 0, 4), (2, 0, 4)]
    add(sched, seq(3, 2, 2))  # arrives now: one block would do
    plan = step(sched)  # as in 06.2: 2 and then 1 are preempted for 0
    assert plan.preempted == 2 and planned(plan) == [(0, 4, 1)] and waiting(sched) == [[1], [2], [3]]
    plan = step(sched)  # one block is free: 3 would fit, but 1 (5 tokens, 2 blocks) is first in line
    assert planned(plan) == [(0, 5, 1)] and waiting(sched) == [[1], [2], [3]]
    run_to_the_end(sched)


def test_preempted_samples_finish_as_requests_of_their_own():
    sched = ContinuousScheduler(policy(4, "shared"))
    add(sched, seq(0, 4, 4))
    s = samples(1, 3, 6, 3)
    add(sched, s[0], s[1:])
    assert planned(step(sched)) == [(0, 0, 4), (1, 0, 6)]
    plan = step(sched)  # as in 06.2: the samples' copies on write do not fit, so they are preempted
    assert plan.preempted == 1 and waiting(sched) == [[1], [2], [3]]
    run_to_the_end(sched)
    assert all(len(x.output_ids) == 3 and x.finished for x in s)


def test_static_batching_keeps_the_split_samples_in_its_batch():
    sched = StaticScheduler(policy(4, "shared"))
    add(sched, seq(0, 4, 4))
    s = samples(1, 3, 6, 3)
    add(sched, s[0], s[1:])
    step(sched)
    plan = step(sched)
    assert plan.preempted == 1 and waiting(sched) == [[1], [2], [3]]
    run_to_the_end(sched)
    assert all(x.finished for x in s)
    assert sched.stats["batches"] == 1  # the parts finished in the batch they started in, not in a new one
