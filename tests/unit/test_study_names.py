"""`--study NAME` with a name that is no study lists the studies there are, as an unknown
cluster does (it said only that config/studies/<stage>/NAME.yaml was not found)."""

import pytest

from paraplan.cli.main import main


@pytest.mark.parametrize(("command", "name", "message"), [
    ("plan", "dapple_resnet", "paraplan plan: error: option --study: no plan study named 'dapple_resnet' "
     "({root}/config/studies/plan/dapple_resnet.yaml); known: dapple_resnet50\n"),
    ("simulate", "schedule", "paraplan simulate: error: option --study: no simulate study named 'schedule' "
     "({root}/config/studies/simulate/schedule.yaml); known: distir_fig3, distir_fig4, schedules\n"),
])
def test_a_misspelt_study_lists_the_known_ones(command, name, message, tmp_path, capsys, repo_root, monkeypatch):
    monkeypatch.chdir(tmp_path)  # outside a checkout: the name is looked for in the package's own
    assert main([command, "--study", name, "-o", str(tmp_path / "out"), "--no-track"]) == 2
    assert capsys.readouterr().err == message.format(root=repo_root)
    assert not (tmp_path / "out").exists()


def test_a_study_path_that_is_no_file_is_the_readers_error(tmp_path, capsys):
    assert main(["simulate", "--study", str(tmp_path / "mine.yaml"), "-o", str(tmp_path / "out"), "--no-track"]) == 2
    assert capsys.readouterr().err == (f"paraplan simulate: error: {tmp_path / 'mine.yaml'}: file not found; expected "
                                       "a simulation study (config/studies/simulate/*.yaml)\n")
