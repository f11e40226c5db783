"""`paraplan fit --kind kernels`: the device model's GEMM and attention ceilings fitted
to kernel CSVs (paraplan.kernels.fit), written as config/kernels/<device>.json
(paraplan.kernels.ceilings). Not a command of its own (the leading underscore)."""

from __future__ import annotations

import argparse
import hashlib
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from paraplan.cli.common import track
from paraplan.core import ConfigError, InputFileError


def _data(paths: list[Path], used: set[str]) -> list[dict[str, object]]:
    return [{"path": p.as_posix(), "sha256": hashlib.sha256(p.read_bytes()).hexdigest()} for p in paths
            if str(p) in used]


def _line(what: str, report) -> str:
    held = "n/a" if report.heldout_mape is None else f"{report.heldout_mape:.2%}"
    return (f"paraplan fit: {what}: {', '.join(f'{k}={v:.4g}' for k, v in report.params.items())}; "
            f"MAPE {report.mape:.2%}, held-out ({report.heldout_scheme}) {held}, {report.n_points} point(s)"
            + (f"; {report.note}" if report.note else ""))


def _fp8_section(args: argparse.Namespace, rows, device: str, cluster, gemm) -> dict[str, Any] | None:
    """The FP8 GEMM ceiling (the `fp8` section of the kernel file, docs/fp8.md) when the
    inputs hold FP8 GEMM rows of the device: fitted like the BF16 GEMMs against the FP8
    dense peak, with the BF16 fit's gemm_k_half and kernel latency as the values held
    when the FP8 shapes are too few to fit them."""
    from dataclasses import replace

    from paraplan.kernels.fit import DEFAULTS, fit_gemm, is_fp8_dtype
    from paraplan.predict.device_model import DeviceSpeed

    dtypes = sorted({str(r["dtype"]) for _, _, r in rows.gemm
                     if r["device"] == device and is_fp8_dtype(str(r["dtype"]))})
    if not dtypes or is_fp8_dtype(args.gemm_dtype):
        return None
    if len(dtypes) > 1:
        raise InputFileError(args.inputs[0], f"FP8 GEMM rows of {device!r} in {len(dtypes)} dtypes "
                             f"({', '.join(dtypes)}); expected one")
    speed = DeviceSpeed.of(cluster.device, "fp8")
    base = replace(DEFAULTS, gemm_k_half=gemm.params["gemm_k_half"], kernel_latency_s=gemm.params["kernel_latency_s"])
    fp8 = fit_gemm(rows.gemm_times(device, dtypes[0]), speed, base, min_flops=args.min_gemm_flops)
    print(_line(f"{device} GEMM ({dtypes[0]}, FP8 ceiling)", fp8), file=sys.stderr)
    used = {p for p, _, r in rows.gemm if r["device"] == device and r["dtype"] == dtypes[0]}
    return {"dtype": dtypes[0], "peak_flops": speed.peak_flops,
            "efficiency": {"gemm_efficiency": fp8.params["gemm_efficiency"], "gemm_k_half": fp8.params["gemm_k_half"]},
            "data": _data(args.inputs, used), **fp8.as_dict()}


def _attention_doc(args: argparse.Namespace, rows, device: str, cluster, gemm, kernel: str) -> dict[str, Any] | None:
    """The fit of one attention kernel's causal rows of the device at the head
    dimension asked (its causal backward derived where only the non-causal one is
    published, `paraplan.kernels.causal`); None when the inputs hold no rows of it."""
    from paraplan.kernels.causal import with_causal_backward
    from paraplan.kernels.fit import fit_attention
    from paraplan.predict.device_model import DeviceEfficiency, DeviceSpeed

    times, derived = with_causal_backward(rows.attention_times(device, source=kernel))
    if derived:
        print(f"paraplan fit: {derived} causal backward row(s) of {device} ({kernel}) derived from its "
              "non-causal backward and the forward's causal/non-causal ratio (paraplan.kernels.causal)",
              file=sys.stderr)
    if not len(times):
        print(f"paraplan fit: no attention rows of {device} ({kernel}): attention not fitted", file=sys.stderr)
        return None
    keep = times.causal & (times.head_dim == args.attention_head_dim)
    if not keep.any():
        raise InputFileError(args.inputs[0], f"no causal attention rows of {device!r} ({kernel}) "
                             f"with head_dim {args.attention_head_dim}")
    times = times.subset(keep)
    dtypes = sorted({str(r["dtype"]) for _, _, r in rows.attention if r["device"] == device})
    base = replace(DeviceEfficiency(), kernel_latency_s=gemm.params["kernel_latency_s"])
    attention = fit_attention(times, DeviceSpeed.of(cluster.device, str(dtypes[0])), base)
    print(_line(f"{device} attention ({kernel}, causal, head_dim {args.attention_head_dim})", attention),
          file=sys.stderr)
    used = {p for p, _, r in rows.attention if r["device"] == device and str(r["source"]).endswith(kernel)}
    doc = {"kernel": kernel, "causal": True, "head_dim": args.attention_head_dim, "dtype": str(dtypes[0]),
           "data": _data(args.inputs, used), **attention.as_dict()}
    if derived:
        doc["derived_causal_backward"] = derived
    return doc


