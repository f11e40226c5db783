"""A benchmark rank never outlives its controller (`bench_rank.die_with_parent`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_rank_dies_when_its_controller_is_killed():
    """A stand-in controller starts a stand-in rank that arms die_with_parent; SIGKILL
    to the controller (no cleanup runs) ends the rank within a second."""
    rank = textwrap.dedent("""
        import os, sys, time
        from paraplan.comm.bench_rank import die_with_parent
        print(die_with_parent(os.getppid()), flush=True)
        time.sleep(60)
    """)
    controller = textwrap.dedent(f"""
        import subprocess, sys, time
        rank = subprocess.Popen([sys.executable, "-c", {rank!r}], start_new_session=True)
        print(rank.pid, flush=True)
        time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", controller], stdout=subprocess.PIPE, text=True)
    rank_pid = int(proc.stdout.readline())
    try:
        time.sleep(0.5)  # let the rank arm its death signal
        assert _alive(rank_pid)
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 5
        while _alive(rank_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(rank_pid)
    finally:
        proc.kill()
        if _alive(rank_pid):
            os.kill(rank_pid, signal.SIGKILL)


def test_a_rank_whose_controller_is_already_gone_exits_at_once():
    code = "from paraplan.comm.bench_rank import die_with_parent; die_with_parent(1); print('still here')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and out.stdout == ""
