"""Prompts that share prefixes: SGLang-style shared-prefix groups and multi-turn sessions.

Why: prefix caching only pays when prompts share leading blocks; these generators give each
prompt the ids of its ``hash_block_size``-token blocks (like Mooncake's ``hash_ids``), equal
ids meaning equal content from the start of the prompt.
"""

from __future__ import annotations

import numpy as np

from sim.errors import UserError
from sim.limits import MAX_HASH_BLOCKS


def check_blocks(total_blocks: int, block: int, where: str) -> None:
    """Refuse a workload whose prompts would need more block ids than memory holds."""
    if total_blocks > MAX_HASH_BLOCKS:
        raise UserError(f"{where}: the prompts span {total_blocks:,} blocks of {block} tokens, more than "
                        f"{MAX_HASH_BLOCKS:,} (the ids would not fit in memory); shorten the prompts or the workload")


class _Ids:
    """Fresh block ids, counted from 0."""

    def __init__(self) -> None:
        self.next = 0

    def take(self, n: int) -> np.ndarray:
        out = np.arange(self.next, self.next + n, dtype=np.int64)
        self.next += n
        return out


def prefix_group_prompts(rng: np.random.Generator, spec, block: int):
    """SGLang ``generated-shared-prefix`` (bench_serving.py): ``num_groups`` system prompts of
    ``system_prompt_tokens``, each followed by ``prompts_per_group`` questions of
    ``question_tokens``; the prompts are shuffled. Returns (input_tokens, hash_ids, group)."""
    ids = _Ids()
    check_blocks(spec.num_groups * spec.prompts_per_group * -(-(spec.system_prompt_tokens + spec.question_tokens) // block),
                 block, "workload.synthetic.prefix_groups")
    full = spec.system_prompt_tokens // block  # blocks wholly inside the shared system prompt
    total = -(-(spec.system_prompt_tokens + spec.question_tokens) // block)
    inp, hashes, group = [], [], []
    for g in range(spec.num_groups):
        shared = ids.take(full)
        for _ in range(spec.prompts_per_group):
            hashes.append(np.concatenate([shared, ids.take(total - full)]))
            inp.append(spec.system_prompt_tokens + spec.question_tokens)
            group.append(g)
    order = rng.permutation(len(inp))
    return np.asarray(inp, np.int64)[order], [hashes[i] for i in order], np.asarray(group, np.int64)[order]


def session_requests(start_s: np.ndarray, turns: np.ndarray, new_tokens: np.ndarray, out_tokens: np.ndarray,
                     gaps_s: np.ndarray, block: int):
    """Multi-turn sessions: turn k's prompt = turn k-1's prompt + its answer + ``new_tokens``.

    ``turns[s]`` turns for session s; ``new_tokens``, ``out_tokens``, ``gaps_s`` hold one value
    per turn, sessions one after another. Turn k+1 arrives ``gaps_s`` after turn k.
    NOTE: open loop: the next turn's time does not wait for the simulated answer.
    A turn's ids describe its prompt and its answer (ceil((prompt + answer) / block) ids): its
    generated blocks are cached under them (vLLM V1 caches generated tokens' full blocks too),
    and the next turn's prompt starts with all of them, so it can hit the previous answer.
    Returns (arrival_s, input_tokens, output_tokens, hash_ids, session_id), in session order.
    """
    ids = _Ids()
    arrival, inp, hashes, sess = [], [], [], []
    j = 0
    num_blocks = 0
    for s, (t0, k_turns) in enumerate(zip(start_s.tolist(), turns.tolist())):
        t, prev_in, prev_out, prev_ids = t0, 0, 0, np.zeros(0, np.int64)
        for k in range(k_turns):
            if k:
                t += float(gaps_s[j])
            length = prev_in + prev_out + int(new_tokens[j])
            out = int(out_tokens[j])
            num_blocks += -(-(length + out) // block)
            check_blocks(num_blocks, block, "workload.synthetic.multi_turn")
            cur = np.concatenate([prev_ids, ids.take(-(-(length + out) // block) - len(prev_ids))])
            arrival.append(t)
            inp.append(length)
            hashes.append(cur)
            sess.append(s)
            prev_in, prev_out, prev_ids = length, out, cur
            j += 1
    return (np.asarray(arrival), np.asarray(inp, np.int64), np.asarray(out_tokens[:j], np.int64), hashes,
            np.asarray(sess, np.int64))
