"""Log the MLflow runs waiting in the spool now, and say what happened.

Every tracked command writes its run as a record (`.paraplan/runs/` in the folder it
ran in, or $PARAPLAN_TRACKING_SPOOL) and a process logs it afterwards: the workflow's
end, or a background process after a standalone command. Run this when that
background logging failed (the next command says so), to log a folder of records by
hand, or to wait until the runs are in the store (it waits for a background logging
process that is still at work). A record whose command was killed is logged KILLED.

examples:
  paraplan track
  PARAPLAN_TRACKING_SPOOL=/scratch/runs paraplan track
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

NAME = "track"
HELP = "log the MLflow runs that commands recorded and that are not logged yet"
ORDER = 80


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--spool", type=Path, default=None, metavar="DIR",
                        help="the records' folder (default: $PARAPLAN_TRACKING_SPOOL, else .paraplan/runs)")


def run(args: argparse.Namespace) -> int:
    from paraplan.track import http_defaults
    from paraplan.track_job import describe, log_pending
    from paraplan.track_spool import spool_dir

    spool = args.spool.resolve() if args.spool else spool_dir()
    http_defaults()
    outcome = log_pending(spool, wait=True)
    for line in describe(outcome, spool):
        print(f"paraplan track: {line}", file=sys.stderr)
    return 2 if outcome.errors else 0
