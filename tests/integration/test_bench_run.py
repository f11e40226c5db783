"""Real gloo benchmarks through `paraplan bench` (spawns ranks: slow)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from paraplan.cli.main import main
from paraplan.comm.bench_rank import FAULT_ENV
from paraplan.comm.results import A2AV_COLUMNS, COLUMNS, EXTRA_COLUMNS
from paraplan.core import busbw_factor

SWEEP = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce")


def _children() -> list[int]:
    """Live (non-zombie) processes whose parent is this test process."""
    mine = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[1]) == os.getpid():
            mine.append(int(stat.parent.name))
    return mine


@pytest.fixture(scope="module")
def two_rank_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    rc = main([
        "bench", "--backend", "gloo", "--world-size", "2",
        "--collectives", ",".join((*SWEEP, "all_to_allv")),
        "--min-bytes", "8", "--max-bytes", "2048", "--factor", "4",
        "--warmup", "1", "--iters", "3", "--a2a-samples", "3", "--seed", "5",
        "-o", str(out), "--figures", str(out / "fig"), "--no-track",
    ])
    return rc, out


def test_every_collective_writes_a_csv_and_a_figure(two_rank_run):
    rc, out = two_rank_run
    assert rc == 0
    for collective in (*SWEEP, "all_to_allv"):
        assert (out / f"{collective}_n2.csv").is_file()
        for suffix in (".png", ".pdf"):
            assert (out / "fig" / f"{collective}_n2{suffix}").stat().st_size > 1000
    assert not _children()


@pytest.mark.parametrize("collective", SWEEP)
def test_sweep_csv_invariants(two_rank_run, collective):
    _, out = two_rank_run
    frame = pd.read_csv(out / f"{collective}_n2.csv")
    assert tuple(frame.columns) == COLUMNS + EXTRA_COLUMNS
    assert frame["size_bytes"].tolist() == [8, 32, 128, 512, 2048]
    assert (frame["collective"] == collective).all() and (frame["world_size"] == 2).all()
    assert (frame["backend"] == "gloo").all() and (frame["dtype"] == "float32").all()
    shared = collective in ("all_gather", "reduce_scatter", "all_to_all")
    assert (frame["count"] == frame["size_bytes"] // 4 // (2 if shared else 1)).all()
    assert (frame["time_p10_us"] <= frame["time_us"]).all()
    assert (frame["time_us"] <= frame["time_p90_us"]).all()
    np.testing.assert_allclose(frame["algbw_GBps"], frame["size_bytes"] / frame["time_us"] / 1e3, rtol=1e-9)
    np.testing.assert_allclose(
        frame["busbw_GBps"], frame["algbw_GBps"] * busbw_factor(collective, 2), rtol=1e-12
    )
    # a gloo call on one machine takes more than a microsecond and less than a second
    assert frame["time_us"].between(1, 1e6).all()


def test_all_to_allv_rows_record_the_exchange(two_rank_run):
    _, out = two_rank_run
    frame = pd.read_csv(out / "all_to_allv_n2.csv")
    assert tuple(frame.columns) == COLUMNS + EXTRA_COLUMNS + A2AV_COLUMNS
    assert frame["sample"].tolist() == [0, 1, 2]
    for row in frame.itertuples():
        tables = [int(t) for t in row.tables_per_rank.split("-")]
        assert len(tables) == 2
        assert row.size_bytes == row.global_batch // 2 * 2 * max(tables) * row.dim * 4
        assert row.count == row.size_bytes // 4
    np.testing.assert_allclose(frame["busbw_GBps"], frame["algbw_GBps"] * 0.5, rtol=1e-12)


def test_a_crashing_rank_is_named_and_nothing_is_left(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(FAULT_ENV, "1:all_gather:crash")
    rc = main([
        "bench", "--world-size", "2", "--collectives", "all_reduce,all_gather",
        "--max-bytes", "64", "--warmup", "1", "--iters", "2", "--timeout", "60",
        "-o", str(tmp_path), "--no-track",
    ])
    err = capsys.readouterr().err
    assert rc == 2
    assert "error: rank 1 exited with code 3 in all_gather" in err
    assert "Traceback" not in err.split("paraplan bench: error:")[1]
    assert not list(tmp_path.glob("*.csv"))  # all_reduce finished, but nothing is half-kept
    assert not _children()


def test_a_hanging_rank_ends_the_job_within_the_timeout(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(FAULT_ENV, "1:all_reduce:hang")
    rc = main([
        "bench", "--world-size", "2", "--collectives", "all_reduce",
        "--max-bytes", "64", "--warmup", "1", "--iters", "2", "--timeout", "5",
        "-o", str(tmp_path), "--no-track",
    ])
    err = capsys.readouterr().err
    assert rc == 2
    assert "error: rank 1 hung in all_reduce: no progress from any rank for 5 s" in err
    assert not list(tmp_path.glob("*.csv"))
    assert not _children()


def test_nccl_without_cuda_and_unknown_backends_are_clear_errors(tmp_path, capsys):
    import torch

    if not torch.cuda.is_available():
        assert main(["bench", "--backend", "nccl", "-o", str(tmp_path), "--no-track"]) == 2
        assert "nccl needs CUDA" in capsys.readouterr().err
    assert main(["bench", "--backend", "mpi", "-o", str(tmp_path), "--no-track"]) == 2
    assert "unknown backend 'mpi'; expected one of gloo, nccl" in capsys.readouterr().err
    assert main(["bench", "--collectives", "all_reduce,allreduce", "-o", str(tmp_path), "--no-track"]) == 2
    assert "unknown value 'allreduce'" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def _marked_processes(mark: str) -> list[int]:
    """Processes of this user whose environment carries `mark`."""
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if mark.encode() in environ.read_bytes():
                found.append(int(environ.parent.name))
        except OSError:
            continue
    return found


def test_ctrl_c_stops_every_rank_and_writes_nothing(tmp_path):
    """SIGINT to the command (SIGTERM takes the same path)."""
    mark = f"paraplan-test-{uuid.uuid4().hex}"
    env = {**os.environ, FAULT_ENV: "1:all_reduce:hang", "PARAPLAN_TEST_MARK": mark}
    proc = subprocess.Popen(
        [sys.executable, "-m", "paraplan.cli.main", "bench", "--world-size", "2",
         "--collectives", "all_reduce", "--max-bytes", "64", "--timeout", "120",
         "-o", str(tmp_path), "--no-track"],
        stderr=subprocess.PIPE, text=True, env=env,
    )
    for line in proc.stderr:  # wait until the ranks are measuring (rank 1 is hanging)
        if line.startswith("# paraplan bench: all_reduce"):
            break
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    rest = proc.communicate(timeout=30)[1]
    assert proc.returncode == 130
    assert "interrupted; no partial output was kept" in rest
    assert not list(tmp_path.iterdir())
    assert _marked_processes(mark) == []


def _listening_addresses(pid: int) -> list[str]:
    """IP addresses of the TCP sockets process `pid` listens on (/proc/net/tcp, tcp6)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    found = []
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        for entry in Path(table).read_text().splitlines()[1:]:
            fields = entry.split()
            if fields[3] == "0A" and fields[9] in inodes:  # state LISTEN
                raw = bytes.fromhex(fields[1].split(":")[0])
                raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))  # little-endian words
                found.append(socket.inet_ntop(family, raw))
    return found


