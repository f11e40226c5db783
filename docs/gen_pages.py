"""The documentation pages that are written from the code, never by hand.

- `cli.md`: every `paraplan <command>` with its description and options, read from the
  same argparse parsers that print `paraplan <command> --help`;
- `vocabulary.md`: the glossary (`paraplan.core.glossary.TERMS` and its closed choices);
- `config-keys.md`: every key of the workflow config, read from
  `workflow/schemas/config.schema.yaml` (and the schemas it references).

A hand-written page shows a committed table of figures with a marker
`<!-- include: PATH -->` (`on_page_markdown`): the figures are a command's, never copied.
Those tables (`FIGURE_TABLES`) are written by this file or by the benchmark script that owns
them, and `--check` fails when one is not what its command prints now:

- `benchmarks/results/plans.md`: the best plan of `paraplan plan --model` for the benchmark
  models (`docs/figure_tables.py`);
- `benchmarks/results/dapple-plans.md`: `paraplan plan --profile` on the PipeDream profiles
  (`docs/figure_tables.py`);
- `benchmarks/results/calibrations.md`: the errors each shipped calibration
  (`config/calibrations/*.json`) records (`docs/figure_tables.py`);
- `benchmarks/results/published-summary.md`: `benchmarks/bench_published.py --markdown`.

mkdocs runs this file as a hook (`hooks:` in mkdocs.yml): the three pages are made
in memory at every `mkdocs build` or `mkdocs serve`, so they cannot go stale. The
same key table is also committed as `config/README.md`, for readers of the folder:

    python docs/gen_pages.py             # rewrite config/README.md and the tables of figures
    python docs/gen_pages.py --check     # exit 1 if any of them is stale
    python docs/gen_pages.py --out DIR   # also write the three pages into DIR
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent
SCHEMAS = REPO_ROOT / "workflow" / "schemas"
CONFIG_README = REPO_ROOT / "config" / "README.md"
NOTE = "<!-- Written by docs/gen_pages.py from {source}; do not edit. -->\n"


# ---------------------------------------------------------------- helpers


def _cell(text: object) -> str:
    """One Markdown table cell: one line, pipes escaped."""
    text = re.sub(r"\s+", " ", str(text)).strip()
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|")


def _code(value: object) -> str:
    text = json.dumps(value, separators=(", ", ": ")) if not isinstance(value, str) else value
    return f"`{text}`" if text else '`""`'


# ---------------------------------------------------------------- cli.md


def _help_text(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """An option's help as `--help` prints it (defaults expanded, as the house formatter adds them)."""
    formatter = parser._get_formatter()
    return formatter._expand_help(action) if action.help else ""


def _option_rows(parser: argparse.ArgumentParser) -> Iterator[tuple[str, list[str]]]:
    """(group title, table rows) per argument group that has visible options."""
    for group in parser._action_groups:
        rows = []
        for action in group._group_actions:
            if action.help == argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
                continue
            if action.option_strings:
                metavar = "" if action.nargs == 0 else f" {action.metavar or action.dest.upper()}"
                names = ", ".join(f"`{o}{metavar}`" for o in action.option_strings)
            else:
                names = f"`{action.metavar or action.dest}`"
            rows.append(f"| {names} | {_cell(_help_text(parser, action))} |")
        if rows:
            yield group.title or "options", rows


def cli_page() -> str:
    from paraplan.cli.main import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {choice.dest: choice.help for choice in sub._choices_actions}
    lines = [
        NOTE.format(source="the argparse parsers of `paraplan <command> --help`"),
        "",
        "# Command line\n",
        "Every stage of the workflow is one `paraplan` command and also runs on its own;",
        "`paraplan <command> --help` prints what this page shows. `python -m paraplan` is the",
        "same program. A bad input ends in one line naming the file, key or option and what",
        "was expected, with exit status 2.\n",
        "| command | what it does |",
        "|---|---|",
    ]
    lines += [f"| [`{name}`](#{name}) | {_cell(helps[name])} |" for name in sub.choices]
    for name, cmd in sub.choices.items():
        lines += ["", f"## {name}", "", "```text", (cmd.description or "").strip(), "```", ""]
        for title, rows in _option_rows(cmd):
            lines += [f"**{title}**", "", "| option | meaning |", "|---|---|", *rows, ""]
    return "\n".join(lines).rstrip() + "\n"


# ---------------------------------------------------------------- vocabulary.md


