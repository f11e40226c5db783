"""Run a function on N ranks of a fresh torch.distributed process group.

Ranks are spawned processes that meet at a rendezvous store served by rank 0 on a
socket this process binds to 127.0.0.1 (port chosen by the OS) and hands over, as
`paraplan bench` does: torch's own TCP rendezvous would listen on every interface,
reachable from other machines. gloo's and NCCL's sockets are put on the loopback
interface too (`GLOO_SOCKET_IFNAME` / `NCCL_SOCKET_IFNAME=lo` unless already set).
Each rank calls `target(rank, world_size, *args)` and the return values come back in
rank order.
A rank that fails ends all of them; a hang ends after `timeout_s`. A rank may
report progress with `report_progress(n)`; `run_ranks(on_progress=...)` receives it.
"""

from __future__ import annotations

import datetime
import pickle
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from paraplan.comm.bench import LOOPBACK_INTERFACE, rendezvous_socket

_PROGRESS_QUEUE = None  # set in a rank process: where report_progress sends to


def report_progress(n: int = 1) -> None:
    """From a rank: `n` more units of work done (a no-op outside run_ranks)."""
    if _PROGRESS_QUEUE is not None:
        _PROGRESS_QUEUE.put((-1, None, n))


def _rank_entry(rank, world_size, backend, store_socket, threads, timeout_s, target, args, queue) -> None:
    import os

    import torch
    import torch.distributed as dist

    global _PROGRESS_QUEUE
    _PROGRESS_QUEUE = queue
    torch.set_num_threads(threads)
    if backend == "nccl":
        torch.cuda.set_device(rank)
    os.environ.setdefault(LOOPBACK_INTERFACE[backend], "lo")
    timeout = datetime.timedelta(seconds=timeout_s)
    host, port = store_socket.getsockname()[:2]
    store = dist.TCPStore(host, port, world_size, is_master=rank == 0, timeout=timeout,
                          master_listen_fd=store_socket.fileno() if rank == 0 else None)
    if rank != 0:
        store_socket.close()  # only rank 0 serves the store
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
    try:
        # plain pickle copies tensors by value: torch's queue would share them through
        # file descriptors that die with this process
        queue.put((rank, True, pickle.dumps(target(rank, world_size, *args))))
    except BaseException:
        queue.put((rank, False, traceback.format_exc()))
        raise
    finally:
        dist.destroy_process_group()


def run_ranks(
    target: Callable[..., Any],
    args: Sequence[Any] = (),
    world_size: int = 2,
    backend: str = "gloo",
    threads_per_rank: int = 1,
    timeout_s: float = 600.0,
    on_progress: Callable[[int], object] | None = None,
) -> list[Any]:
    """`target(rank, world_size, *args)` on every rank; returns the values by rank.
    `target` must be importable by name (spawned processes import it).
    `on_progress(n)` receives what the ranks pass to `report_progress`."""
    import torch.multiprocessing as mp

    queue = mp.get_context("spawn").SimpleQueue()
    with rendezvous_socket() as store_socket:  # each rank gets a copy (spawn passes the descriptor)
        procs = mp.start_processes(
            _rank_entry,
            args=(world_size, backend, store_socket, threads_per_rank, timeout_s, target, tuple(args), queue),
            nprocs=world_size, join=False, start_method="spawn",
        )
    deadline = time.monotonic() + timeout_s + 60
    messages: list = []

    def receive() -> None:
        message = queue.get()
        if message[1] is None:  # progress, not a result
            if on_progress is not None:
                on_progress(message[2])
        else:
            messages.append(message)

    try:
        # read while waiting: a result larger than the pipe's buffer blocks its rank
        # until someone reads it
        while True:
            while not queue.empty():
                receive()
            if procs.join(timeout=0.2):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"ranks did not finish within {timeout_s + 60:.0f} s")
    except mp.ProcessRaisedException:
        pass  # the rank's own traceback comes through the queue below
    finally:
        for proc in procs.processes:
            if proc.is_alive():
                proc.terminate()
    while not queue.empty():
        receive()
    results: dict[int, Any] = {}
    for rank, ok, value in messages:
        if not ok:
            raise RuntimeError(f"rank {rank} failed:\n{value}")
        results[rank] = pickle.loads(value)
    missing = [r for r in range(world_size) if r not in results]
    if missing:
        raise RuntimeError(f"rank {missing[0]} ended without a result")
    return [results[r] for r in range(world_size)]
