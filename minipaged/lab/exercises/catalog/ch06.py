"""Chapter 06's graded exercises: requeueing by recompute, preempting the newest, and admission."""

from minipaged.lab.exercises.catalog import Exercise

T = "tests/ch06_continuous_batching/test_scheduler.py"
G = "tests/ch06_continuous_batching/test_graded_exercises.py"

EXERCISES = [
    Exercise(
        id="06.1",
        title="ContinuousScheduler._requeue: a recomputed request goes back to the head",
        task="Put `request` (it holds no blocks now) back at the front of self.waiting, with its status "
             "RequestStatus.WAITING, so that it is prefilled again before anything new is admitted. A beam search "
             "(request.beam is not None) goes back whole, as the one sequence that "
             "request.beam.restart(self.next_seq_id()) returns (request.seqs = [it]): it starts over from its "
             "prompt. Otherwise each sequence after the first becomes a request of its own, "
             "request.split(seq, next(self._uids)), announced with "
             "self._on_split(request, part); `request` keeps only its first sequence, and the queue must then "
             "start with request, then the parts in their original order.",
        hint="appendleft puts a request at the front, so add the parts last one first, then `request` itself; "
             "split removes seq from request.seqs, so walk a copy of request.seqs[1:].",
        tests=(f"{G}::test_preempted_requests_go_back_to_the_head_of_the_queue_oldest_first",
               f"{G}::test_preempted_samples_come_back_as_one_request_each_in_order",
               f"{G}::test_a_preempted_beam_search_starts_over_whole"),
        minutes=20,
    ),
    Exercise(
        id="06.2",
        title="ContinuousScheduler._schedule_running: preempt the newest to make room",
        task="Walk self.running oldest first. If the policy can append every uncached token of the request "
             "(self.policy.can_append_all(self._appends(request))), plan it with self._plan(request, plan) and "
             "move on; if not, take the newest running request off the end of self.running, preempt it with "
             "self._preempt(victim, plan), and try the same request again. The one that is short may itself be "
             "the newest. Preempting the newest (last come, first out) keeps the oldest requests moving, so "
             "every request finishes.",
        hint="Use an index and a while loop: the list shrinks from its end while you walk it, and a preempted "
             "request was never planned this step, since it sits at or after the index.",
        tests=(f"{G}::test_the_newest_is_preempted_to_make_room_for_the_oldest",
               f"{G}::test_preemption_goes_on_until_the_older_ones_fit_and_can_take_the_one_that_is_short",
               f"{G}::test_requests_that_fit_run_in_admission_order_without_preempting_anyone",
               f"{G}::test_a_request_that_is_short_itself_is_the_one_preempted_when_it_is_the_newest",
               f"{G}::test_samples_are_preempted_together_for_an_older_request"),
        minutes=20,
    ),
    Exercise(
        id="06.3",
        title="ContinuousScheduler._admit: first come, first served",
        task="Admit requests from the head of self.waiting, in order, and stop at the first one that cannot "
             "start now: self._may_admit says no; something runs and the request's sequences (request.num_seqs) "
             "would take the running ones past self.max_num_seqs; self._over_budget says so; or "
             "self._allocate(request) returns False. Nobody behind it may jump the queue, or a long request could "
             "wait forever. A request that can never fit (self._never_fits gives a reason, or _allocate raises "
             "ValueError) is popped and passed to self._refuse(request, reason, plan); with nothing running, a "
             "request of several samples (not a beam search) that finds no room is popped and split by "
             "self._requeue(request); an admitted request is popped, given the status RequestStatus.RUNNING, "
             "appended to self.running and given its slots by self._plan(request, plan).",
        hint="A while loop on self.waiting[0]; `return` ends admission for this step. Check _never_fits before "
             "_allocate, and catch ValueError around _allocate.",
        tests=(f"{G}::test_nobody_jumps_the_queue",
               f"{G}::test_max_num_seqs_counts_the_sequences_already_running",
               f"{G}::test_a_request_of_several_samples_counts_each_sample",
               f"{G}::test_with_nothing_running_the_head_is_admitted_whatever_its_size",
               f"{G}::test_a_request_that_never_fits_is_refused_and_the_queue_moves_on",
               f"{G}::test_the_token_budget_stops_admission_in_order",
               f"{G}::test_preempted_requests_keep_their_place_at_the_head",
               f"{G}::test_preempted_samples_finish_as_requests_of_their_own",
               f"{G}::test_static_batching_keeps_the_split_samples_in_its_batch",
               f"{T}::test_first_come_first_served_and_max_num_seqs",
               f"{T}::test_token_budget_limits_prefill_tokens_per_step",
               f"{T}::test_a_request_that_can_never_fit_is_refused_and_the_others_run",
               f"{T}::test_samples_that_could_outgrow_the_pool_together_are_admitted",
               f"{T}::test_samples_that_do_not_fit_side_by_side_in_an_empty_pool_are_split",
               f"{T}::test_static_admits_nothing_until_the_whole_batch_is_done",
               f"{T}::test_the_scheduler_plans_slots_the_policy_really_handed_out",
               f"{T}::test_pressure_preempts_the_newest_and_everything_finishes[continuous-recompute]",
               f"{T}::test_parallel_samples_under_pressure[recompute]"),
        minutes=35,
    ),
]
