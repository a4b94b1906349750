"""Chapter 07's benchmark: SmolLM2 with the prefix cache off and on, the same requests side by side.

    python -m minipaged bench prefix [--questions 16] [--turns 6] [--max-tokens 32] [--repeats 3] [--plot-dir DIR]

Two workloads, each served by two engines that differ only in ``enable_prefix_caching`` (both
``kv_policy="shared"``, the same KV capacity, the batched PyTorch attention, greedy decoding):

    system prompt   --questions chat requests in one ``generate`` call, all starting with the same
                    long system prompt (the rules of a made-up library's help desk). Without the
                    cache every request prefills the system prompt; with it the first one does, and
                    the others, admitted in the same step, find its blocks (they are "promised").
    conversation    one chat of --turns turns; each turn sends the whole history again, as a chat
                    API does. Without the cache each turn prefills everything so far; with it only
                    what is new since the last turn (the earlier turns' blocks, answers included).

Printed: prompt tokens computed, wall time, time to first token (p50 over the requests, or per
turn), the ratios, whether the outputs are identical token for token, and the cache's hit rate.
With --plot-dir it saves prefix_turns.png (prompt tokens computed and TTFT per turn).

One process, the two engines one after the other on each workload, in --repeats rounds (who goes
first alternates, the cache is emptied with ``LLM.reset_prefix_cache`` before each round, times are
medians); a warm-up request first, so that neither pays for first-call overheads. Not measured:
arrivals over time, eviction under memory pressure (the simulator does that:
``python -m minipaged simulate --prefix``).
"""

from __future__ import annotations

import copy
import os
import time
from statistics import median

from minipaged.lab.bench import add_attention_argument, add_output_arguments, finish, identical_outputs_line

SYSTEM_PROMPT = (
    "You are the help desk of the Riverside Community Library. Follow these rules in every answer. "
    "Be brief: two sentences at most, in plain words, without lists or headings. "
    "Opening hours: Monday to Friday from nine in the morning to eight in the evening, Saturday from ten "
    "to four, closed on Sunday and on public holidays. "
    "Membership is free for anyone who lives, works or studies in the county; bring a photo card and a "
    "letter with your address. Children under twelve need a parent to sign the form. "
    "Members may borrow up to twelve items at a time: books for three weeks, films and games for one "
    "week. Items can be renewed twice online or at the desk, unless someone else has reserved them. "
    "Late returns cost ten cents a day per book and fifty cents a day per film, up to five dollars per "
    "item. Lost items are charged at their replacement cost. "
    "The reading room on the second floor is for quiet study; the group rooms on the first floor can be "
    "booked for two hours at a time, up to a week ahead. "
    "Printing costs ten cents a page in black and white and fifty cents in color; the wireless network "
    "is free and needs no password. "
    "If a question is not about the library, say politely that you can only help with library matters. "
    "If you do not know the answer, say so and suggest asking a librarian at the front desk."
)

QUESTIONS = [
    "When are you open on Saturday?", "How many books can I borrow?", "What does a late film cost?",
    "Can my ten-year-old get a card?", "How do I renew a book?", "Is the wifi free?",
    "How much is color printing?", "Can I book a room for my study group?", "What if I lose a book?",
    "Are you open on Sunday?", "How long can I keep a game?", "What do I need to join?",
    "Where can I study quietly?", "Can you recommend a good pizza place?", "How long can I keep a book?",
    "Do you charge for late books?",
]

CONVERSATION = [
    "Hi! I just moved to the county. Can I join the library?",
    "What should I bring with me?",
    "Great. How many things can I take home at once?",
    "And how long can I keep a film?",
    "What happens if I bring it back two days late?",
    "Can I print my boarding pass there?",
    "Thanks. When do you close today, a Tuesday?",
    "One last thing: is there somewhere quiet to work?",
]


def _engine(model, cache: bool, kv_capacity: int, attention: str, max_num_seqs: int):
    from minipaged import LLM

    return LLM(model, kv_policy="shared", enable_prefix_caching=cache, kv_capacity_tokens=kv_capacity,
               attention_backend=attention, max_num_seqs=max_num_seqs, progress=False)


def _ttft(out) -> float:
    return out.metrics["first_token_time"] - out.metrics["arrival_time"]


