"""Sustained GEMM ceilings: the factor is the geometric mean of sustained / burst over a
device's rows, a bad row is a one-line error naming it, and `fit --kind kernels` scales
the burst fit's gemm_efficiency by the factor of the device it is told to use."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from paraplan.cli.main import main
from paraplan.core import InputFileError
from paraplan.kernels.sustained import SUSTAINED_COLUMNS, read_sustained_csvs, sustained_factor

ROOT = Path(__file__).resolve().parents[2]
SUSTAINED = ROOT / "data" / "published" / "gemm" / "mamf_msmf_sustained.csv"
HEADER = ",".join(SUSTAINED_COLUMNS)


def _row(device="X", dtype="bfloat16", burst="800", sustained="700", limit="700", setup="s") -> str:
    cells = {c: "" for c in SUSTAINED_COLUMNS}
    cells.update(kind="gemm_sustained", device=device, dtype=dtype, setup=setup, runs="1", burst_tflops=burst,
                 sustained_tflops=sustained, power_limit_w=limit, source="test")
    return ",".join(cells[c] for c in SUSTAINED_COLUMNS)


def _write(tmp_path: Path, *rows: str) -> Path:
    path = tmp_path / "sustained.csv"
    path.write_text("\n".join([HEADER, *rows]) + "\n")
    return path


def test_factor_is_the_geometric_mean_of_the_device_rows(tmp_path):
    rows = read_sustained_csvs([_write(tmp_path, _row(burst="800", sustained="700"), _row(burst="900", sustained="720"),
                                       _row(device="Y", burst="1000", sustained="500"))])
    found = sustained_factor(rows, "X", "bfloat16")
    assert found is not None and found.factor == pytest.approx(math.sqrt(700 / 800 * 720 / 900), rel=1e-12)
    assert len(found.rows) == 2
    assert sustained_factor(rows, "X", "float8_e4m3fn") is None
    assert sustained_factor(rows, "Z", "bfloat16") is None


def test_published_h200_rows_give_the_msmf_over_mamf_of_the_mamf_finder_tables():
    rows = read_sustained_csvs([SUSTAINED])
    bf16 = sustained_factor(rows, "H200-SXM-141GB", "bfloat16")
    fp8 = sustained_factor(rows, "H200-SXM-141GB", "float8_e4m3fn")
    assert bf16 is not None and fp8 is not None
    assert [r.ratio for r in bf16.rows] == pytest.approx([708.5 / 841.9, 702.9 / 828.0, 701.3 / 825.8, 698.6 / 823.9])
    assert 0.84 < bf16.factor < 0.85
    assert fp8.factor == pytest.approx(1288.7 / 1491.9)
    assert {r.power_limit_w for r in (*bf16.rows, *fp8.rows)} == {700.0}


def test_bad_rows_are_errors_naming_the_line(tmp_path):
    above = (r"sustained\.csv:2: column 'sustained_tflops': sustained_tflops 900 above burst_tflops 800; "
             r"expected a sustained rate no higher than the burst of the same run")
    with pytest.raises(InputFileError, match=above):
        read_sustained_csvs([_write(tmp_path, _row(burst="800", sustained="900"))])
    with pytest.raises(InputFileError, match=r"sustained\.csv:3: column 'power_limit_w': expected a number, got ''"):
        read_sustained_csvs([_write(tmp_path, _row(), _row(limit=""))])
    with pytest.raises(InputFileError, match=r"sustained\.csv:2: column 'kind': expected 'gemm_sustained', got 'gemm'"):
        read_sustained_csvs([_write(tmp_path, _row().replace("gemm_sustained", "gemm", 1))])
    rows = read_sustained_csvs([_write(tmp_path, _row(limit="700"), _row(limit="600"))])
    with pytest.raises(InputFileError, match=r"rows of X \(bfloat16\) at power limits 600 W, 700 W; expected one"):
        sustained_factor(rows, "X", "bfloat16")


def test_fit_scales_the_burst_ceiling_by_the_named_device_factor(tmp_path, capsys):
    xla = ROOT / "data" / "published" / "gemm" / "xla_h100_sm90_bf16.csv"
    sustained = _write(tmp_path, _row(device="H200-SXM-141GB", burst="800", sustained="680"))
    out = tmp_path / "h100.json"
    assert main(["fit", "--kind", "kernels", "--no-track", str(xla), str(sustained), "--cluster", "dgx-h100",
                 "--sustained-from", "H200-SXM-141GB", "-o", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["gemm"]["sustained"]["factor"] == pytest.approx(0.85, rel=1e-12)
    assert doc["efficiency"]["gemm_efficiency"] == pytest.approx(doc["gemm"]["params"]["gemm_efficiency"] * 0.85,
                                                                 rel=1e-12)
    # the device's own rows by default: the H100 has none, so the burst fit stands
    plain = tmp_path / "plain.json"
    assert main(["fit", "--kind", "kernels", "--no-track", str(xla), str(sustained), "--cluster", "dgx-h100",
                 "-o", str(plain)]) == 0
    doc = json.loads(plain.read_text())
    assert "sustained" not in doc["gemm"]
    assert doc["efficiency"]["gemm_efficiency"] == doc["gemm"]["params"]["gemm_efficiency"]
    capsys.readouterr()
    assert main(["fit", "--kind", "kernels", "--no-track", str(xla), str(sustained), "--cluster", "dgx-h100",
                 "--sustained-from", "B200-SXM", "-o", str(tmp_path / "x.json")]) != 0
    assert ("option --sustained-from: no sustained-GEMM rows of 'B200-SXM' in the inputs "
            "(devices: H200-SXM-141GB)") in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_fit_holds_the_attention_ceilings_at_the_same_factor(tmp_path, capsys):
    """A fused attention pass is tensor-core bound like a GEMM: its two efficiencies are
    the burst fit's times the device's BF16 factor (the FP16 rows of the published figures
    run at the same tensor-core rate), its seq_half (a shape) and its burst fit stay."""
    from paraplan.kernels.ceilings import KernelCeilings

    xla = ROOT / "data" / "published" / "gemm" / "xla_h100_sm90_bf16.csv"
    flash2 = ROOT / "data" / "published" / "attention" / "flash2_fwd_bwd.csv"
    sustained = _write(tmp_path, _row(device="H200-SXM-141GB", burst="800", sustained="680"))
    out = tmp_path / "h100.json"
    args = ["--cluster", "dgx-h100", "--attention-kernel", "flash-attention-2"]
    assert main(["fit", "--kind", "kernels", "--no-track", str(xla), str(flash2), str(sustained), *args,
                 "--sustained-from", "H200-SXM-141GB", "-o", str(out)]) == 0
    assert ("H100-SXM5-80GB bfloat16 attention (float16 rows) ceilings sustained at 0.8500 of the burst fit"
            in capsys.readouterr().err)
    doc = json.loads(out.read_text())
    burst, held = doc["attention"]["params"], doc["attention"]["efficiency"]
    assert held["attention_fwd_efficiency"] == pytest.approx(burst["attention_fwd_efficiency"] * 0.85, rel=1e-12)
    assert held["attention_bwd_efficiency"] == pytest.approx(burst["attention_bwd_efficiency"] * 0.85, rel=1e-12)
    assert held["attention_seq_half"] == burst["attention_seq_half"]
    assert {k: doc["efficiency"][k] for k in held} == held
    assert doc["attention"]["sustained"]["factor"] == pytest.approx(0.85, rel=1e-12)
    assert "tensor-core bound" in doc["attention"]["sustained"]["why"]
    # a file whose first kernel's held values disagree with `efficiency` is refused
    doc["attention"]["efficiency"]["attention_fwd_efficiency"] = burst["attention_fwd_efficiency"]
    with pytest.raises(InputFileError, match=r"attention\.efficiency\.attention_fwd_efficiency: expected "
                                             r"efficiency\.attention_fwd_efficiency's"):
        KernelCeilings.from_dict(doc, str(out))
    # without sustained rows the burst fit prices attention, as before
    plain = tmp_path / "plain.json"
    assert main(["fit", "--kind", "kernels", "--no-track", str(xla), str(flash2), *args, "-o", str(plain)]) == 0
    doc = json.loads(plain.read_text())
    assert "efficiency" not in doc["attention"] and "sustained" not in doc["attention"]
    assert doc["efficiency"]["attention_fwd_efficiency"] == doc["attention"]["params"]["attention_fwd_efficiency"]
