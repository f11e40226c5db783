"""Every `paraplan <stage> --help` example can be pasted: each names files that exist in
the repository (or says what makes them), continues its lines with a backslash, writes
nothing into the shipped config/, and the cheap ones run as printed."""

from __future__ import annotations

import glob
import shlex

import pytest

from paraplan.cli.main import _commands, build_parser, main

COMMANDS = [module.NAME for module in _commands()]


def _help(command: str) -> str:
    sub = build_parser()._subparsers._group_actions[0].choices[command]
    return sub.format_help()


def _examples(command: str) -> list[str]:
    """The help's example commands, continuation lines joined, trailing comments dropped."""
    out: list[str] = []
    pending = ""
    for line in _help(command).splitlines():
        text = line.strip()
        if pending:
            text = pending + " " + text
            pending = ""
        elif not text.startswith("paraplan "):
            continue
        if text.endswith("\\"):
            pending = text[:-1].rstrip()
            continue
        out.append(text.split("  #")[0].strip())
    return out


def test_every_stage_shows_examples():
    shown = {command: len(_examples(command)) for command in COMMANDS}
    assert all(shown.values()), shown


@pytest.mark.parametrize("command", COMMANDS)
def test_examples_name_repository_files_that_exist(command, repo_root):
    for example in _examples(command):
        assert "   " not in example, f"a line continuation was swallowed: {example}"
        words = shlex.split(example)
        for i, word in enumerate(words):
            if words[i - 1] in ("-o", "--output"):
                assert not word.startswith("config/"), f"overwrites a shipped file: {example}"
            elif word.startswith(("data/", "config/")):
                assert glob.glob(str(repo_root / word)), f"{word} does not exist: {example}"


def _run_as_printed(example: str, tmp_path, monkeypatch, repo_root) -> int:
    """Run an example from the repository root, with its output under tmp_path."""
    words = shlex.split(example)[1:]
    at = words.index("-o") + 1
    words[at] = str(tmp_path / words[at])
    monkeypatch.chdir(repo_root)
    return main([*words, "--no-track"])


@pytest.mark.parametrize(("command", "index"), [("predict", 0), ("fit", 1), ("fit", 3), ("ingest", 0),
                                                ("ingest", 1)])
def test_cheap_examples_run_as_printed(command, index, tmp_path, monkeypatch, repo_root):
    examples = _examples(command)
    assert _run_as_printed(examples[index], tmp_path, monkeypatch, repo_root) == 0


def test_plan_help_names_every_preset():
    from paraplan.predict.models import PRESETS

    text = " ".join(_help("plan").split())
    assert "a preset (gpt3-125m, gpt3-350m," in text
    for name in PRESETS:
        assert name in text, name


@pytest.mark.parametrize("command", COMMANDS)
def test_help_never_splits_a_name_at_its_hyphen(command):
    """`--kernel-\\nceilings` or `gpt-\\noss-20b` cannot be pasted or searched for."""
    split = [line for line in _help(command).splitlines() if line.rstrip().endswith("-")]
    assert not split, split
