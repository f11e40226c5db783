"""The documentation site: the nav lists exactly the pages there are, the generated pages
say what the code says (every command option, every config key, every term), and
config/README.md is the schema's key table. `mkdocs build --strict` (in .ci/run) checks
links and anchors."""

from __future__ import annotations

import argparse
import re

import pytest
import yaml

from paraplan.cli.main import build_parser
from script_module import load_script


@pytest.fixture(scope="module")
def gen_pages(repo_root):
    return load_script(repo_root / "docs" / "gen_pages.py")


def _nav_files(nav) -> list[str]:
    out: list[str] = []
    for entry in nav:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        out += _nav_files(value) if isinstance(value, list) else [value]
    return out


def test_the_nav_lists_every_page_and_only_pages_that_exist(repo_root, gen_pages):
    config = yaml.safe_load((repo_root / "mkdocs.yml").read_text())
    nav = _nav_files(config["nav"])
    on_disk = {p.relative_to(repo_root / "docs").as_posix() for p in (repo_root / "docs").rglob("*.md")}
    generated = set(gen_pages.PAGES)
    assert len(nav) == len(set(nav)), "a page is listed twice"
    assert sorted(on_disk - set(nav)) == [], "pages missing from mkdocs.yml's nav: add `- Title: page.md` there"
    assert sorted(set(nav) - on_disk - generated) == [], "nav entries without a page"
    assert not on_disk & generated, "a generated page is also committed: delete it from docs/"
    assert config["hooks"] == ["docs/gen_pages.py"]


def test_config_readme_is_the_schemas_key_table(repo_root, gen_pages):
    assert (repo_root / "config" / "README.md").read_text() == gen_pages.config_readme(), (
        "config/README.md is stale: run `python docs/gen_pages.py`")


def test_the_tables_of_figures_are_what_the_commands_print_now(repo_root, gen_pages):
    """The plans, calibration errors and published-test summary the pages include are the
    commands' output for the code and calibrations as they are, never hand-edited copies."""
    tables = gen_pages.figure_tables()
    stale = [path.name for path, make in tables.TABLES.items()
             if make is not tables.published_summary and path.read_text() != make()]  # (test_published_tables)
    assert stale == [], f"stale: {stale}: run `python docs/gen_pages.py`"
    pages = "".join(p.read_text() for p in (repo_root / "docs").rglob("*.md"))
    for path in tables.TABLES:
        assert f"<!-- include: {path.relative_to(repo_root).as_posix()} -->" in pages, path.name


def test_the_plan_table_reads_the_commands_summary_line(gen_pages):
    printed = (
        "paraplan plan: 21564 candidates estimated, 6068 fit in memory by estimate\n"
        "paraplan plan: best: TP 4, PP 8, DP 32, micro-batch 2, v 12, interleaved_1f1b, no recomputation, sequence "
        "parallel, distributed optimizer: 16.2 s per iteration, 204 TFLOP/s per GPU, MFU 63.6%, 80.1 GB per GPU "
        "(21564 candidates, 44 re-timed, 0.78 s)\n"
        "paraplan plan: no data-parallel baseline fits memory: the model needs the split\n")
    plan = gen_pages.figure_tables().parse_plan_summary(printed)
    assert plan == {"plan": "TP 4, PP 8, DP 32, micro-batch 2, v 12, interleaved_1f1b, no recomputation, sequence "
                            "parallel, distributed optimizer", "s": "16.2", "tflops": "204", "mfu": "63.6%",
                    "gb": "80.1", "candidates": "21564", "retimed": "44", "baseline": "none fits memory"}
    long = gen_pages.figure_tables().parse_plan_summary(
        "paraplan plan: best: TP 2, CP 4 (p2p), PP 2, DP 4: 204 s per iteration, 647 TFLOP/s per GPU, MFU 12.5% "
        "(6 x parameters x tokens; 65.4% counting the attention FLOPs), 81.0 GB per GPU (37056 candidates, 23 "
        "re-timed, 0.98 s)\n"
        "paraplan plan: speedup over the fastest data-parallel baseline (dp_zero3, 8.66 s): 1.19x\n")
    assert long["mfu"] == "12.5% (6 x parameters x tokens; 65.4% counting the attention FLOPs)"
    assert long["baseline"] == "1.19x (dp_zero3, 8.66 s)"
    with pytest.raises(RuntimeError, match="no summary line"):
        gen_pages.figure_tables().parse_plan_summary("paraplan plan: best: TP 4\n")


