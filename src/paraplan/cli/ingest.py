"""Import another tool's output into paraplan's own files.

A mamf-finder.py log (stas00/ml-engineering) and XLA's matmul perf table (text
protobuf, one device key) become GEMM CSVs of `paraplan bench --kind gemm`
(paraplan.kernels.mamf, paraplan.kernels.xla_table). nccl-tests / rccl-tests stdout
and PARAM comms output become the bench CSV of docs/design.md (one CSV may hold
several collectives), and so do vTrain's all-reduce tables (`vtrain-allreduce`,
`AR_GPU<n>_*_LUT`: nccl-tests' columns with times in ns; paraplan.comm.vtrain_lut). The out-of-place columns are
read unless --in-place; the world size, node count and collective come from the
log unless given. Zero-size rows are dropped; algbw/busbw are recomputed and a
printed value (>= 1.00 GB/s) more than 5% off is reported as a warning naming the
file and line. Lines that are not table rows are skipped; a row that starts like
one but cannot be read, or a file without any, is an error.

Examples (the first three read files of the repository's data/):
  paraplan ingest --format nccl-tests data/nccl-tests/05_a100_oci_bm_gpu4_1x8_all_reduce.txt -o a100.csv
  paraplan ingest --format pipedream data/pipedream-profiles/resnet50-pbs-32.txt -o resnet50.csv
  paraplan ingest --format vtrain data/published/vtrain_a100_single_node_measured.csv -o runs.csv
  paraplan ingest --format mamf mamf-h100.txt --device H100-SXM5-80GB -o h100_gemm.csv
  paraplan ingest --format xla-matmul default_matmul_perf_table.txtpb --device-key sm_90 \\
      --device H100-SXM5-80GB -o h100_xla.csv
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from paraplan.cli.common import add_output_argument, add_tracking_arguments, deprecated, track
from paraplan.core import ConfigError

NAME = "ingest"
HELP = ("import nccl-tests, rccl-tests or PARAM logs as bench CSVs, PipeDream profiles as profile CSVs, "
        "vTrain measurements as run tables, mamf-finder logs and XLA matmul tables as GEMM CSVs")
ORDER = 15


def _collective_log(args: argparse.Namespace, reader_name: str) -> dict:
    """Read a collective log with the named importer, write the bench CSV; returns
    what to track."""
    from paraplan.comm import nccl_tests, param_log, vtrain_lut
    from paraplan.comm.log_common import ImportOptions, rows_frame
    from paraplan.files import write_csv

    if args.in_place and reader_name == "param":
        raise ConfigError("--in-place", "PARAM output has one time per size; --in-place applies to nccl-tests logs")
    options = ImportOptions(
        in_place=args.in_place, world_size=args.world_size, nodes=args.nodes, collective=args.collective
    )
    reader = {"nccl-tests": nccl_tests.read_nccl_tests, "param": param_log.read_param,
              "vtrain-allreduce": vtrain_lut.read_vtrain_lut}[reader_name]
    result = reader(args.log, options)
    for warning in result.warnings:
        print(f"paraplan ingest: warning: {warning}", file=sys.stderr)
    frame = rows_frame(result.rows)
    write_csv(args.output, frame)
    sweeps = frame.groupby(["collective", "world_size", "nodes"], sort=True).size()
    for (collective, world, nodes), rows in sweeps.items():
        print(f"paraplan ingest: {args.log}: {collective}, {world} ranks on {nodes} node(s): {rows} sizes "
              f"-> {args.output}",
              file=sys.stderr)
    return {
        "metrics": {"rows": float(len(frame)), "warnings": float(len(result.warnings))},
        "params": {"collectives": sorted(frame["collective"].unique()),
                   "world_sizes": sorted(int(w) for w in frame["world_size"].unique())},
    }


def _pipedream_profile(args: argparse.Namespace) -> dict:
    """A PipeDream/DAPPLE TorchGraph profile -> profile CSV + meta (paraplan.profile.pipedream)."""
    from paraplan.profile.io import write_profile
    from paraplan.profile.pipedream import read_pipedream

    profile = read_pipedream(args.log, args.batch_size)
    csv_path, mpath = write_profile(profile, args.output)
    fwd_ms, bwd_ms = profile.fwd_s.sum() * 1e3, profile.bwd_s.sum() * 1e3
    print(f"paraplan ingest: {args.log}: {profile.num_layers} layers at batch {profile.batch_size}, "
          f"fwd {fwd_ms:.1f} ms, bwd {bwd_ms:.1f} ms, params {profile.total_param_bytes / 1e6:.1f} MB "
          f"-> {csv_path} (+ {mpath.name})", file=sys.stderr)
    return {
        "metrics": {"layers": float(profile.num_layers), "fwd_s": float(profile.fwd_s.sum()),
                    "bwd_s": float(profile.bwd_s.sum()), "param_bytes": profile.total_param_bytes},
        "params": {"batch_size": profile.batch_size},
    }


def _vtrain_runs(args: argparse.Namespace) -> dict:
    """vTrain's measured iteration times -> a run table (paraplan.predict.vtrain)."""
    import csv

    from paraplan.files import atomic_open
    from paraplan.predict.vtrain import RUN_TABLE_COLUMNS, read_vtrain

    rows = read_vtrain(args.log)
    with atomic_open(args.output, "w") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(RUN_TABLE_COLUMNS), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    print(f"paraplan ingest: {args.log}: {len(rows)} measured runs -> {args.output}", file=sys.stderr)
    return {"metrics": {"rows": float(len(rows))}, "params": {}}


