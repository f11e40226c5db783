"""One rank of a collective benchmark: `python -m paraplan.comm.bench_rank RANK PID [STORE_FD]`.

Started by `paraplan.comm.bench` (one process per rank, each in its own session),
it first arranges to die with its controller PID (Linux: `prctl(PR_SET_PDEATHSIG,
SIGKILL)`; elsewhere a thread that watches the parent pid), then reads the job as
JSON on stdin and forms the process group over a TCPStore: rank 0 serves it on the
listening socket STORE_FD the controller bound to 127.0.0.1, the others connect to
its port. It reports on stdout, one JSON event per line
prefixed with `EVENT_PREFIX`: `hello` (host; before importing torch), `imported`
(torch loaded), `ready` (process group formed), `start` (a collective), `size` (a
message size or all_to_allv sample is about to run), `result` (rank 0 only: the
per-iteration times, already the max over ranks), `error` and `done`. Anything
else a rank prints goes to stderr.

Timing: `warmup` untimed calls, then `iters` timed calls, each after a barrier,
timed per rank with `time.perf_counter` (on CUDA between device synchronisations);
the per-iteration times are all-reduced with MAX, so an iteration counts as long as
its slowest rank.

Fault injection for the harness's own tests: PARAPLAN_BENCH_FAULT=RANK:COLLECTIVE:KIND
makes rank RANK, on starting COLLECTIVE, exit hard (`crash`), sleep forever (`hang`)
or raise (`raise`).
"""

from __future__ import annotations

import ctypes
import datetime
import json
import os
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable

EVENT_PREFIX = "@@paraplan-bench@@ "
FAULT_ENV = "PARAPLAN_BENCH_FAULT"
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_PARENT_POLL_S = 0.5


def die_with_parent(parent_pid: int) -> str:
    """Make sure this process does not outlive `parent_pid` (the controller): the kernel
    sends SIGKILL when the parent exits (Linux), or a daemon thread exits when the parent
    pid changes (elsewhere). A parent that is already gone ends this process at once.
    Returns the mechanism used."""
    mechanism = "watchdog thread"
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0:
            mechanism = "PR_SET_PDEATHSIG"
    if os.getppid() != parent_pid:  # it died before the signal was armed
        os._exit(1)
    if mechanism == "watchdog thread":
        def watch() -> None:
            while os.getppid() == parent_pid:
                time.sleep(_PARENT_POLL_S)
            os._exit(1)

        threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()
    return mechanism


def emit(event: str, **fields: object) -> None:
    sys.stdout.write(EVENT_PREFIX + json.dumps({"ev": event, **fields}) + "\n")
    sys.stdout.flush()


def _inject_fault(rank: int, collective: str) -> None:
    spec = os.environ.get(FAULT_ENV, "")
    if not spec:
        return
    fault_rank, fault_collective, kind = spec.split(":")
    if int(fault_rank) != rank or fault_collective != collective:
        return
    if kind == "crash":
        os._exit(3)
    if kind == "hang":
        while True:
            time.sleep(3600)
    if kind == "raise":
        raise RuntimeError(f"injected fault on rank {rank} in {collective}")


