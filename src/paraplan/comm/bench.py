"""The collective benchmark harness: launch the ranks, watch them, collect timings.

`run_bench(job)` starts `world_size` processes of `paraplan.comm.bench_rank` (each
in its own session, so the whole group can be killed), and streams their events
back. It returns one `SizeTiming` per (collective, size or sample) with the
per-iteration times of the slowest rank.

The ranks run on this machine, so nothing of theirs listens beyond it: the
rendezvous store is a socket this process binds to 127.0.0.1 (port chosen by the
OS, no race for a "free" port) and hands to rank 0, and gloo's and NCCL's own
sockets are put on the loopback interface (`GLOO_SOCKET_IFNAME` /
`NCCL_SOCKET_IFNAME=lo` unless already set). Each rank dies with this process
(Linux parent-death signal, see `bench_rank`), so killing the controller, even with
SIGKILL, leaves no rank behind.

Failure handling (the promise of `paraplan bench --timeout`):
- a rank that raises or exits ends the job at once; the `BenchError` names the
  rank, the collective and the size it was running, and the rank's last words;
- no event from any rank for `timeout_s` seconds ends the job as hung, naming the
  rank(s) that fell behind (all running ranks when they are stuck together);
- in every case, and on Ctrl-C or SIGTERM, all rank processes are terminated
  (SIGTERM to their session, SIGKILL after a grace period) and reaped before
  this function returns or raises.
The torch process group's own timeout is set later than `timeout_s`, as a
backstop for ranks whose parent died.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from paraplan.comm.a2av import A2AV_DTYPE, A2AVSample
from paraplan.comm.bench_rank import EVENT_PREFIX
from paraplan.comm.sizes import element_count
from paraplan.core import ConfigError, ParaplanError

BACKENDS: tuple[str, ...] = ("gloo", "nccl")
_KILL_GRACE_S = 3.0
_PG_TIMEOUT_MARGIN_S = 60.0
_STDERR_TAIL_LINES = 15
_STARTUP_STAGES = ("starting Python", "importing torch", "forming the process group", "ready")


class BenchError(ParaplanError):
    """A rank crashed, failed or hung; the message names rank, collective and size."""


@dataclass(frozen=True)
class BenchJob:
    """One launch of `world_size` ranks measuring `collectives` over `sizes_bytes`
    (and, for `all_to_allv`, over `a2av_samples`)."""

    backend: str
    world_size: int
    collectives: tuple[str, ...]
    sizes_bytes: tuple[int, ...]
    dtype: str = "float32"
    warmup: int = 5
    iters: int = 20
    timeout_s: float = 300.0
    a2av_samples: tuple[A2AVSample, ...] = ()

    def points(self, collective: str) -> list[int]:
        """The sizes (bytes) measured for `collective`, in order."""
        if collective == "all_to_allv":
            return [s.size_bytes for s in self.a2av_samples]
        return list(self.sizes_bytes)


@dataclass(frozen=True)
class SizeTiming:
    """Per-iteration times (s, slowest rank each) of one collective at one size;
    `index` is the position in the sweep (the sample number for all_to_allv)."""

    collective: str
    index: int
    size_bytes: int
    times_s: tuple[float, ...]


@dataclass(frozen=True)
class BenchOutcome:
    host: str
    timings: tuple[SizeTiming, ...]

    def of(self, collective: str) -> list[SizeTiming]:
        return [t for t in self.timings if t.collective == collective]


@dataclass
class _RankState:
    """What the watcher knows about one rank (mutable: it is the watcher's log)."""

    rank: int
    process: subprocess.Popen
    collective: str = ""
    task_index: int = -1
    point: int = -1
    size_bytes: int | None = None
    done: bool = False
    closed_streams: int = 0
    stage: str = "starting Python"
    error: str = ""
    stderr_tail: list[str] = field(default_factory=list)

    @property
    def progress(self) -> tuple[int, int, int]:
        return (self.task_index, self.point, _STARTUP_STAGES.index(self.stage))

    def where(self) -> str:
        if not self.collective:
            return f"during start-up ({self.stage})"
        at = f" at {self.size_bytes} B" if self.size_bytes is not None else ""
        return f"in {self.collective}{at}"


def check_backend(backend: str, world_size: int) -> None:
    """Fail early, with the option's name, when `backend` cannot run `world_size` ranks."""
    if backend not in BACKENDS:
        raise ConfigError("backend", f"unknown backend '{backend}'; expected one of {', '.join(BACKENDS)}")
    if backend == "gloo":
        return  # every CPU build of torch has gloo; the ranks report it if not (saves a torch import here)
    import torch
    import torch.distributed as dist

    if not torch.cuda.is_available():
        raise ConfigError("backend", "nccl needs CUDA, but torch sees no CUDA device; use --backend gloo")
    if not dist.is_available() or not dist.is_nccl_available():
        raise ConfigError("backend", "this torch build has no nccl backend; use --backend gloo")
    found = torch.cuda.device_count()
    if found < world_size:
        raise ConfigError(
            "world_size",
            f"nccl runs one rank per CUDA device: {world_size} ranks need {world_size} devices, found {found}",
        )


LOOPBACK = "127.0.0.1"
LOOPBACK_INTERFACE = {"gloo": "GLOO_SOCKET_IFNAME", "nccl": "NCCL_SOCKET_IFNAME"}


def rendezvous_socket() -> socket.socket:
    """A listening TCP socket on 127.0.0.1 at a port the OS picks: rank 0 serves the
    rendezvous store on it (`master_listen_fd`), the others connect to its port."""
    return socket.create_server((LOOPBACK, 0), backlog=128)


def _job_payload(job: BenchJob, port: int) -> dict:
    tasks = []
    for collective in job.collectives:
        if collective == "all_to_allv":
            tasks.append({
                "collective": collective,
                "dtype": A2AV_DTYPE,
                "sizes": job.points(collective),
                "samples": [
                    {"global_batch": s.global_batch, "tables_per_rank": list(s.tables_per_rank), "dim": s.dim}
                    for s in job.a2av_samples
                ],
            })
        else:
            tasks.append({"collective": collective, "dtype": job.dtype, "sizes": job.points(collective)})
    cores = os.cpu_count() or 1
    return {
        "backend": job.backend,
        "world_size": job.world_size,
        "store_host": LOOPBACK,
        "store_port": port,
        "pg_timeout_s": job.timeout_s + _PG_TIMEOUT_MARGIN_S,
        "threads_per_rank": max(1, cores // job.world_size),
        "warmup": job.warmup,
        "iters": job.iters,
        "tasks": tasks,
    }


def _reader(rank: int, stream, kind: str, sink: queue.Queue) -> None:
    for raw in iter(stream.readline, ""):
        sink.put((rank, kind, raw.rstrip("\n")))
    sink.put((rank, kind, None))


def _terminate(states: Sequence[_RankState]) -> None:
    """SIGTERM every rank's session, SIGKILL what is left after a grace period, reap all."""
    for state in states:
        if state.process.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(state.process.pid, signal.SIGTERM)
    deadline = time.monotonic() + _KILL_GRACE_S
    for state in states:
        remaining = max(0.0, deadline - time.monotonic())
        try:
            state.process.wait(timeout=remaining)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(state.process.pid, signal.SIGKILL)
            state.process.wait()
    # A rank's session may hold helpers that outlived it: kill what still answers.
    for state in states:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(state.process.pid, signal.SIGKILL)


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _failure_message(state: _RankState, job: BenchJob) -> str:
    if state.error:
        what, tail = f"failed {state.where()}: {state.error}", ""
    else:
        code = state.process.returncode if state.process.returncode is not None else -1
        what = f"{_describe_exit(code)} {state.where()}"
        lines = state.stderr_tail[-5:]
        tail = "".join(f"\n  [rank {state.rank}] {line}" for line in lines)
        tail = f"\nlast lines of rank {state.rank}'s stderr:{tail}" if lines else ""
    return (
        f"rank {state.rank} {what} ({job.backend}, {job.world_size} ranks); "
        f"all ranks were stopped and no results were written{tail}"
    )


def _hang_message(states: Sequence[_RankState], job: BenchJob) -> str:
    running = [s for s in states if not s.done]
    if not running:
        stuck = ", ".join(str(s.rank) for s in states if s.process.poll() is None)
        return (
            f"rank(s) {stuck} finished measuring but did not exit within {job.timeout_s:g} s "
            "(--timeout); all ranks were stopped and no results were written"
        )
    behind = min(s.progress for s in running)
    laggards = [s for s in running if s.progress == behind]
    names = ", ".join(str(s.rank) for s in laggards)
    plural = "s" if len(laggards) > 1 else ""
    stuck_together = len(laggards) == len(running) and len(running) > 1
    why = " (all running ranks are stuck at the same point)" if stuck_together else ""
    return (
        f"rank{plural} {names} hung {laggards[0].where()}: no progress from any rank for "
        f"{job.timeout_s:g} s (--timeout){why}; all ranks were stopped and no results were written"
    )


def run_bench(
    job: BenchJob,
    on_start: Callable[[str, str], None] | None = None,
    on_result: Callable[[SizeTiming], None] | None = None,
) -> BenchOutcome:
    """Run `job`; `on_start(collective, host)` and `on_result(timing)` report progress
    as it happens (e.g. to print a table). Raises `BenchError` on a crash or hang."""
    check_backend(job.backend, job.world_size)
    store_socket = rendezvous_socket()
    spec = _job_payload(job, store_socket.getsockname()[1])
    payload = json.dumps(spec)
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("OMP_NUM_THREADS", str(spec["threads_per_rank"]))
    env.setdefault(LOOPBACK_INTERFACE[job.backend], "lo")
    events: queue.Queue = queue.Queue()
    states: list[_RankState] = []
    readers: list[threading.Thread] = []
    timings: list[SizeTiming] = []
    host_sink: list[str] = []  # rank 0's host name, once it says hello
    task_of = {c: i for i, c in enumerate(job.collectives)}

    previous_sigterm = None
    if threading.current_thread() is threading.main_thread():
        def _on_sigterm(signum, frame):
            raise KeyboardInterrupt
        previous_sigterm = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        for rank in range(job.world_size):
            store_fd = [store_socket.fileno()] if rank == 0 else []
            process = subprocess.Popen(
                [sys.executable, "-m", "paraplan.comm.bench_rank", str(rank), str(os.getpid()),
                 *map(str, store_fd)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True, env=env, start_new_session=True, pass_fds=store_fd,
            )
            states.append(_RankState(rank, process))
            assert process.stdin is not None  # stdin=PIPE
            process.stdin.write(payload)
            process.stdin.close()
            for stream, kind in ((process.stdout, "out"), (process.stderr, "err")):
                thread = threading.Thread(target=_reader, args=(rank, stream, kind, events), daemon=True)
                thread.start()
                readers.append(thread)

        last_progress = time.monotonic()
        next_check = last_progress
        while True:
            try:
                got: tuple[int, str, str] | None = events.get(timeout=0.2)
            except queue.Empty:
                got = None
            if got is not None:
                rank, kind, line = got
                if _handle_line(states[rank], kind, line, host_sink, on_start, on_result, timings, task_of):
                    last_progress = time.monotonic()
                if not events.empty() and time.monotonic() < next_check:
                    continue  # drain queued lines before judging exits
            next_check = time.monotonic() + 0.5
            for state in states:
                code = state.process.poll()
                if code is None:
                    continue
                if code != 0 or (state.closed_streams == 2 and not state.done):
                    # let the ranks' last lines arrive before blaming one
                    _drain(events, states, time.monotonic() + 0.5, host_sink, timings, task_of)
                    raise BenchError(_failure_message(_first_failure(states, state), job))
            if all(s.done and s.closed_streams == 2 and s.process.poll() == 0 for s in states):
                break
            if time.monotonic() - last_progress > job.timeout_s:
                raise BenchError(_hang_message(states, job))
    finally:
        store_socket.close()
        _terminate(states)
        for thread in readers:
            thread.join(timeout=1.0)
        if previous_sigterm is not None:
            signal.signal(signal.SIGTERM, previous_sigterm)

    expected = sum(len(job.points(c)) for c in job.collectives)
    if len(timings) != expected:
        raise BenchError(f"rank 0 reported {len(timings)} results, expected {expected}")
    return BenchOutcome(host=host_sink[0] if host_sink else "", timings=tuple(timings))


def _handle_line(state: _RankState, kind: str, line: str | None, host_sink: list[str],
                 on_start, on_result, timings: list[SizeTiming], task_of: dict[str, int]) -> bool:
    """Apply one line from a rank; True when it was a progress event."""
    if line is None:
        state.closed_streams += 1
        return False
    if kind == "err" or not line.startswith(EVENT_PREFIX):
        if kind == "err":
            state.stderr_tail = [*state.stderr_tail[-(_STDERR_TAIL_LINES - 1):], line]
        print(f"[rank {state.rank}] {line}", file=sys.stderr)
        return False
    event = json.loads(line[len(EVENT_PREFIX):])
    name = event["ev"]
    if name == "hello":
        state.stage = "importing torch"
        if state.rank == 0:
            host_sink.append(event["host"])
    elif name == "imported":
        state.stage = "forming the process group"
    elif name == "ready":
        state.stage = "ready"
    elif name == "start":
        state.collective, state.task_index = event["c"], task_of[event["c"]]
        state.point, state.size_bytes = -1, None
        if state.rank == 0 and on_start is not None:
            on_start(event["c"], host_sink[0] if host_sink else "")
    elif name == "size":
        state.point, state.size_bytes = event["i"], event["s"]
    elif name == "result":
        timing = SizeTiming(event["c"], event["i"], event["s"], tuple(event["t"]))
        timings.append(timing)
        if on_result is not None:
            on_result(timing)
    elif name == "error":
        state.error = state.error or event["message"]
    elif name == "done":
        state.done = True
    return True


def _drain(events: queue.Queue, states: Sequence[_RankState], until: float,
           host_sink: list[str], timings: list[SizeTiming], task_of: dict[str, int]) -> None:
    """Read what the ranks still had to say (errors, stderr) until `until`."""
    while time.monotonic() < until:
        try:
            rank, kind, line = events.get(timeout=0.05)
        except queue.Empty:
            continue
        _handle_line(states[rank], kind, line, host_sink, None, None, timings, task_of)


def _first_failure(states: Sequence[_RankState], seen: _RankState) -> _RankState:
    """The rank to blame: the one that died without an error report (a hard crash)
    or whose error is not a lost connection to a peer; else the first seen."""
    peer_loss = ("connection", "closed", "reset by peer", "timed out", "timeout")
    failed = [s for s in states if s.process.poll() not in (None, 0) or s.error]
    for state in failed:
        if not state.error:
            return state
    for state in failed:
        if not any(word in state.error.lower() for word in peer_loss):
            return state
    return seen


def collective_frame(job: BenchJob, collective: str, outcome: BenchOutcome, nodes: int = 1):
    """The bench CSV rows (`paraplan.comm.results.bench_frame`) of one collective."""
    timings = sorted(outcome.of(collective), key=lambda t: t.index)
    return _frame(job, collective, timings, outcome.host, nodes)


def timing_frame(job: BenchJob, timing: SizeTiming, host: str = "", nodes: int = 1):
    """The one bench CSV row of a single timing (for live tables)."""
    return _frame(job, timing.collective, [timing], host, nodes)


def _frame(job: BenchJob, collective: str, timings: Sequence[SizeTiming], host: str, nodes: int):
    from paraplan.comm.results import bench_frame, summarize_times_us
    from paraplan.comm.sizes import element_bytes

    stats = [summarize_times_us(t.times_s) for t in timings]
    sizes = [t.size_bytes for t in timings]
    extra: dict[str, list[object]] | None = None
    if collective == "all_to_allv":
        dtype = A2AV_DTYPE
        samples = [job.a2av_samples[t.index] for t in timings]
        extra = {
            "sample": [s.sample for s in samples],
            "global_batch": [s.global_batch for s in samples],
            "tables_per_rank": [s.tables_label for s in samples],
            "dim": [s.dim for s in samples],
        }
    else:
        dtype = job.dtype
    elem = element_bytes(dtype)
    return bench_frame(
        collective=collective,
        backend=job.backend,
        world_size=job.world_size,
        nodes=nodes,
        size_bytes=sizes,
        count=[element_count(collective, s, job.world_size, elem) for s in sizes],
        dtype=dtype,
        time_us=[m for m, _, _ in stats],
        time_p10_us=[p for _, p, _ in stats],
        time_p90_us=[p for _, _, p in stats],
        in_place=collective in ("all_reduce", "broadcast", "reduce"),
        host=host,
        extra=extra,
    )
