"""A progress line on a terminal and none in a log (commands run as subprocesses)."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios


def _stderr_of(args: list[str], cwd, terminal: bool) -> str:
    env = {**os.environ, "COLUMNS": "120"}
    if not terminal:
        out = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        return out.stderr
    controller, worker = pty.openpty()
    # a terminal 120 columns wide (a fresh pty has no size)
    fcntl.ioctl(worker, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    proc = subprocess.Popen(args, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=worker)
    os.close(worker)
    chunks = []
    while True:
        try:
            data = os.read(controller, 4096)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    assert proc.wait(timeout=300) == 0
    os.close(controller)
    return b"".join(chunks).decode(errors="replace")


def test_progress_line_on_a_terminal_only(tmp_path):
    args = [sys.executable, "-m", "paraplan", "simulate", "--study", "distir_fig4", "-o", "sim",
            "--repeats", "1", "--no-plots", "--no-track"]
    on_terminal = _stderr_of(args, tmp_path, terminal=True)
    assert "simulate distir_fig4" in on_terminal and "config/s" in on_terminal
    assert "/222 [" in on_terminal  # the grid's configurations, both modes
    in_a_log = _stderr_of(args, tmp_path, terminal=False)
    assert "/222 [" not in in_a_log and "distir_fig4: 222 configurations" in in_a_log