def test_gen_pages_check_names_a_stale_table_and_writes_nothing(gen_pages, tmp_path, monkeypatch, capsys):
    stale = tmp_path / "calibrations.md"
    stale.write_text("an old copy\n")
    monkeypatch.setattr(gen_pages, "written_files", lambda: {stale: lambda: "what the command prints\n"})
    assert gen_pages.main(["--check"]) == 1
    assert stale.read_text() == "an old copy\n"
    assert capsys.readouterr().err == f"stale: {stale}: run `python docs/gen_pages.py`\n"
    assert gen_pages.main([]) == 0
    assert stale.read_text() == "what the command prints\n"
    assert gen_pages.main(["--check"]) == 0


def _key_patterns(table: str) -> list[re.Pattern[str]]:
    keys = re.findall(r"^\| `([^`]+)` \|", table, flags=re.M)
    return [re.compile(re.escape(k).replace(re.escape("<name>"), r"[^.\[]+") + r"$") for k in keys]


def _config_paths(value, path: str = ""):
    if isinstance(value, dict):
        for key, child in value.items():
            here = f"{path}.{key}" if path else str(key)
            yield here
            yield from _config_paths(child, here)
    elif isinstance(value, list):
        for child in value:
            if isinstance(child, dict):
                yield from _config_paths(child, f"{path}[]")


def test_every_key_of_the_shipped_configs_is_documented(repo_root, gen_pages):
    patterns = _key_patterns(gen_pages.config_key_table())
    config = yaml.safe_load((repo_root / "config" / "config.yaml").read_text())
    # a fit.logs entry and an analytic profile, as the schema's examples write them
    config["fit"] = {"logs": [{"name": "a100", "path": "x.txt", "format": "nccl-tests", "in_place": False,
                               "world_size": 8, "nodes": 1, "collective": "all_reduce"}]}
    config["profile"]["models"]["r50"] = {"model": "resnet", "profile_batch_sizes": [32],
                                          "settings": {"blocks": [3, 4, 6, 3]},
                                          "analytic": {"cluster": "dgx-a100", "combine": "roofline"}}
    missing = [p for p in _config_paths(config) if not any(pat.match(p) for pat in patterns)]
    assert missing == []


def test_config_key_rows_carry_type_default_and_meaning(gen_pages):
    table = gen_pages.config_key_table()
    assert "| `bench.iters` | integer | `20` | Timed iterations per size" in table
    assert "| `fit.logs[].format` | `nccl-tests` \\| `param` |  |" in table
    assert re.search(r"^\| `predict\.tables\.<name>\.calibration` \| string \|  \| .*\(required\) \|$", table,
                     flags=re.M)
    assert "| `profile.models.<name>.settings.hidden_size` |" in table  # the gpt model's settings
    assert "`plan.gbs`" not in table  # 0.1 spellings are left out


def _sections(page: str) -> dict[str, str]:
    parts = re.split(r"^## (\S+)$", page, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_the_cli_page_has_every_command_and_option(gen_pages):
    sections = _sections(gen_pages.cli_page())
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert list(sections) == list(sub.choices)
    for name, parser in sub.choices.items():
        visible = [o for a in parser._actions if a.help != argparse.SUPPRESS for o in a.option_strings
                   if o not in ("-h", "--help")]
        hidden = [o for a in parser._actions if a.help == argparse.SUPPRESS for o in a.option_strings]
        assert all(f"`{o}" in sections[name] for o in visible), name
        assert not any(f"`{o} " in sections[name] or f"`{o}`" in sections[name] for o in hidden), name
    assert "| `--global-batch-size GLOBAL_BATCH_SIZE` |" in sections["plan"]
    assert "(default: 67108864)" in sections["bench"]  # --max-bytes, as --help prints it


def test_the_readme_is_short_and_starts_with_install_run_and_test(repo_root):
    readme = (repo_root / "README.md").read_text()
    lines = readme.splitlines()
    assert len(lines) <= 160
    first_screen = "\n".join(lines[:50])
    for command in ('pip install -e ".[measure,test]"', "snakemake", "pytest"):
        assert command in first_screen, command
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", readme):
        assert (repo_root / target).exists(), target


def test_readme_links_only_committed_docs(repo_root, gen_pages):
    readme = (repo_root / "README.md").read_text()
    linked = {t.rsplit("/", 1)[-1] for t in re.findall(r"\]\(docs/([^)#]+)", readme)}
    assert not linked & set(gen_pages.PAGES), "generated pages exist only in the built site"
