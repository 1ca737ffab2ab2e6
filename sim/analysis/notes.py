"""Modelling notes: the ``NOTE:`` comments of the modules a run used.

Why: every modelling assumption is marked ``NOTE:`` in the code (DESIGN.md section 7); the
report lists the ones that apply to the runs it shows, straight from the source, so the list
cannot drift from the code.
"""

from __future__ import annotations

import re
from importlib import resources

from sim.policies import get_policy

# Modules every run uses; each policy's spec names the modules its runs add.
ALWAYS = ("sim.memory", "sim.core.kv", "sim.policies.base", "sim.cost.roofline", "sim.cost.calibration", "sim.engine.cluster",
          "sim.engine.router", "sim.core.ttft", "sim.workload.synthetic", "sim.workload.trace")

_NOTE = re.compile(r"NOTE:\s*(.+)")


def _module_notes(module: str) -> list[str]:
    path = resources.files("sim").joinpath(*module.split(".")[1:-1], module.split(".")[-1] + ".py")
    if not path.is_file():
        return []
    notes: list[str] = []
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        m = _NOTE.search(line)
        if not m:
            continue
        text = [m.group(1).strip().rstrip('"')]
        # a note continues on following comment/docstring lines until a blank or code line
        for nxt in lines[i + 1:i + 6]:
            s = nxt.strip()
            if s.startswith("#"):
                s = s.lstrip("#").strip()
            elif not s or "=" in s or s.startswith(("def ", "class ", "return", '"""')) or s.endswith(":"):
                break
            if not s or "NOTE:" in s:
                break
            text.append(s.rstrip('"'))
        notes.append(" ".join(text).strip())
    return notes


def notes_for(policies: list[str]) -> list[tuple[str, str]]:
    """(module, note) pairs for runs of these policies, each once, in a stable order."""
    mods: list[str] = list(ALWAYS)
    for p in policies:
        for m in get_policy(p).note_modules:
            if m not in mods:
                mods.append(m)
    out, seen = [], set()
    for m in mods:
        for n in _module_notes(m):
            if n not in seen:
                seen.add(n)
                out.append((m.removeprefix("sim."), n))
    return out
