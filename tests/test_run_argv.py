"""``simsrv run`` read without typer (sim/cli/run_argv.py) means what typer reads: the same
options, the same arguments to ``run_command``, and typer for every other form."""

from __future__ import annotations

import inspect
import typing
from pathlib import Path
from typing import List, Optional

import pytest

import sim.cli.app as cli
from sim.cli.run_argv import RUN_OPTIONS, parse_run_argv

_KIND = {Optional[str]: "text", Optional[int]: "integer", List[str]: "text, repeatable",
         Optional[Path]: "path", bool: "flag"}


def test_options_table_is_the_declared_run_command():
    hints = typing.get_type_hints(cli.run)
    declared = {}
    for name, p in inspect.signature(cli.run).parameters.items():
        decls = getattr(p.default, "param_decls", None)
        if name == "scenario":
            assert hints[name] is Path and not decls  # the one argument
            continue
        for d in decls:
            declared[d] = (name, _KIND[hints[name]])
    assert declared == RUN_OPTIONS


def _typer_reads(argv: list[str], monkeypatch) -> dict:
    got = {}

    def capture(scenario, policy, chunk, set_, out, quiet, force):
        got.update(scenario=scenario, policy=policy, chunk=chunk, set_=list(set_), out=out, quiet=quiet,
                   force=force)

    monkeypatch.setattr(cli, "run_command", capture)
    rc = cli.app(args=argv, standalone_mode=False)
    assert not rc and got, (rc, argv)
    return got


PLAIN = [
    ["run", "s.yaml"],
    ["run", "s.yaml", "-q"],
    ["run", "--quiet", "s.yaml", "--force"],
    ["run", "s.yaml", "--policy", "chunked", "--chunk", "512", "--out", "o/d", "-q", "--force"],
    ["run", "--chunk", "0", "s.yaml"],
    ["run", "--chunk", "123456789012345678", "s.yaml"],
    ["run", "s.yaml", "--set", "engine.max_num_seqs=4", "--set", "seed=3", "--set", "name=a b=c"],
    ["run", "dir with space/s.yaml", "--out", "x=y", "--policy", "no-such-policy"],
]


@pytest.mark.parametrize("argv", PLAIN)
def test_plain_forms_read_as_typer_reads_them(argv, monkeypatch):
    fast = parse_run_argv(argv)
    assert fast is not None, argv
    assert fast == _typer_reads(argv, monkeypatch)


@pytest.mark.parametrize("argv", [
    [], ["--version"], ["-v", "run", "s.yaml"], ["explain", "s.yaml"], ["run"], ["run", "--help"],
    ["run", "s.yaml", "--help"], ["run", "a.yaml", "b.yaml"], ["run", "s.yaml", "--out"],
    ["run", "s.yaml", "--out=o"], ["run", "s.yaml", "-qv"], ["run", "s.yaml", "-v"], ["run", "s.yaml", "--"],
    ["run", "s.yaml", "--out", "a", "--out", "b"], ["run", "s.yaml", "-q", "--quiet"], ["run", ""],
    ["run", "-"], ["run", "s.yaml", "--set", ""], ["run", "s.yaml", "--set", "-x"],
    ["run", "s.yaml", "--chunk", "-1"], ["run", "s.yaml", "--chunk", "+5"], ["run", "s.yaml", "--chunk", "05"],
    ["run", "s.yaml", "--chunk", "1_000"], ["run", "s.yaml", "--chunk", " 5"], ["run", "s.yaml", "--chunk", "٥"],
    ["run", "s.yaml", "--chunk", "1234567890123456789"], ["run", "s.yaml", "--no-such-option"],
])
def test_every_other_form_is_typers(argv):
    assert parse_run_argv(argv) is None


def test_shell_completion_request_is_typers(monkeypatch):
    monkeypatch.setenv("_SIMSRV_COMPLETE", "bash_complete")
    assert parse_run_argv(["run", "s.yaml"]) is None


def test_plain_run_shows_a_traces_warnings_as_one_line(tmp_path):
    """The warning hook is the command line's, not typer's: a plain run (read without typer)
    prints a trace's left-out rows as one ``warning:`` line, as every other command does."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    p = subprocess.run([sys.executable, "-m", "sim", "run", "scenarios/trace_vllm_bench.yaml", "-q", "--out",
                        str(tmp_path / "o")], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert p.stderr.splitlines() == ["warning: traces/samples/vllm_bench_schema_example.json: 1 failed requests "
                                     "(errors / 0 output tokens): left out"], p.stderr


def test_version_without_typer_prints_what_typer_prints(capsys):
    from sim.cli.entry import main

    main(["--version"])
    fast = capsys.readouterr()
    assert cli.app(args=["--version"], standalone_mode=False) == 0
    assert capsys.readouterr() == fast and fast.out.startswith("simsrv ") and fast.out.count("\n") == 2
