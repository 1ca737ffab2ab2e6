"""Upper bounds of user-given sizes, lengths and times.

Why: beyond these a value is a typo, a wrong unit or a corrupted row, never a deployment; and
sizing arrays or event loops from it would exhaust memory (or wrap an int64 to a negative
count) before any error could be shown. Every bound is checked where the value is read, with
one error line naming the key or the file and line; times derived from them (arrivals drawn
from a rate, rescaled by a time scale) are checked too: ``check_last_arrival_s``.
"""

from __future__ import annotations

from sim.errors import UserError

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


def check_last_arrival_s(last_s: float, key: str, cause: str) -> None:
    """Refuse a workload whose arrivals, as drawn or rescaled, reach past ``MAX_TIME_S``.

    Why: every input may be in range while what it implies is not (a rate of 1e-20 req/s puts
    20 requests ~1e21 s apart; 5e-324 makes the gaps infinite). Past ~1e10 s a float's spacing
    exceeds a microsecond and grows with the clock: at 1e21 s a step of a few milliseconds adds
    nothing, latencies come out 0 or negative, and infinite arrivals are never reached (their
    requests vanish from the results). One check for every source of arrival times (synthetic
    rates and rate profiles, session think times, a closed loop's think time, a trace's time
    scale or target rate): ``key`` is the scenario key to change, ``cause`` what it gave."""
    if not last_s <= MAX_TIME_S:  # also NaN
        raise UserError(f"{key}: {cause} puts the last arrival at {last_s:.3g} s, past simsrv's limit of "
                        f"{MAX_TIME_S:.0e} s (~317 years) on simulated time; make the arrivals denser "
                        "or the workload smaller")
