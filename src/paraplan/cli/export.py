"""Write paraplan results in other tools' formats.

Examples:
  paraplan export --format pipedream results/profiles/gpt.csv -o gpt-pbs-8.txt  # after `paraplan profile`
  paraplan ingest --format pipedream data/pipedream-profiles/resnet50-pbs-32.txt -o resnet50.csv
  paraplan export --format pipedream resnet50.csv -o resnet50-pbs-32.txt

pipedream: a profile CSV (+ meta) as PipeDream/DAPPLE TorchGraph text, a chain of
nodes; `paraplan ingest --format pipedream` reads it back exactly (names, times,
activation and parameter bytes; fixed times and FLOPs have no place in the format).
Name the file `<model>-pbs-<batch>.txt` so the batch size travels with it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from paraplan.cli.common import add_output_argument, add_tracking_arguments
from paraplan.core import ConfigError

NAME = "export"
HELP = "write paraplan results in other formats (pipedream)"
ORDER = 35


def _export_pipedream(source: Path, output: Path) -> dict[str, object]:
    from paraplan.profile.io import read_profile
    from paraplan.profile.pipedream import batch_size_from_name, write_pipedream

    profile = read_profile(source)
    named = batch_size_from_name(output)
    if named is not None and named != profile.batch_size:
        raise ConfigError("--output", f"the name says -pbs-{named} but the profile is at batch {profile.batch_size}")
    write_pipedream(profile, output)
    print(f"paraplan export: wrote {output}: {profile.num_layers} layers at batch {profile.batch_size}"
          + ("" if named is not None else f" (name it *-pbs-{profile.batch_size}.txt to carry the batch size)"),
          file=sys.stderr)
    return {"layers": profile.num_layers, "batch_size": profile.batch_size}


# format -> handler(source, output) returning what to log; other stages add theirs here
EXPORTERS: dict[str, Callable[[Path, Path], dict[str, object]]] = {
    "pipedream": _export_pipedream,
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--format", required=True, choices=sorted(EXPORTERS), help="output format")
    parser.add_argument("source", type=Path, help="paraplan result file to export (pipedream: a profile CSV)")
    add_output_argument(parser, "file to write")
    add_tracking_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from paraplan.cli.common import track
    from paraplan.track import RunLog

    info = EXPORTERS[args.format](args.source, args.output)
    track(args, RunLog(stage="export", run_name=f"{args.format}:{args.source.stem}",
                       params={"format": args.format, "source": str(args.source), "output": str(args.output)},
                       metrics={k: float(v) for k, v in info.items() if isinstance(v, int | float)},
                       artifacts=[args.output]))
    return 0
