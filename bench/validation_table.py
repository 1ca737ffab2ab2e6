"""Print the README's validation table (markdown) from a full ``simsrv validate`` run.

    python bench/validation_table.py > /tmp/table.md
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's sim/, not an installed one

from sim.reporting.validate_page import summary_lines
from sim.analysis.validate import fmt_value, run_validation


def main() -> None:
    rows = run_validation()
    print("| row | level | metric | measured | simulated | err | tolerance |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: |")
    for r in rows:
        if r.simulated is None:
            continue
        if r.level == "ordering":
            print(f"| {r.id} | ordering | {r.metric} | ranked | {'same' if r.simulated == 1.0 else '**wrong**'} | | |")
        elif r.measured is None:  # a simulated capacity that only a ratio row compares
            print(f"| {r.id} | {r.level} | {r.metric} | - | {fmt_value(r.simulated)} | | |")
        else:
            flag = "" if r.within else " **x**"
            print(f"| {r.id} | {r.level} | {r.metric} | {fmt_value(r.measured)} | {fmt_value(r.simulated)} | "
                  f"{r.err * 100:+.1f}%{flag} | ±{r.tolerance:.0%} |")
    print()
    for line in summary_lines(rows):
        print(f"- {line}")
    skipped = [r for r in rows if r.simulated is None]
    if skipped:
        from collections import Counter

        why = Counter(r.reason for r in skipped)
        print(f"- not reproduced ({len(skipped)} rows): " + "; ".join(f"{n} x {reason}" for reason, n in why.items()))


if __name__ == "__main__":
    main()