def run_kernel_fit(args: argparse.Namespace) -> int:
    import numpy as np

    from paraplan.clusters import load_cluster
    from paraplan.files import check_outputs, write_json
    from paraplan.kernels.ceilings import KernelCeilings
    from paraplan.kernels.fit import fit_gemm
    from paraplan.kernels.results import read_kernel_csvs
    from paraplan.predict.device_model import DeviceSpeed
    from paraplan.track import RunLog

    for option, value in (("--plots", args.plots), ("--a2av-output", args.a2av_output)):
        if value is not None:
            raise ConfigError(option, "applies to collective fits only (--kind collectives)")
    if args.cluster is None:
        raise ConfigError("--cluster", "fit --kind kernels needs the device's cluster file (peaks, compute units)")
    check_outputs(files=[args.output])
    cluster = load_cluster(args.cluster)
    device = args.device or cluster.device.name
    rows = read_kernel_csvs(args.inputs)
    gemm_rows = [(p, r) for p, _, r in rows.gemm if r["device"] == device and r["dtype"] == args.gemm_dtype]
    if not gemm_rows:
        raise InputFileError(args.inputs[0], f"no GEMM rows of device {device!r} in {args.gemm_dtype} "
                             f"(devices in the inputs: {', '.join(rows.devices()) or 'none'})")
    speed = DeviceSpeed.of(cluster.device, args.gemm_dtype)
    gemm = fit_gemm(rows.gemm_times(device, args.gemm_dtype), speed, min_flops=args.min_gemm_flops)
    print(_line(f"{device} GEMM ({args.gemm_dtype})", gemm), file=sys.stderr)
    if gemm.small_shapes:
        print(f"paraplan fit: {gemm.small_shapes} GEMM(s) below {args.min_gemm_flops:g} FLOPs left out of the fit; "
              f"its error on them: MAPE {gemm.small_shape_mape:.2%}", file=sys.stderr)
    # held by a calibration: what the kernels determined (a parameter the fit kept at its
    # default, e.g. gemm_k_half from one published shape, stays the calibration's to fit)
    efficiency = {k: gemm.params[k] for k in gemm.fitted}
    gemm_doc = {"dtype": args.gemm_dtype, "peak_flops": speed.peak_flops, "compute_units": speed.compute_units,
                "min_flops": args.min_gemm_flops, "data": _data(args.inputs, {p for p, _ in gemm_rows}),
                **gemm.as_dict()}
    kernels = [k.strip() for k in args.attention_kernel.split(",") if k.strip()]
    if len(set(kernels)) != len(kernels) or not kernels:
        raise ConfigError("--attention-kernel", f"expected distinct kernel names, comma-separated; got "
                                                f"{args.attention_kernel!r}")
    docs = {k: _attention_doc(args, rows, device, cluster, gemm, k) for k in kernels}
    attention_doc = docs[kernels[0]]
    if attention_doc is not None:
        efficiency.update(attention_doc["params"])
    missing = [k for k in kernels[1:] if docs[k] is None]
    if missing:
        raise InputFileError(args.inputs[0], f"no attention rows of {device!r} ({missing[0]}) to fit")
    more = {k: doc for k in kernels[1:] if (doc := docs[k]) is not None}
    fp8_doc = _fp8_section(args, rows, device, cluster, gemm)
    doc = KernelCeilings(device, efficiency, cluster.name, gemm_doc, attention_doc, fp8_doc, more).to_dict()
    write_json(args.output, doc)
    print(f"paraplan fit: {device}: kernel ceilings -> {args.output}", file=sys.stderr)
    metrics = {"gemm_mape": gemm.mape, "gemm_points": float(gemm.n_points),
               **{f"param_{k}": float(v) for k, v in efficiency.items()}}
    if gemm.heldout_mape is not None:
        metrics["gemm_heldout_mape"] = gemm.heldout_mape
    if fp8_doc is not None:
        metrics["fp8_gemm_mape"] = float(fp8_doc["mape"])
        metrics["fp8_gemm_efficiency"] = float(fp8_doc["efficiency"]["gemm_efficiency"])
    for i, kernel in enumerate(kernels):
        kernel_doc, suffix = docs[kernel], "" if i == 0 else f"__{kernel}"
        if kernel_doc is None:
            continue
        metrics[f"attention_mape{suffix}"] = float(kernel_doc["mape"])
        if kernel_doc["heldout_mape"] is not None:
            metrics[f"attention_heldout_mape{suffix}"] = float(kernel_doc["heldout_mape"])
    track(args, RunLog(stage="kernels", run_name=f"fit:{device}",
                       params={"kind": "kernels", "device": device, "cluster": cluster.name,
                               "inputs": [str(p) for p in args.inputs], "gemm_dtype": args.gemm_dtype,
                               "min_gemm_flops": args.min_gemm_flops, "attention_kernel": args.attention_kernel,
                               "attention_head_dim": args.attention_head_dim},
                       metrics={k: float(v) for k, v in metrics.items() if np.isfinite(v)},
                       artifacts=[args.output]))
    return 0