def _mamf_log(args: argparse.Namespace) -> dict:
    """A mamf-finder.py log -> GEMM CSV (paraplan.kernels.mamf)."""
    import pandas as pd

    from paraplan.files import write_csv
    from paraplan.kernels.mamf import read_mamf
    from paraplan.kernels.results import GEMM_COLUMNS

    log = read_mamf(args.log)
    device = args.device or log.device
    if not device:
        raise ConfigError("--device", f"{args.log} names no device; give --device (the cluster file's device name)")
    frame = pd.DataFrame([{**r, "kind": "gemm", "device": device, "source": "mamf-finder"} for r in log.rows])
    write_csv(args.output, frame[list(GEMM_COLUMNS)])
    print(f"paraplan ingest: {args.log}: {len(frame)} GEMM shape(s) of {device} in {log.dtype}, best "
          f"{frame['tflops'].max():.1f} TFLOP/s (median) -> {args.output}", file=sys.stderr)
    return {"metrics": {"rows": float(len(frame)), "max_tflops": float(frame["tflops"].max())},
            "params": {"device": device, "dtype": log.dtype}}


def _xla_table(args: argparse.Namespace) -> dict:
    """XLA's matmul perf table (one device key, one operand type) -> GEMM CSV (paraplan.kernels.xla_table)."""
    import pandas as pd

    from paraplan.files import write_csv
    from paraplan.kernels.results import GEMM_COLUMNS
    from paraplan.kernels.xla_table import read_xla_table

    if not args.device_key or not args.device:
        raise ConfigError("--device-key" if not args.device_key else "--device",
                          "xla-matmul needs --device-key (e.g. sm_90) and --device (the cluster file's device name)")
    rows = read_xla_table(args.log, args.device_key, args.dtype_key)
    frame = pd.DataFrame([{**r, "kind": "gemm", "device": args.device, "source": f"xla-matmul-{args.device_key}"}
                          for r in rows])
    write_csv(args.output, frame[list(GEMM_COLUMNS)])
    print(f"paraplan ingest: {args.log}: {len(frame)} GEMM shape(s) of {args.device_key} ({args.dtype_key}) as "
          f"{args.device}, best {frame['tflops'].max():.1f} TFLOP/s -> {args.output}", file=sys.stderr)
    return {"metrics": {"rows": float(len(frame)), "max_tflops": float(frame["tflops"].max())},
            "params": {"device": args.device, "device_key": args.device_key, "dtype_key": args.dtype_key}}


# --format -> handler(args) -> {"metrics": ..., "params": ...}; a new format is one entry.
HANDLERS: dict[str, Callable[[argparse.Namespace], dict]] = {
    "nccl-tests": lambda args: _collective_log(args, "nccl-tests"),
    "param": lambda args: _collective_log(args, "param"),
    "vtrain-allreduce": lambda args: _collective_log(args, "vtrain-allreduce"),
    "pipedream": _pipedream_profile,
    "vtrain": _vtrain_runs,
    "mamf": _mamf_log,
    "xla-matmul": _xla_table,
}


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got '{text}'") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("log", type=Path, help="the log file to import")
    parser.add_argument("--format", required=True, choices=sorted(HANDLERS), help="the log's format")
    add_output_argument(parser, "output CSV", old=["--out"])
    parser.add_argument("--in-place", action="store_true",
                        help="nccl-tests, vtrain-allreduce: read the in-place columns")
    parser.add_argument("--world-size", type=_positive, default=None,
                        help="ranks; when omitted, the log's rank lines are counted")
    parser.add_argument("--nodes", type=_positive, default=None,
                        help="nodes; when omitted, the log's distinct host names are counted")
    parser.add_argument("--collective", default=None,
                        help="collective; when omitted, read from the log's command line or header")
    parser.add_argument("--profile-batch-size", dest="batch_size", type=_positive, default=None,
                        help="pipedream: the profile's batch size (default: the file name's -pbs-N)")
    deprecated(parser, "--batch-size", "--profile-batch-size", "batch_size", convert=_positive)
    parser.add_argument("--device", default=None,
                        help="mamf, xla-matmul: the device column (the cluster file's device name; mamf's "
                             "default: the name in the log)")
    parser.add_argument("--device-key", default=None, help="xla-matmul: the table's device key, e.g. sm_90")
    parser.add_argument("--dtype-key", default="bf16xbf16->bf16",
                        help="xla-matmul: the operand types to read (default bf16xbf16->bf16)")
    add_tracking_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from paraplan.files import check_outputs
    from paraplan.profile.io import meta_path

    check_outputs(files=[args.output, meta_path(args.output) if args.format == "pipedream" else None])
    summary = HANDLERS[args.format](args)
    from paraplan.track import RunLog

    track(
        args,
        RunLog(
            stage="ingest",
            run_name=f"{args.format}:{args.log.name}",
            params={"format": args.format, "log": str(args.log), "in_place": args.in_place, **summary["params"]},
            metrics=summary["metrics"],
            artifacts=[args.output],
        ),
    )
    return 0
