"""The `profile` rules run end to end in a copy of the workflow with a tiny config."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

_COPY = ("Snakefile", "workflow", "config", "profiles", "environment.yml")


def test_profile_all_builds_every_configured_profile(repo_root, tmp_path):
    for name in _COPY:
        source = repo_root / name
        if source.is_dir():
            shutil.copytree(source, tmp_path / name)
        else:
            shutil.copy(source, tmp_path / name)
    tiny = {"profile": {"threads": 1, "repeats": 1, "warmup": 0, "models": {
        "tiny-mlp": {"model": "mlp", "profile_batch_sizes": [2, 4],
                     "settings": {"num_layers": 2, "input_dim": 8, "hidden_dim": 16, "output_dim": 4}},
        "tiny-cnn": {"model": "resnet", "profile_batch_sizes": [2], "settings": {"blocks": [1], "width": 4,
                                                                   "image_size": 16, "num_classes": 3},
                     "analytic": {"cluster": "dgx-a100"}},
    }}}
    # replace the profile section (--configfile would merge the default models in)
    config_path = tmp_path / "config" / "config.yaml"
    config = yaml.safe_load(config_path.read_text())
    config.update(tiny)
    config["validate"] = {"models": {}}  # validate.models must name profiles of this config
    config_path.write_text(yaml.safe_dump(config))
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    snakemake = shutil.which("snakemake") or str(Path(sys.executable).parent / "snakemake")
    out = subprocess.run([snakemake, "profile_all", "-c1"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    mlp_meta = json.loads((tmp_path / "results/profiles/tiny-mlp.meta.json").read_text())
    assert mlp_meta["model"] == "mlp" and mlp_meta["threads"] == 1 and mlp_meta["batch_size"] == 4
    cnn_meta = json.loads((tmp_path / "results/profiles/tiny-cnn.meta.json").read_text())
    assert cnn_meta["method"] == "analytic-roofline" and cnn_meta["device"] == "A100-SXM4-80GB"
    for name in ("tiny-mlp", "tiny-cnn"):
        assert (tmp_path / f"results/figures/profile/{name}.png").is_file()
        assert (tmp_path / f"results/logs/profile/{name}.log").is_file()
