"""Build-time generator of validation/traces/*.csv (not used at run time).

VC-23 (Sarathi-Serve Table 4, openchat_sharegpt4 part): 128 requests drawn without replacement
(numpy seed 0) from Sarathi-Serve's processed trace ``sharegpt_8k_filtered_stats_llama2_tokenizer.csv``
(microsoft/sarathi-serve @ 72339db5, data/processed_traces/, Apache-2.0; also in the vidur 0.0.26
sdist, MIT), with Poisson arrivals at 1.0 req/s (seed 0), written in vidur's trace format.
NOTE: the artifact's own 128-request sample and arrival seed are not published; this is one draw.

VC-22 (Sarathi-Serve capacity, openchat_sharegpt4): 2048 requests drawn the same way (seed 1),
Poisson at 1.0 req/s (a capacity search rescales the rate: ``workload.trace.target_rate``).

VC-19 (DeepSpeed-FastGen blog): 4096 prompt and generation lengths each drawn from a normal
distribution with the blog's means (2600 and 60) and a standard deviation of 30% of the mean
(its "30% variance", read as std = 0.3 x mean), seed 2, rounded, at least 1, prompts capped at
3916 and generations at 180 so that every pair fits Llama-2's 4096-token context. Sampled by
``{dist: empirical}``. No input file needed: ``python validation/make_traces.py --vc19``.

    python validation/make_traces.py /path/to/sharegpt_8k_filtered_stats_llama2_tokenizer.csv
"""

import sys
from pathlib import Path

import numpy as np
import polars as pl


def draw(df: pl.DataFrame, n: int, seed: int, name: str) -> None:
    rng = np.random.default_rng(seed)
    idx = rng.choice(len(df), size=n, replace=False)
    rows = df[idx.tolist()]
    arrivals = np.cumsum(rng.exponential(1.0, size=n)) - 0.0
    arrivals -= arrivals[0]
    out = pl.DataFrame({"arrived_at": np.round(arrivals, 6), "num_prefill_tokens": rows["num_prefill_tokens"],
                        "num_decode_tokens": rows["num_decode_tokens"]})
    dest = Path(__file__).parent / "traces" / name
    out.write_csv(dest)
    print(f"wrote {dest}: prompt median {int(out['num_prefill_tokens'].median())}, "
          f"output median {int(out['num_decode_tokens'].median())}")


def main(src: str) -> None:
    df = pl.read_csv(src)
    draw(df, 128, 0, "vc23_openchat_qps1_128.csv")
    draw(df, 2048, 1, "vc22_openchat_qps1_2048.csv")


def normal_lengths() -> None:
    rng = np.random.default_rng(2)
    prompt = np.clip(np.rint(rng.normal(2600, 0.3 * 2600, 4096)), 1, 3916).astype(np.int64)
    gen = np.clip(np.rint(rng.normal(60, 0.3 * 60, 4096)), 1, 180).astype(np.int64)
    dest = Path(__file__).parent / "traces" / "vc19_normal_p2600_g60.csv"
    pl.DataFrame({"prompt_tokens": prompt, "output_tokens": gen}).write_csv(dest)
    print(f"wrote {dest}: prompt mean {prompt.mean():.0f}, generation mean {gen.mean():.1f}")


if __name__ == "__main__":
    if sys.argv[1] == "--vc19":
        normal_lengths()
    else:
        main(sys.argv[1])
