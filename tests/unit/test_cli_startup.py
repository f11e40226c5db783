"""What `paraplan` imports and builds before a command runs (the start-up every command
pays; benchmarks/bench_cli_latency.py times it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from paraplan.cli.main import _command_asked, _commands, build_parser

SRC = Path(__file__).resolve().parents[2] / "src"
NOT_AT_START = ("torch", "matplotlib", "mlflow", "pandas", "scipy", "yaml", "urllib.request")


def _imported_after(code: str) -> set[str]:
    probe = f"import sys\n{code}\nprint(' '.join(sys.modules))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True)
    return set(out.stdout.split())


def test_help_imports_no_heavy_package():
    loaded = _imported_after("from paraplan.cli.main import main\ntry:\n    main(['--help'])\n"
                             "except SystemExit:\n    pass")
    assert "paraplan.cli.plan" in loaded  # every command is listed
    assert [name for name in NOT_AT_START if name in loaded] == []


def test_a_command_builds_only_its_own_options():
    # plan's options come from the layer-profile planner's request, which imports the
    # sweep (simulator, process pool): `paraplan track` never pays for it
    loaded = _imported_after("from paraplan.cli.main import build_parser\nbuild_parser(only='track')")
    assert "paraplan.plan.hybrid.request" not in loaded
    assert "paraplan.plan.hybrid.request" in _imported_after(
        "from paraplan.cli.main import build_parser\nbuild_parser(only='plan')")


@pytest.mark.parametrize("command", [module.NAME for module in _commands()])
def test_a_command_alone_has_the_options_and_help_of_the_full_parser(command):
    def help_of(parser) -> str:
        return parser._subparsers._group_actions[0].choices[command].format_help()

    assert help_of(build_parser(only=command)) == help_of(build_parser())


@pytest.mark.parametrize(("argv", "command"), [
    (["plan", "--model", "gpt3-175b"], "plan"), (["--help"], ""), ([], ""), (["--version"], ""),
    (["-h", "predict"], "predict"), (["nosuch", "-o", "x"], "nosuch"),
])
def test_the_command_asked_is_the_first_word_that_is_no_option(argv, command):
    assert _command_asked(argv) == command


def test_planning_and_predicting_import_no_scipy(tmp_path):
    """The planner and the predictor run on numpy alone (scipy.special's log_ndtr, the slowest
    GPU's expected lag, was a tenth of a second of every plan: `paraplan.predict.variability`)."""
    out = tmp_path / "p.csv"
    loaded = _imported_after(
        "from paraplan.cli.main import main\n"
        f"main(['plan', '--model', 'llama3-8b', '--cluster', 'dgx-h100', '--gpus', '16', '--global-batch-size', "
        f"'32', '--top-k', '1', '-o', {str(out)!r}, '--no-track'])")
    assert out.is_file() and "paraplan.plan.transformer.search" in loaded
    assert not [name for name in loaded if name == "scipy" or name.startswith("scipy.")]
