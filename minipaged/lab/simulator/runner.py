"""A runner without a model, for the simulators: the real scheduler, KV policy and core, in milliseconds.

Every "forward pass" is free, and each sequence's next token comes from a function of the sequence
(``token_of(seq)``, token 7 unless told otherwise); a beam's candidates from ``candidates_of(width)``.
It answers ``execute(plan)`` with the same plain data as the engine's runners (step.py's
``RunnerOutput``), through the same sampling loop (sampling.py's ``step_outputs``), so drafts are
checked, forks get their first tokens and beams are ranked exactly as with a model.

What it cannot tell is how long a step takes: the simulators put a cost model on top (serving.py).
"""

from __future__ import annotations

from minipaged.sampling import step_outputs
from minipaged.step import RunnerOutput, Sampled


class Ahead:
    """A sequence as it would read with ``before`` appended (the tokens drawn earlier in this step, from
    a draft's earlier rows): what ``token_of`` looks at, without changing the sequence."""

    def __init__(self, seq, before):
        self._seq, self.output_ids = seq, seq.output_ids + list(before)

    @property
    def all_ids(self) -> list[int]:
        return self._seq.prompt_ids + self.output_ids

    @property
    def num_tokens(self) -> int:
        return len(self._seq.prompt_ids) + len(self.output_ids)

    def __getattr__(self, name):
        return getattr(self._seq, name)


class SyntheticRunner:
    def __init__(self, token_of=None, candidates_of=None):
        self.token_of = token_of or (lambda seq: 7)
        # candidates_of(width) -> a beam's 2 * width (token, logprob), best first (beam search)
        self.candidates_of = candidates_of or (lambda width: [(7 + i, -1.0 - i) for i in range(2 * width)])
        self.num_copies = 0  # block copies the plans asked for (a model runner would make them)

    def make_generator(self, seed):
        return None

    def reset(self) -> None:
        pass

    def execute(self, plan) -> RunnerOutput:
        self.num_copies += len(plan.copies)  # there is no K/V to copy or swap

        def draw(i, j, seq, before):
            return Sampled(self.token_of(Ahead(seq, before) if before else seq))

        return RunnerOutput(step_outputs(plan.work, draw, lambda i, work: self.candidates_of(work.beam_width)),
                            plan.num_tokens)
