"""Profile a model layer by layer: forward and backward time, output activation and
parameter bytes per layer, measured with torch (warm-up, then the median of --repeats
iterations) or computed analytically for a device of a cluster file (--analytic).

Examples:
  paraplan profile --model mlp --num-layers 4 --hidden-dim 1024 --profile-batch-size 32 -o results/profiles/mlp.csv
  paraplan profile --model gpt --profile-batch-sizes 2,4,8 --threads 1 -o results/profiles/gpt.csv \\
      --plots results/figures/profile
  paraplan profile --model resnet --profile-batch-size 32 --analytic --cluster dgx1-v100 -o resnet_v100.csv
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from dataclasses import fields
from pathlib import Path

from paraplan.cli.common import add_output_argument, add_tracking_arguments, deprecated, int_list, require_torch
from paraplan.core import ConfigError

SPEC_PREFIX = "spec_"
NAME = "profile"
HELP = "layer-wise profile of a model (torch measurement or analytic)"
ORDER = 30

DTYPES = ("float32", "bfloat16", "float16")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from paraplan.profile.specs import MODEL_SPECS
    from paraplan.typed import add_options

    parser.add_argument("--model", required=True, choices=list(MODEL_SPECS), help="the model to profile")
    models = parser.add_argument_group("model settings (paraplan.profile.specs; a model rejects the "
                                       "settings of the others)")
    added: set[str] = set()
    for cls in MODEL_SPECS.values():
        names = [f.name for f in fields(cls) if f.name not in added]
        add_options(models, cls, SPEC_PREFIX, only=names)
        added.update(names)
    parser.add_argument("--profile-batch-size", dest="batch", type=int, default=argparse.SUPPRESS, metavar="B",
                        help="batch size of the profile (32)")
    deprecated(parser, "--batch", "--profile-batch-size", "batch", convert=int)
    parser.add_argument("--profile-batch-sizes", dest="batches", default=None, metavar="LIST",
                        help="several batch sizes, e.g. 8,16,32: fit time(b) = fixed + per_sample x b per "
                        "layer; the CSV keeps the largest batch plus fwd_fixed_s/bwd_fixed_s")
    deprecated(parser, "--batches", "--profile-batch-sizes", "batches")
    add_output_argument(parser, "profile CSV (meta JSON beside it)")
    parser.add_argument("--plots", type=Path, default=None, metavar="DIR", help="folder for the per-layer bar chart")
    measured = parser.add_argument_group("measurement (torch)")
    measured.add_argument("--repeats", type=int, default=10, help="timed iterations (median)")
    measured.add_argument("--warmup", type=int, default=3, help="untimed iterations first")
    measured.add_argument("--threads", type=int, default=None,
                          help="torch threads (default: torch's); use cores // ranks to predict an N-rank run")
    measured.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    measured.add_argument("--dtype", choices=DTYPES, default="float32")
    analytic = parser.add_argument_group("analytic (no measurement)")
    analytic.add_argument("--analytic", action="store_true", help="FLOPs and bytes on a cluster's device")
    analytic.add_argument("--cluster", default=None, metavar="NAME|FILE",
                          help="cluster name or YAML path (with --analytic)")
    analytic.add_argument("--combine", choices=("roofline", "sum"), default="roofline",
                          help="roofline: max(compute, memory) per op; sum: the DistIR cost model")
    add_tracking_arguments(parser)


def _spec_settings(args: argparse.Namespace) -> dict[str, object]:
    """The model settings given as options, by field name (text, parsed by the spec)."""
    prefix = len(SPEC_PREFIX)
    return {k[prefix:]: v for k, v in vars(args).items() if k.startswith(SPEC_PREFIX)}


def _batches(args: argparse.Namespace) -> list[int]:
    batch = getattr(args, "batch", None)
    if args.batches:
        batches = sorted(set(int_list(args.batches, "--profile-batch-sizes")))
        if batch is not None and batch != batches[-1]:
            raise ConfigError("--profile-batch-size", f"with --profile-batch-sizes the profile is at the largest "
                              f"({batches[-1]}), got --profile-batch-size {batch}")
    else:
        batches = [batch if batch is not None else 32]
    if min(batches) < 1:
        raise ConfigError("--profile-batch-size", f"batch sizes must be >= 1, got {batches}")
    return batches


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _measure(args, spec, batches):
    require_torch("a measured profile (--analytic needs none)")
    import numpy as np
    import torch

    from paraplan.core import LayerProfile, ModelProfile
    from paraplan.profile.analytic import DTYPE_BYTES, model_ops
    from paraplan.profile.measure import measure_scaling
    from paraplan.profile.models import build_model

    if args.repeats < 1 or args.warmup < 0:
        raise ConfigError("--repeats", "need --repeats >= 1 and --warmup >= 0")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device", "cuda requested but torch sees no CUDA device")
    if args.threads is not None:
        if args.threads < 1:
            raise ConfigError("--threads", f"expected >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    model = build_model(spec)
    scaled = measure_scaling(model, batches, args.repeats, args.warmup, args.device, dtype)
    top = scaled.at_max
    ops = model_ops(spec, top.batch_size, DTYPE_BYTES[args.dtype])
    layers = tuple(
        LayerProfile(
            name=model.names[i], fwd_s=float(top.fwd_s[i]), bwd_s=float(top.bwd_s[i]),
            activation_bytes=float(top.activation_bytes[i]), param_bytes=float(top.param_bytes[i]),
            fwd_fixed_s=float(scaled.fwd_fixed_s[i]), bwd_fixed_s=float(scaled.bwd_fixed_s[i]),
            flops=ops[i].fwd_flops,
        )
        for i in range(len(model.names))
    )
    device_name = (torch.cuda.get_device_name() if args.device == "cuda"
                   else f"cpu ({_cpu_model()}, {os.cpu_count()} cores)")
    checks = {
        "whole_step_s": top.whole_step_s,
        "sum_vs_whole_rel_err": top.sum_vs_whole_rel_err,
        "min_layer_step_s": float(np.min(top.fwd_s + top.bwd_s)),
    }
    per_batch = {
        str(t.batch_size): {"fwd_s": float(t.fwd_s.sum()), "bwd_s": float(t.bwd_s.sum()),
                            "whole_step_s": t.whole_step_s, "sum_vs_whole_rel_err": t.sum_vs_whole_rel_err}
        for t in scaled.per_batch
    }
    meta = {
        "device": device_name, "dtype": args.dtype, "threads": torch.get_num_threads(),
        "method": "torch", "repeats": args.repeats, "warmup": args.warmup, "batches": batches,
        "statistic": "median", "torch_version": torch.__version__, **checks, "per_batch": per_batch,
    }
    return ModelProfile(args.output.stem, top.batch_size, layers, meta=meta), checks


def _analytic(args, spec, batches):
    from paraplan.clusters import load_cluster
    from paraplan.profile.analytic import analytic_profile

    if not args.cluster:
        raise ConfigError("--cluster", "--analytic needs --cluster (a name under config/clusters or a YAML path)")
    if len(batches) > 1:
        raise ConfigError("--profile-batch-sizes",
                          "analytic profiles are linear in the batch; give --profile-batch-size only")
    cluster = load_cluster(args.cluster)
    profile = analytic_profile(spec, batches[0], cluster.device, args.combine, args.dtype, name=args.output.stem)
    meta = {**profile.meta, "cluster": cluster.name, "threads": None, "repeats": 0}
    return type(profile)(profile.name, profile.batch_size, profile.layers, meta=meta), {}


def run(args: argparse.Namespace) -> int:
    from paraplan.files import check_outputs
    from paraplan.profile.consistency import profile_inconsistency
    from paraplan.profile.io import meta_path, write_profile
    from paraplan.profile.specs import make_spec, spec_settings
    from paraplan.track import RunLog
    from paraplan.typed import Source

    check_outputs(files=[args.output, meta_path(args.output)], folders=[args.plots])
    spec = make_spec(args.model, _spec_settings(args), Source.command_line())
    batches = _batches(args)
    if args.analytic:
        profile, checks = _analytic(args, spec, batches)
    else:
        profile, checks = _measure(args, spec, batches)
    meta = {"model": args.model, "model_settings": spec_settings(spec), **profile.meta}
    profile = type(profile)(profile.name, profile.batch_size, profile.layers, meta=meta)

    csv_path, mpath = write_profile(profile, args.output)
    artifacts = [csv_path, mpath]
    if args.plots is not None:
        from paraplan.plots.profile import plot_profile

        artifacts += plot_profile(profile, args.plots / profile.name)

    fwd, bwd = float(profile.fwd_s.sum()), float(profile.bwd_s.sum())
    threads = f", {meta['threads']} thread(s)" if meta.get("threads") is not None else ""  # measured only
    print(f"paraplan profile: {profile.name}: {profile.num_layers} layers at batch {profile.batch_size} "
          f"({meta['method']}, {meta['device']}{threads}): "
          f"fwd {fwd * 1e3:.3f} ms, bwd {bwd * 1e3:.3f} ms, params {profile.total_param_bytes / 1e6:.3f} MB",
          file=sys.stderr)
    if checks:
        err = checks["sum_vs_whole_rel_err"]
        print(f"paraplan profile: sum of layers vs whole step ({checks['whole_step_s'] * 1e3:.3f} ms): {err:+.1%}",
              file=sys.stderr)
        problem = profile_inconsistency(checks)
        if problem:  # results/summary.md says it too (`paraplan report`)
            print(f"paraplan profile: warning: {problem}", file=sys.stderr)
    print(f"paraplan profile: wrote {csv_path} and {mpath}", file=sys.stderr)

    metrics = {"fwd_s": fwd, "bwd_s": bwd, "param_bytes": profile.total_param_bytes,
               "activation_bytes": float(profile.activation_bytes.max()), "layers": profile.num_layers}
    metrics.update({k: v for k, v in checks.items()})
    for b, entry in meta.get("per_batch", {}).items():
        for key in ("fwd_s", "bwd_s", "whole_step_s", "sum_vs_whole_rel_err"):
            metrics[f"{key}__b{b}"] = entry[key]
    params = {k: v for k, v in meta.items() if k not in ("per_batch", *checks)}
    params.update({"batch_size": profile.batch_size, "output": str(csv_path)})
    from paraplan.cli.common import track

    track(args, RunLog(stage="profile", run_name=profile.name, params=params, metrics=metrics,
                       artifacts=artifacts))
    return 0