def test_ranks_listen_on_loopback_only_and_die_with_a_killed_controller(tmp_path):
    """The rendezvous store and gloo's sockets listen on 127.0.0.1, not every interface;
    SIGKILL to the controller (no chance to clean up) still leaves no rank behind."""
    mark = f"paraplan-test-{uuid.uuid4().hex}"
    env = {**os.environ, FAULT_ENV: "1:all_reduce:hang", "PARAPLAN_TEST_MARK": mark}
    proc = subprocess.Popen(
        [sys.executable, "-m", "paraplan.cli.main", "bench", "--world-size", "2",
         "--collectives", "all_reduce", "--max-bytes", "64", "--timeout-s", "120",
         "-o", str(tmp_path), "--no-track"],
        stderr=subprocess.PIPE, text=True, env=env,
    )
    try:
        for line in proc.stderr:  # the process group is formed: the ranks are measuring
            if line.startswith("# paraplan bench: all_reduce"):
                break
        ranks = [pid for pid in _marked_processes(mark) if pid != proc.pid]
        assert len(ranks) == 2
        addresses = [address for pid in ranks for address in _listening_addresses(pid)]
        assert addresses and set(addresses) == {"127.0.0.1"}, addresses
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 5
        while _marked_processes(mark) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _marked_processes(mark) == []
        assert not list(tmp_path.iterdir())
    finally:  # whatever failed above, leave no process of this test behind
        proc.kill()
        proc.wait()
        for pid in _marked_processes(mark):
            os.kill(pid, signal.SIGKILL)