def run_system_prompt(llms: dict, questions, params, system_prompt: str = SYSTEM_PROMPT) -> dict:
    chats = [[{"role": "system", "content": system_prompt}, {"role": "user", "content": q}] for q in questions]
    result = {}
    for key, llm in llms.items():
        start = time.perf_counter()
        outs = llm.chat(chats, params, use_tqdm=False)
        wall = time.perf_counter() - start
        result[key] = {"wall_s": wall, "prompt_tokens": sum(len(o.prompt_token_ids) for o in outs),
                       "computed": sum(len(o.prompt_token_ids) - o.num_cached_tokens for o in outs),
                       "ttft_p50_s": median([_ttft(o) for o in outs]),
                       "tokens": [o.outputs[0].token_ids for o in outs]}
    result["system_prompt_tokens"] = len(next(iter(llms.values())).tokenizer.encode(system_prompt))
    return result


def run_conversation(llms: dict, turns, params, system_prompt: str = SYSTEM_PROMPT) -> dict:
    histories = {key: [{"role": "system", "content": system_prompt}] for key in llms}
    rows = []
    for i, message in enumerate(turns):
        row = {"turn": i + 1}
        for key, llm in llms.items():
            histories[key].append({"role": "user", "content": message})
            start = time.perf_counter()
            (out,) = llm.chat(histories[key], params, use_tqdm=False)
            row[key] = {"wall_s": time.perf_counter() - start, "ttft": _ttft(out),
                        "computed": len(out.prompt_token_ids) - out.num_cached_tokens,
                        "tokens": out.outputs[0].token_ids}
            row["prompt_tokens"] = len(out.prompt_token_ids)
            histories[key].append({"role": "assistant", "content": out.outputs[0].text})
        rows.append(row)
    return {"turns": rows}


def _medians(runs: list[dict], timed: tuple) -> dict:
    """The first run, with each timed field replaced by its median over all runs (the token counts and
    outputs are the same in every run; ``identical_runs`` says whether they were)."""
    merged = copy.deepcopy(runs[0])
    for key in ("cold", "warm"):
        for field in timed:
            merged[key][field] = median([r[key][field] for r in runs])
    return merged


def run(model="smollm2-135m", questions=16, turns=6, max_tokens=32, kv_capacity=16384, attention="torch_batched",
        repeats=3, progress=True, plot_dir=None, system_prompt: str = SYSTEM_PROMPT) -> dict:
    from tqdm import tqdm

    from minipaged import SamplingParams

    if not 1 <= questions <= len(QUESTIONS):
        raise ValueError(f"questions={questions} must be in [1, {len(QUESTIONS)}]")
    if not 1 <= turns <= len(CONVERSATION):
        raise ValueError(f"turns={turns} must be in [1, {len(CONVERSATION)}]")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats={repeats!r} must be an integer >= 1")
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    llms = {key: _engine(model, key == "warm", kv_capacity, attention, max_num_seqs=questions)
            for key in ("cold", "warm")}
    for llm in llms.values():  # first-call overheads
        llm.generate(["Warm-up."], SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)
    batches, chats = [], []
    for r in tqdm(range(repeats), desc="bench prefix", unit="round", disable=not progress):
        order = dict(reversed(llms.items())) if r % 2 else llms  # alternate who goes first
        llms["warm"].reset_prefix_cache()  # every round starts cold
        batches.append(run_system_prompt(order, QUESTIONS[:questions], params, system_prompt))
        llms["warm"].reset_prefix_cache()
        chats.append(run_conversation(order, CONVERSATION[:turns], params, system_prompt))
    policy = llms["warm"].engine.policy
    policy.check_invariants()
    assert not policy.seq_ids() and policy.num_free_blocks == policy.num_blocks, "blocks leaked"
    batch = _medians(batches, ("wall_s", "ttft_p50_s"))
    turn_rows = [_medians([c["turns"][t] for c in chats], ("wall_s", "ttft")) for t in range(turns)]
    identical = all(b["cold"]["tokens"] == b["warm"]["tokens"] == batch["cold"]["tokens"] for b in batches) and all(
        c["turns"][t]["cold"]["tokens"] == c["turns"][t]["warm"]["tokens"] == turn_rows[t]["cold"]["tokens"]
        for c in chats for t in range(turns))
    result = {"model": model, "questions": questions, "turns": turns, "max_tokens": max_tokens,
              "kv_capacity": kv_capacity, "attention": attention, "repeats": repeats, "system_prompt": batch,
              "conversation": {"turns": turn_rows}, "identical_outputs": identical,
              "hit_rate": policy.hit_rate(), "evictions": policy.evictions}
    if plot_dir:
        from minipaged.lab.plots import plot_turns

        os.makedirs(plot_dir, exist_ok=True)
        result["plot"] = os.path.join(plot_dir, "prefix_turns.png")
        plot_turns(turn_rows, path=result["plot"],
                   title=f"{model}: a {turns}-turn conversation, the whole history sent each turn")
    return result


