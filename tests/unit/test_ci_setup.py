"""CI sets up as the README's quickstart says: the same commands, in the same order, with
`pip install torch==2.13.0` before the install line as the only addition (the CI machine
keeps that CPU build on disk), and the README's full test command. The install line works
without PyTorch's own package index."""

from __future__ import annotations

import re

TORCH_PIN = "pip install torch==2.13.0"


def code_blocks(markdown: str) -> list[list[str]]:
    """The lines of each fenced shell code block (fences may be indented in list items)."""
    blocks: list[list[str]] = []
    inside, shell, lines = False, False, []
    for line in markdown.splitlines():
        fence = line.strip()
        if not inside and fence.startswith("```"):
            inside, shell, lines = True, fence[3:] in ("", "bash", "sh"), []
        elif inside and fence == "```":
            inside = False
            if shell:
                blocks.append(lines)
        elif inside:
            lines.append(line)
    return blocks


def _commands(lines: list[str]) -> list[str]:
    """Simple commands, one per `&&` part, without comments and blank lines."""
    out = []
    for line in lines:
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        out.extend(part.strip() for part in line.split("&&"))
    return out


def _section(readme: str, title: str) -> str:
    text = "\n" + readme
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else len(text)]


def _is_setup(command: str) -> bool:
    return " -m venv " in command or command.endswith("/bin/activate") or command.startswith("pip install")


def quickstart(readme: str) -> list[str]:
    """The commands of the first code block of the README's Quickstart section."""
    blocks = code_blocks(_section(readme, "Quickstart"))
    assert blocks, "the README's Quickstart has no code block"
    return _commands(blocks[0])


def ci_commands(script: str) -> list[str]:
    return _commands(script.splitlines())


def readme_commands(readme: str) -> set[str]:
    """Every command of every code block of the README (e.g. the SLURM section's install)."""
    return {c for block in code_blocks(readme) for c in _commands(block)}


def check_ci_follows_readme(readme: str, script: str) -> list[str]:
    """What differs between the README's set-up and CI's, one problem a line."""
    problems = []
    readme_setup = [c for c in quickstart(readme) if _is_setup(c)]
    ci_setup = [c for c in ci_commands(script) if _is_setup(c)]
    if ci_setup.count(TORCH_PIN) != 1:
        problems.append(f"CI must run '{TORCH_PIN}' exactly once")
    else:
        first_install = next((c for c in ci_setup if c.startswith("pip install") and c != TORCH_PIN), None)
        if first_install is None or ci_setup.index(TORCH_PIN) + 1 != ci_setup.index(first_install):
            problems.append(f"'{TORCH_PIN}' must come right before the README's install line")
    ci_own = [c for c in ci_setup if c != TORCH_PIN]
    if ci_own[:len(readme_setup)] != readme_setup:
        problems.append(f"CI's set-up {ci_own} does not start with the README's {readme_setup}")
    anywhere = readme_commands(readme)
    problems += [f"CI runs '{c}', which no README code block says" for c in ci_own[len(readme_setup):]
                 if c not in anywhere]
    tests = [c for c in quickstart(readme) if c.startswith(("pytest", "mypy"))]
    full = [c for c in tests if c != "pytest"]  # plain `pytest` is the unit tests, inside `pytest tests`
    ci = ci_commands(script)
    if [c for c in ci if c in full] != full:
        problems.append(f"CI does not run the README's test commands {full}")
    return problems


def test_ci_runs_the_readmes_setup_and_tests(repo_root):
    readme = (repo_root / "README.md").read_text()
    script = (repo_root / ".ci" / "run").read_text()
    assert check_ci_follows_readme(readme, script) == []
    assert quickstart(readme)[:3] == ["python3.11 -m venv .venv", ". .venv/bin/activate",
                                      'pip install -e ".[measure,test]"']


def test_readme_install_needs_no_extra_package_index(repo_root):
    for command in quickstart((repo_root / "README.md").read_text()):
        assert not re.search(r"--(extra-)?index-url|download\.pytorch\.org|(^|\s)-[fi](\s|$)", command), command


def test_a_drifted_ci_script_is_caught():
    readme = ("## Quickstart\n\n```bash\npython3.11 -m venv .venv && . .venv/bin/activate\n"
              'pip install -e ".[measure,test]"\nsnakemake\npytest tests && mypy\n```\n\n'
              "## SLURM\n\n```bash\npip install snakemake-executor-plugin-slurm\n```\n")
    good = ("python3.11 -m venv .venv\n. .venv/bin/activate\npip install torch==2.13.0\n"
            'pip install -e ".[measure,test]"\npip install snakemake-executor-plugin-slurm\npytest tests\nmypy\n')
    assert check_ci_follows_readme(readme, good) == []
    assert check_ci_follows_readme(readme, good.replace("[measure,test]", "[measure]")) != []
    assert check_ci_follows_readme(readme, good.replace("pip install torch==2.13.0\n", "")) == [
        f"CI must run '{TORCH_PIN}' exactly once"]
    assert check_ci_follows_readme(readme, good.replace("python3.11", "python3")) != []
    assert check_ci_follows_readme(readme, good + "pip install numpy==1.0\n") == [
        "CI runs 'pip install numpy==1.0', which no README code block says"]
    assert check_ci_follows_readme(readme, good.replace("mypy\n", "")) == [
        "CI does not run the README's test commands ['pytest tests', 'mypy']"]
