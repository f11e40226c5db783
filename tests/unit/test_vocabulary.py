"""One vocabulary: the glossary's terms are the documentation's vocabulary table, the input
files and the options use its names, and the generated schemas equal what the dataclasses say."""

from __future__ import annotations

import re

import pytest

from paraplan.core.glossary import TERMS, TERMS_BY_NAME, overlap_flag_as_gradient_sync
from script_module import load_script


def _vocabulary_section(repo_root) -> str:
    """docs/vocabulary.md as `mkdocs build` writes it (docs/gen_pages.py)."""
    text: str = load_script(repo_root / "docs" / "gen_pages.py").vocabulary_page()
    return text[text.index("# Vocabulary"):]


def test_every_term_is_in_the_vocabulary_table_with_its_old_names(repo_root):
    section = _vocabulary_section(repo_root)
    rows = [line for line in section.splitlines() if line.startswith("| ")]
    for term in TERMS:
        row = next((r for r in rows if f"`{term.name}`" in r), None)
        assert row is not None, term.name
        for old in (*term.old_names, *term.old_options):
            assert f"`{old}`" in row, (term.name, old)


def test_terms_have_one_name_each():
    names = [t.name for t in TERMS]
    assert len(names) == len(set(names))
    # an old name never shadows a current one
    assert not {old for t in TERMS for old in t.old_names} & set(names) - {"batch", "gbs"}


def test_old_overlap_flag_becomes_a_gradient_sync():
    assert overlap_flag_as_gradient_sync(True) == "overlap"
    assert overlap_flag_as_gradient_sync(False) == "end"
    assert "overlap_grad_allreduce" in TERMS_BY_NAME["gradient_sync"].convert


def test_workflow_schemas_are_written_from_the_dataclasses(repo_root):
    from paraplan.input_schemas import rendered

    for name, text in rendered().items():
        assert (repo_root / "workflow/schemas" / name).read_text() == text, (
            f"workflow/schemas/{name} is stale: run `python -m paraplan.input_schemas`")


@pytest.mark.parametrize("path", ["config/config.yaml", "workflow/schemas/config.schema.yaml"])
def test_shipped_config_uses_no_0_1_key(repo_root, path):
    text = (repo_root / path).read_text()
    keys = set(re.findall(r"^\s*([a-z_]+):", text, flags=re.M))
    old = {o for t in TERMS for o in t.old_names} - {t.name for t in TERMS}
    assert not keys & old
