"""The wheel carries the default clusters and studies and runs from outside the checkout."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path


def test_wheel_runs_outside_the_checkout(repo_root, tmp_path):
    """Build the wheel, install it in a fresh venv that borrows this environment's
    packages (nothing is downloaded), and simulate a packaged study by name from
    an empty folder with the installed `paraplan` command."""
    # without this checkout on PYTHONPATH: pip would take it for an installed paraplan and skip the wheel
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MLFLOW_TRACKING_URI")}
    env["PYTHONNOUSERSITE"] = "1"
    wheels = tmp_path / "wheels"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels),
         str(repo_root)], capture_output=True, text=True, timeout=300, env=env)
    assert build.returncode == 0, build.stderr[-3000:]
    wheel = next(wheels.glob("paraplan-*.whl"))
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q",
         str(wheel)], capture_output=True, text=True, timeout=300, env=env)
    assert install.returncode == 0, install.stderr[-3000:]
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               capture_output=True, text=True, check=True).stdout.strip())
    # numpy, pandas, ... from this environment, after the venv's own site-packages (a
    # plain path line: this environment's editable paraplan stays invisible)
    (site / "borrowed.pth").write_text(sysconfig.get_path("purelib") + "\n")
    outside = tmp_path / "elsewhere"
    outside.mkdir()

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(list(args), cwd=outside, env=env, capture_output=True, text=True, timeout=300)

    where = run(str(python), "-c", "import paraplan; print(paraplan.__file__)")
    assert Path(where.stdout.strip()).is_relative_to(site), where.stdout + where.stderr
    out = run(str(env_dir / "bin" / "paraplan"), "simulate", "--study", "schedules", "-o", "sim",
              "--no-track")
    assert out.returncode == 0, out.stderr[-3000:]
    rows = (outside / "sim" / "results.csv").read_text().splitlines()
    assert rows[0].startswith("experiment,mode,series") and len(rows) == 1 + 18
    cluster = run(str(python), "-m", "paraplan", "plan", "--help")
    assert cluster.returncode == 0 and "usage: paraplan plan" in cluster.stdout
    found = run(str(python), "-c", "from paraplan.clusters import cluster_path, load_cluster; "
                "print(cluster_path('dgx-a100'), load_cluster('dgx-a100').num_devices)")
    path, devices = found.stdout.split()
    assert Path(path).is_relative_to(site) and "_config" in path and int(devices) > 1
