"""Where a `tp2` training step's time goes on 2 gloo ranks (a script, not a test;
docs/validation-load.md, "tp2").

The validate stage charges tp2's activation all-reduces what an all-reduce costs when
both ranks start it together (the bench and the validate run's probes time each call
after a barrier). Inside a tp2 step nothing lines the ranks up: each of the blocking
all-reduces (16 per step for the default GPT: 2 per block in forward, 2 in backward)
starts when the later rank arrives, so a rank's time inside the call is its partner's
lateness plus the transfer. This script runs the default workflow's GPT in tp2 on 2
ranks (1 thread each, gloo) and prints, per rank:

- the step time (from a barrier), and the time spent inside the step's all-reduces,
  in total and per call;
- a barrier-synchronised all-reduce of the same size, timed in the same rounds
  (median and mean: what the prediction charges);
- the whole model's forward + backward on both ranks at once, without communication
  (the validate run's contention pass) and the mean |difference| of the two ranks'
  times per round: how far apart two ranks doing the same work drift.

The difference between the time inside the all-reduces and the barrier-synchronised
time is waiting for the partner: the part of tp2's step that the prediction does not
hold.

    PYTHONPATH=src python benchmarks/validate_tp2_breakdown.py [--rounds 20]

Timings on a machine other jobs share are noisy; the load average is printed.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time

WARMUP_ROUNDS = 3
PROBES_PER_ROUND = 3
GPT = {"num_layers": 4, "hidden_size": 256, "num_attention_heads": 4, "seq_length": 128, "vocab_size": 1024}
BATCH = 8  # validate.models.gpt.global_batch_size of config/config.yaml


def _rank(rank: int, world: int, rounds: int) -> dict[str, list[float]]:
    import torch
    import torch.distributed as dist
    from torch import nn

    from paraplan.validate.tensor_parallel import tensor_parallel_layers
    from paraplan.validate.workload import profile_model_workload

    work = profile_model_workload("gpt", GPT)
    tp = nn.Sequential(*tensor_parallel_layers(copy.deepcopy(list(work.layers)), rank, world))
    whole = nn.Sequential(*copy.deepcopy(list(work.layers)))
    x, y = work.make_batch(BATCH, torch.Generator().manual_seed(1))
    xh, yh = work.make_batch(BATCH // world, torch.Generator().manual_seed(2 + rank))
    probe = torch.zeros(BATCH * GPT["seq_length"] * GPT["hidden_size"])  # one activation, float32
    real_all_reduce = dist.all_reduce
    inside: list[float] = []

    def timed_all_reduce(*args, **kwargs):
        start = time.perf_counter()
        out = real_all_reduce(*args, **kwargs)
        inside.append(time.perf_counter() - start)
        return out

    dist.all_reduce = timed_all_reduce  # what tensor_parallel's autograd functions call
    out: dict[str, list[float]] = {"step": [], "inside": [], "calls": [], "probe": [], "together": []}
    for i in range(WARMUP_ROUNDS + rounds):
        keep = i >= WARMUP_ROUNDS
        for _ in range(PROBES_PER_ROUND):
            dist.barrier()
            start = time.perf_counter()
            real_all_reduce(probe)
            if keep:
                out["probe"].append(time.perf_counter() - start)
        dist.barrier()
        start = time.perf_counter()
        work.loss(whole(xh), yh).backward()
        together = time.perf_counter() - start
        inside.clear()
        dist.barrier()
        start = time.perf_counter()
        work.loss(tp(x), y).backward()
        step = time.perf_counter() - start
        for p in (*tp.parameters(), *whole.parameters()):
            p.grad = None
        if keep:
            out["step"].append(step)
            out["inside"].append(sum(inside))
            out["calls"].append(float(len(inside)))
            out["together"].append(together)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20, help="timed rounds (after 3 untimed)")
    args = parser.parse_args()
    from paraplan.validate.ranks import run_ranks

    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start")
    ranks = run_ranks(_rank, (args.rounds,), world_size=2, backend="gloo", threads_per_rank=1)
    med, ms = statistics.median, 1e3
    steps = [max(a, b) for a, b in zip(ranks[0]["step"], ranks[1]["step"], strict=True)]
    drift = [abs(a - b) for a, b in zip(ranks[0]["together"], ranks[1]["together"], strict=True)]
    print(f"tp2 step (slowest rank) median {med(steps) * ms:.1f} ms; contention pass (both ranks at once, no "
          f"communication) median {med(ranks[0]['together']) * ms:.1f} / {med(ranks[1]['together']) * ms:.1f} ms, "
          f"mean |rank 0 - rank 1| {statistics.fmean(drift) * ms:.1f} ms")
    for r, out in enumerate(ranks):
        calls = int(out["calls"][0])
        synced = statistics.fmean(out["probe"])
        waiting = med(out["inside"]) - calls * synced
        print(f"rank {r}: step median {med(out['step']) * ms:.1f} ms, inside its {calls} all-reduces "
              f"{med(out['inside']) * ms:.1f} ms ({med(out['inside']) / calls * ms:.2f} ms per call); "
              f"barrier-synchronised all-reduce median {med(out['probe']) * ms:.2f} ms, mean {synced * ms:.2f} ms; "
              f"waiting for the partner about {waiting * ms:.1f} ms per step "
              f"({waiting / med(out['step']):.0%} of the step)")
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