def _make_op(dist, torch, collective: str, size_bytes: int, n: int, dtype, device,
             elem_bytes: int, sample: dict | None, rank: int) -> Callable[[], object]:
    """A zero-argument call running one collective on preallocated buffers."""
    if collective == "all_to_allv":
        if sample is None:
            raise ValueError("all_to_allv runs one DLRM-style sample per call; none was given")
        b = sample["global_batch"] // n
        tables = sample["tables_per_rank"]
        dim = sample["dim"]
        in_split = [b * tables[rank] * dim] * n
        out_split = [b * tables[j] * dim for j in range(n)]
        inp = torch.zeros(sum(in_split), dtype=dtype, device=device)
        out = torch.empty(sum(out_split), dtype=dtype, device=device)
        return lambda: dist.all_to_all_single(out, inp, out_split, in_split)
    total = size_bytes // elem_bytes
    share = total // n
    if collective == "all_reduce":
        buf = torch.zeros(total, dtype=dtype, device=device)
        return lambda: dist.all_reduce(buf)
    if collective == "broadcast":
        buf = torch.zeros(total, dtype=dtype, device=device)
        return lambda: dist.broadcast(buf, src=0)
    if collective == "reduce":
        buf = torch.zeros(total, dtype=dtype, device=device)
        return lambda: dist.reduce(buf, dst=0)
    if collective == "all_gather":
        inp = torch.zeros(share, dtype=dtype, device=device)
        out = torch.empty(total, dtype=dtype, device=device)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return lambda: gather(out, inp)
    if collective == "reduce_scatter":
        inp = torch.zeros(total, dtype=dtype, device=device)
        out = torch.empty(share, dtype=dtype, device=device)
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        return lambda: scatter(out, inp)
    if collective == "all_to_all":
        inp = torch.zeros(total, dtype=dtype, device=device)
        out = torch.empty(total, dtype=dtype, device=device)
        return lambda: dist.all_to_all_single(out, inp)
    raise ValueError(f"unknown collective '{collective}'")


def _time_op(dist, torch, op, warmup: int, iters: int, device) -> list[float]:
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    barrier = (lambda: dist.barrier(device_ids=[device.index])) if cuda else dist.barrier
    for _ in range(warmup):
        op()
    sync()
    times = [0.0] * iters
    for i in range(iters):
        barrier()
        sync()
        start = time.perf_counter()
        op()
        sync()
        times[i] = time.perf_counter() - start
    slowest = torch.tensor(times, dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return slowest.cpu().tolist()


def run_rank(rank: int, job: dict, store_fd: int | None = None) -> None:
    emit("hello", host=socket.gethostname(), pid=os.getpid())
    import torch
    import torch.distributed as dist

    n = job["world_size"]
    backend = job["backend"]
    if backend == "nccl":
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(job["threads_per_rank"])
    emit("imported")
    timeout = datetime.timedelta(seconds=job["pg_timeout_s"])
    store = dist.TCPStore(
        job["store_host"], job["store_port"], n, is_master=rank == 0, timeout=timeout,
        master_listen_fd=store_fd,
    )
    dist.init_process_group(backend, store=store, rank=rank, world_size=n, timeout=timeout)
    emit("ready")
    for task in job["tasks"]:
        collective = task["collective"]
        dtype = getattr(torch, task["dtype"])
        elem_bytes = torch.empty((), dtype=dtype).element_size()
        emit("start", c=collective)
        _inject_fault(rank, collective)
        samples = task.get("samples") or [None] * len(task["sizes"])
        for index, (size_bytes, sample) in enumerate(zip(task["sizes"], samples, strict=True)):
            emit("size", c=collective, i=index, s=size_bytes)
            op = _make_op(dist, torch, collective, size_bytes, n, dtype, device,
                          elem_bytes, sample, rank)
            times = _time_op(dist, torch, op, job["warmup"], job["iters"], device)
            del op  # free this size's buffers before the next allocation
            if rank == 0:
                emit("result", c=collective, i=index, s=size_bytes, t=times)
    dist.barrier()
    dist.destroy_process_group()
    emit("done")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    rank, controller_pid = int(argv[0]), int(argv[1])
    store_fd = int(argv[2]) if len(argv) > 2 else None
    die_with_parent(controller_pid)
    job = json.loads(sys.stdin.read())
    try:
        run_rank(rank, job, store_fd)
    except BaseException as exc:  # report every failure, then exit non-zero
        last = traceback.format_exception_only(type(exc), exc)[-1].strip()
        emit("error", message=last[:2000])
        traceback.print_exc(file=sys.stderr)
        sys.stderr.flush()
        # Skip interpreter teardown: a failed process group can block in its destructor.
        os._exit(1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
