"""Every command that results/summary.md, the README, the docs, the report captions or a
command's own --help examples suggest names things that exist: paraplan subcommands
and their current (not deprecated, not hidden) options, Snakemake rules given as
targets or to -R/--until/--omit-from, and Snakemake options (issue 21: the summary
suggested `snakemake -R plan --until plan`, and no rule is called plan, and the
deprecated `paraplan profile --batch`)."""

from __future__ import annotations

import argparse
import ast
import functools
import re
import shlex
from pathlib import Path

import pytest

from paraplan.cli.main import build_parser
from paraplan.report import summary

# a command, not a line of output ("paraplan predict: warning: ..." quotes what paraplan prints)
_INLINE = re.compile(r"`((?:snakemake|paraplan)(?: (?![a-z_]+:)[^`]*)?)`")
_RULE = re.compile(r"^(?:rule|checkpoint)\s+(\w+)\s*:", re.MULTILINE)
_RULE_OPTIONS = ("-R", "--forcerun", "--until", "-U", "--omit-from", "-O")


def _commands_in_text(text: str) -> list[str]:
    """Inline `snakemake ...`/`paraplan ...` spans, and the lines of fenced or indented
    code that start with one (continuation lines joined, comments dropped)."""
    found = _INLINE.findall(text)
    joined = re.sub(r"\\\n\s*", " ", text)
    fenced = False
    for line in joined.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not (fenced or line[:1].isspace() or line.startswith("$ ")):
            continue  # prose
        for part in line.strip().removeprefix("$ ").split("&&"):
            part = part.strip()
            if re.match(r"(snakemake|paraplan) -", part) or re.match(r"(snakemake|paraplan) [a-z_]+(\s|$)", part):
                found.append(part.split("  #")[0].split(" # ")[0].strip())
    return found


def _summary_commands() -> list[str]:
    """Every command any section of summary.md can suggest (the string constants of
    paraplan.report.summary, adjacent literals joined as Python joins them)."""
    tree = ast.parse(Path(summary.__file__).read_text())
    texts = [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)]
    return [c for text in texts for c in _INLINE.findall(text)]


def _doc_commands(repo_root: Path) -> list[tuple[str, str]]:
    sources = [repo_root / "README.md", repo_root / "results" / "README.md",
               *sorted((repo_root / "docs").glob("*.md")), *sorted((repo_root / "workflow" / "report").glob("*.rst")),
               *sorted((repo_root / "src" / "paraplan" / "cli").glob("*.py"))]
    out = []
    for path in sources:
        if path.is_file():
            text = path.read_text()
            if path.suffix == ".py":
                text = ast.get_docstring(ast.parse(text)) or ""
            out += [(path.name, c) for c in _commands_in_text(text)]
    return out


@pytest.fixture(scope="module")
def rules(repo_root) -> set[str]:
    texts = [(repo_root / "Snakefile").read_text(),
             *(p.read_text() for p in (repo_root / "workflow/rules").glob("*.smk"))]
    return {name for text in texts for name in _RULE.findall(text)}


def _visible_options(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions if a.help != argparse.SUPPRESS for s in a.option_strings}


@functools.cache
def _paraplan_commands() -> argparse._SubParsersAction:
    """paraplan's subcommands, parsed once: every command checked reads the same parser."""
    return next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))


@functools.cache
def _snakemake_options() -> tuple[set[str], set[str]]:
    """Snakemake's options and those that take a value (its parser takes 0.2 s to build)."""
    from snakemake.cli import get_argument_parser

    parser = get_argument_parser()
    return ({s for a in parser._actions for s in a.option_strings},
            {s for a in parser._actions if a.nargs != 0 for s in a.option_strings})


def _check_paraplan(words: list[str]) -> str | None:
    sub = _paraplan_commands()
    if len(words) < 2 or words[1] in ("-h", "--help") or words[1].startswith("<"):
        return None
    if words[1] not in sub.choices:
        return f"no paraplan command '{words[1]}'"
    options = _visible_options(sub.choices[words[1]])
    for word in words[2:]:
        option = word.strip("[]").split("=")[0]
        if option.startswith("-") and not re.fullmatch(r"-[0-9.]+", option) and option not in options:
            return f"paraplan {words[1]} has no option {option} (or it is deprecated)"
    return None


def _check_snakemake(words: list[str], rules: set[str]) -> str | None:
    known, takes_value = _snakemake_options()
    i, expect_rules = 1, True
    while i < len(words):
        word = words[i]
        option = word.split("=")[0]
        if option.startswith("-"):
            if option not in known:
                return f"snakemake has no option {option}"
            expect_rules = option in _RULE_OPTIONS
            if option in _RULE_OPTIONS:
                i += 1
                while i < len(words) and not words[i].startswith("-"):
                    if words[i] not in rules:
                        return f"no rule '{words[i]}' (after {option})"
                    i += 1
                continue
            if option in takes_value and "=" not in word:
                i += 2 if i + 1 < len(words) else 1
                expect_rules = False
                continue
        elif expect_rules and "/" not in word and "." not in word and word not in rules:
            return f"no rule '{word}'"
        i += 1
    return None


def _check(command: str, rules: set[str]) -> str | None:
    words = shlex.split(command.replace("...", ""))
    return _check_paraplan(words) if words[0] == "paraplan" else _check_snakemake(words, rules)


def test_the_summary_suggests_commands_that_exist(rules):
    commands = _summary_commands()
    assert any(c.startswith("snakemake -R plan_measured") for c in commands)
    assert len(commands) >= 15
    problems = [(c, p) for c in commands if (p := _check(c, rules))]
    assert problems == []


def test_a_generated_summary_suggests_commands_that_exist(rules):
    import pandas as pd

    from paraplan.report.summary import StageFiles, render

    plan = pd.DataFrame({"gbs": [32], "dp_no_overlap": [1.5], "dp_overlap": [1.6], "dp_p3": [1.7],
                         "best_hybrid": [1.9], "stages": ["[0-3]x2"]})
    profile = pd.DataFrame({"fwd_s": [1e-3], "bwd_s": [2e-3], "param_bytes": [4e6]})
    text = render(StageFiles({}, {"local-cpu": {"fits": []}}, {"mlp": (profile, {"batch_size": 8})}, {},
                             {"mlp__local-cpu": plan}, {}))
    commands = _INLINE.findall(text)
    assert "snakemake -R plan_measured --until plan_measured" in commands
    problems = [(c, p) for c in commands if (p := _check(c, rules))]
    assert commands and problems == []


def test_the_docs_suggest_commands_that_exist(repo_root, rules):
    commands = _doc_commands(repo_root)
    assert len(commands) >= 20
    problems = [(where, c, p) for where, c in commands if (p := _check(c, rules))]
    assert problems == []


@pytest.mark.parametrize(("command", "problem"), [
    ("snakemake -R plan --until plan", "no rule 'plan' (after -R)"),
    ("paraplan profile --model NAME --batch B -o PROFILE.csv", "paraplan profile has no option --batch (or it is "
                                                               "deprecated)"),
    ("snakemake --untill bench_all", "snakemake has no option --untill"),
    ("paraplan plan --help", None),
    ("paraplan plann -o x", "no paraplan command 'plann'"),
])
def test_the_checker_finds_what_issue_21_found(rules, command, problem):
    assert _check(command, rules) == problem