def vocabulary_page() -> str:
    from paraplan.core import glossary as g

    lines = [
        NOTE.format(source="`paraplan.core.glossary`"),
        "",
        "# Vocabulary\n",
        "paraplan gives each concept one name and uses it everywhere: in Python, in the input",
        "files and on the command line, where it is written in kebab case (`micro_batch_size`",
        "is `--micro-batch-size`). Where Megatron-LM has an argument for the concept, paraplan",
        "takes Megatron's name. Units are part of a name: `_s` seconds, `_bytes` bytes, `_GB`",
        "1e9 bytes, `_GBps` 1e9 bytes per second, `_Gbit_per_s` 1e9 bits per second.\n",
        f"The spellings of paraplan 0.1 in the last column are still read until paraplan {g.DEPRECATED_UNTIL},",
        "each with a deprecation warning naming the new one; in Python they are gone.",
        "The file contracts of [design.md](design.md) keep their short column names",
        "(`D, T, P, microbatches, batch_size`, the plan CSV's `gbs`): they label the figures",
        "and other tools read them.\n",
        "| name | meaning | paraplan 0.1 |",
        "|---|---|---|",
    ]
    for term in g.TERMS:
        old = ", ".join(f"`{o}`" for o in (*term.old_names, *term.old_options))
        lines.append(f"| `{term.name}` | {_cell(term.meaning)} | {old} |")
    choices: list[tuple[str, tuple[str, ...]]] = [
        ("SCHEDULES", g.SCHEDULES),
        ("GRADIENT_SYNCS", g.GRADIENT_SYNCS),
        ("RECOMPUTE_GRANULARITIES", g.RECOMPUTE_GRANULARITIES),
        ("DTYPES", g.DTYPES),
        ("EVENT_KINDS", g.EVENT_KINDS),
        ("STREAMS", g.STREAMS),
    ]
    lines += ["", "## Closed choices", "",
              "The values a file or option may take, as written in files.", "",
              "| choice | values |", "|---|---|"]
    lines += [f"| `{name}` | {', '.join(f'`{v}`' for v in values)} |" for name, values in choices]
    ops = ", ".join(f"`{op.name}` ({op.letter})" for op in g.PipelineOp)
    lines.append(f"| `PipelineOp` (an `IntEnum`) | {ops} |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- config keys


def _type(node: dict[str, Any]) -> str:
    if "enum" in node:
        return " \\| ".join(f"`{v}`" for v in node["enum"])
    if "const" in node:
        return _code(node["const"])
    kind = node.get("type", "")
    kinds = [k for k in (kind if isinstance(kind, list) else [kind]) if k]
    if "array" in kinds and isinstance(node.get("items"), dict):
        inner = _type(node["items"])
        kinds = [f"list of {inner}" if k == "array" else k for k in kinds]
    if not kinds and "anyOf" in node:
        kinds = [_type(option) for option in node["anyOf"]]
    return " or ".join(k for k in kinds if k)


def _load(ref: str) -> dict[str, Any]:
    schema: dict[str, Any] = yaml.safe_load((SCHEMAS / ref).read_text())
    return schema


def _key_rows(node: dict[str, Any], path: str) -> Iterator[tuple[str, str, str, str]]:
    """(key path, type, default, description) for every key under `node`."""
    if "$ref" in node:
        node = {**_load(node["$ref"]), **{k: v for k, v in node.items() if k != "$ref"}}
    for option in node.get("anyOf", []):
        if isinstance(option, dict) and "properties" in option:
            yield from _key_rows(option, path)
    for name, child in node.get("properties", {}).items():
        if child.get("deprecated"):
            continue
        key = f"{path}.{name}" if path else name
        default = _code(child["default"]) if "default" in child and child["default"] not in ({}, None) else ""
        required = " (required)" if name in node.get("required", []) else ""
        yield key, _type(child), default, _cell(child.get("description", "")) + required
        yield from _key_rows(child, key)
    items = node.get("items")
    if isinstance(items, dict) and "properties" in items:
        yield from _key_rows(items, f"{path}[]")
    extra = node.get("additionalProperties")
    if isinstance(extra, dict):
        yield f"{path}.<name>", _type(extra) or "object", "", "One entry, under a name of your choice."
        yield from _key_rows(extra, f"{path}.<name>")
    for case in node.get("allOf", []):
        model = case.get("if", {}).get("properties", {}).get("model", {}).get("const")
        settings = case.get("then", {}).get("properties", {}).get("settings")
        if model and settings:
            for key, kind, default, text in _key_rows(settings, f"{path}.settings"):
                yield key, kind, default, f"{text} (model `{model}`)"


def config_key_table() -> str:
    schema = yaml.safe_load((SCHEMAS / "config.schema.yaml").read_text())
    rows = ["| key | type | default | meaning |", "|---|---|---|---|"]
    rows += [f"| `{key}` | {kind} | {default} | {text} |" for key, kind, default, text in _key_rows(schema, "")]
    return "\n".join(rows) + "\n"


_KEYS_INTRO = """\
Every key of the workflow config (`config/config.yaml`, `--configfile`, `--config`), as
`workflow/schemas/config.schema.yaml` declares it. `<name>` stands for a name you choose.
Snakemake checks the config against the schema before any job runs; an unknown key or a
bad value stops it with the key's path. Keys of paraplan 0.1 that are still read are
left out (see the vocabulary).
"""


def config_keys_page() -> str:
    return (NOTE.format(source="workflow/schemas/config.schema.yaml") + "\n# Configuration keys\n\n"
            + _KEYS_INTRO.replace("the vocabulary", "the [vocabulary](vocabulary.md)") + "\n"
            + config_key_table())


def config_readme() -> str:
    return (NOTE.format(source="workflow/schemas/config.schema.yaml") + "\n# config/\n\n"
            "What the workflow and the commands read:\n\n"
            "- `config.yaml`: the default workflow config (small and real: minutes on a laptop);\n"
            "- `clusters/<name>.yaml`: hardware descriptions (`workflow/schemas/cluster.schema.yaml`);\n"
            "- `studies/<stage>/<name>.yaml`: named studies of `paraplan simulate` and `paraplan plan`\n"
            "  (`workflow/schemas/study_simulate.schema.yaml`, `study_plan.schema.yaml`);\n"
            "- `runs/*.csv`: run tables for `paraplan predict` (Megatron-LM's argument names);\n"
            "- `calibrations/*.json`: device-model calibrations made by `paraplan calibrate`;\n"
            "- `kernels/<device>.json`: a device's GEMM and attention ceilings made by\n"
            "  `paraplan fit --kind kernels` (`docs/kernels.md`).\n\n"
            "How to override keys and what is checked: `docs/configuration.md`.\n\n"
            "## Keys of the workflow config\n\n" + _KEYS_INTRO + "\n" + config_key_table())


# ---------------------------------------------------------------- mkdocs hook and CLI

PAGES: dict[str, Callable[[], str]] = {
    "cli.md": cli_page,
    "vocabulary.md": vocabulary_page,
    "config-keys.md": config_keys_page,
}


INCLUDE = re.compile(r"<!-- include: ([\w./-]+) -->")
"""A marker a hand-written page uses to show a file a benchmark script writes (path from
the repository root), e.g. `benchmarks/results/published-summary.md`."""


def on_page_markdown(markdown: str, **_: Any) -> str:
    """mkdocs hook: replace each include marker with the file it names."""
    return INCLUDE.sub(lambda m: (REPO_ROOT / m.group(1)).read_text(), markdown)


def on_files(files: Any, config: Any) -> Any:
    """mkdocs hook: add the generated pages to the site."""
    from mkdocs.structure.files import File

    for name, make in PAGES.items():
        files.append(File.generated(config, name, content=make()))
    return files


def figure_tables() -> Any:
    """docs/figure_tables.py, loaded by path (mkdocs loads this file as a hook, not as a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("figure_tables", Path(__file__).with_name("figure_tables.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def written_files() -> dict[Path, Callable[[], str]]:
    """Every committed file this command writes, with the function that writes it."""
    return {CONFIG_README: config_readme, **figure_tables().TABLES}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if config/README.md or a table of figures is stale (write nothing)")
    parser.add_argument("--out", type=Path, help="also write the generated pages into this folder")
    args = parser.parse_args(argv)
    stale = []
    for path, make in written_files().items():
        text = make()
        if args.check:
            if not path.is_file() or path.read_text() != text:
                stale.append(path.relative_to(REPO_ROOT).as_posix() if path.is_relative_to(REPO_ROOT) else str(path))
        else:
            path.write_text(text)
    if stale:
        print(f"stale: {', '.join(stale)}: run `python docs/gen_pages.py`", file=sys.stderr)
        return 1
    if args.out and not args.check:
        args.out.mkdir(parents=True, exist_ok=True)
        for name, make in PAGES.items():
            (args.out / name).write_text(make())
    return 0


if __name__ == "__main__":
    sys.exit(main())
