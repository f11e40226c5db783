"""`paraplan report` tells a stage's result by its path; a CSV or JSON that is none is
named in a note, and a call where none is a result is an error (it wrote an empty
summary and said only 'wrote s.md')."""

import json

from paraplan.cli.main import main


def test_only_unknown_files_is_an_error(tmp_path, capsys):
    runs = tmp_path / "runs.csv"
    runs.write_text("name,model\na,llama3-8b\n")
    out = tmp_path / "s.md"
    assert main(["report", str(runs), "-o", str(out), "--no-track"]) == 2
    assert capsys.readouterr().err == (
        f"paraplan report: error: {runs}: no stage's result by its path; expected files where the workflow writes "
        "them, e.g. results/fits/<cluster>/comm_model.json, results/plans/*.csv, "
        "results/predict/<table>/predicted.csv\n")
    assert not out.exists()


def test_an_unknown_table_beside_results_is_named(tmp_path, capsys):
    fits = tmp_path / "results/fits/local-cpu"
    fits.mkdir(parents=True)
    (fits / "comm_model.json").write_text(json.dumps({"schema_version": 1, "fits": []}))
    runs = tmp_path / "runs.csv"
    runs.write_text("name,model\na,llama3-8b\n")
    figure = tmp_path / "results/figures/x.png"
    figure.parent.mkdir(parents=True)
    figure.write_bytes(b"")
    out = tmp_path / "s.md"
    assert main(["report", str(fits / "comm_model.json"), str(runs), str(figure), "-o", str(out), "--no-track"]) == 0
    assert capsys.readouterr().err == (
        f"paraplan report: note: 1 file(s) are no stage's result by their path, left out: {runs}\n"
        f"paraplan report: wrote {out} from 1 result file(s)\n")