def format_result(r: dict) -> str:
    b, turns = r["system_prompt"], r["conversation"]["turns"]
    cold, warm = b["cold"], b["warm"]
    lines = [f"{r['model']}, greedy, max_tokens {r['max_tokens']}, KV capacity {r['kv_capacity']} slots, "
             f"attention {r['attention']}; cold = prefix cache off, warm = on; times are medians of "
             f"{r['repeats']} rounds, cold and warm alternating, the cache emptied before each round\n",
             f"1. {r['questions']} chat requests in one batch, each starting with the same "
             f"{b['system_prompt_tokens']}-token system prompt",
             f"{'':<8}{'prompt tokens':>15}{'computed':>10}{'wall s':>9}{'TTFT p50 ms':>13}"]
    for key, s in (("cold", cold), ("warm", warm)):
        lines.append(f"{key:<8}{s['prompt_tokens']:>15}{s['computed']:>10}{s['wall_s']:>9.2f}"
                     f"{1000 * s['ttft_p50_s']:>13.0f}")
    ttft = cold["ttft_p50_s"] / warm["ttft_p50_s"]
    lines.append(f"warm computes {cold['computed'] / warm['computed']:.2f}x fewer prompt tokens, finishes "
                 f"{cold['wall_s'] / warm['wall_s']:.2f}x sooner, first tokens {ttft:.2f}x sooner (p50)\n")
    lines.append(f"2. a {len(turns)}-turn conversation, the whole history sent each turn")
    lines.append(f"{'turn':<6}{'prompt':>8}{'computed cold':>15}{'computed warm':>15}{'TTFT cold ms':>14}"
                 f"{'TTFT warm ms':>14}")
    for t in turns:
        lines.append(f"{t['turn']:<6}{t['prompt_tokens']:>8}{t['cold']['computed']:>15}{t['warm']['computed']:>15}"
                     f"{1000 * t['cold']['ttft']:>14.0f}{1000 * t['warm']['ttft']:>14.0f}")
    c = sum(t["cold"]["computed"] for t in turns)
    w = sum(t["warm"]["computed"] for t in turns)
    tc, tw = sum(t["cold"]["ttft"] for t in turns), sum(t["warm"]["ttft"] for t in turns)
    lines.append(f"over the conversation: {c / w:.2f}x fewer prompt tokens computed, {tc / tw:.2f}x less time to "
                 "first token in total\n")
    lines.append(identical_outputs_line(r, "in every round"))
    lines.append(f"warm engine: hit rate {100 * r['hit_rate']:.1f}% of the prompt tokens it looked up, "
                 f"{r['evictions']} evictions")
    if r.get("plot"):
        lines.append(f"saved {r['plot']}")
    return "\n".join(lines)


def add_arguments(p):
    p.add_argument("--model", default="smollm2-135m", help="model name (default: smollm2-135m)")
    p.add_argument("--questions", type=int, default=16,
                   help=f"requests sharing the system prompt, 1..{len(QUESTIONS)} (default: 16)")
    p.add_argument("--turns", type=int, default=6, help=f"turns of the conversation, 1..{len(CONVERSATION)} "
                                                        "(default: 6)")
    p.add_argument("--max-tokens", type=int, default=32, help="most new tokens per answer (default: 32)")
    p.add_argument("--kv-capacity", type=int, default=16384, help="KV token slots of each engine (default: 16384)")
    add_attention_argument(p, "attention backend of both engines (default: torch_batched)")
    p.add_argument("--repeats", type=int, default=3,
                   help="rounds of both workloads; times are the medians (default: 3)")
    add_output_arguments(p, "prefix_turns.png")


def main(args) -> int:
    r = run(args.model, args.questions, args.turns, args.max_tokens, args.kv_capacity, args.attention,
            repeats=args.repeats, progress=not args.json, plot_dir=args.plot_dir)
    return finish(r, args.json, format_result)
