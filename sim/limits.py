"""Upper bounds of user-given sizes, lengths and times.

Why: beyond these a value is a typo, a wrong unit or a corrupted row, never a deployment; and
sizing arrays or event loops from it would exhaust memory (or wrap an int64 to a negative
count) before any error could be shown. Every bound is checked where the value is read, with
one error line naming the key or the file and line.
"""

from __future__ import annotations

# NOTE: the longest context of any published model is ~10M tokens (Llama 4 Scout); 1e9 tokens
# per request leaves two orders of magnitude and stays far from int64 (and int32) overflow.
MAX_TOKENS = 1_000_000_000
# requests in one run, sessions, groups: 1e8 requests already take tens of GB of results
MAX_REQUESTS = 100_000_000
# replicas or GPUs of one deployment / pool
MAX_REPLICAS = 100_000
# sequences in a batch, blocks per sequence, hash ids per prompt and similar engine counts
MAX_COUNT = 1_000_000_000
# any duration or timestamp, after conversion to seconds: ~317 years (epoch seconds are ~1.8e9)
MAX_TIME_S = 1e10
# the span of one trace, first to last arrival: ~3 years of simulated time
MAX_TRACE_SPAN_S = 1e8
# seeds: numpy accepts any non-negative integer; sweeps add the seed index, so stay well inside int64
MAX_SEED = 2**32 - 1
# prefix-block ids one synthetic workload may hold (8 bytes each: 4 GB)
MAX_HASH_BLOCKS = 500_000_000
# milliseconds, GB/s, $/h and other physical figures: finite and below this
MAX_FIGURE = 1e12
