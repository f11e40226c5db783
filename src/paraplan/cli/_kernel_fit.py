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


HELD_NOTE = ("timed after running each shape back to back (paraplan bench --hold-s): at the clock the device holds "
             "at its power limit, as in a training step; no sustained factor applied")


def _held(sources: set[str]) -> bool:
    """Whether the rows of one fit were timed held at the power limit (`bench --hold-s`),
    so that no sustained factor applies (KernelRows.held_first leaves a group one kind)."""
    from paraplan.kernels.results import is_held

    return any(is_held(source) for source in sources)


def _fp8_section(args: argparse.Namespace, rows, sustained_rows, device: str, cluster,
                 gemm) -> dict[str, Any] | None:
    """The FP8 GEMM ceiling (the `fp8` section of the kernel file, docs/fp8.md) when the
    inputs hold FP8 GEMM rows of the device: fitted like the BF16 GEMMs against the FP8
    dense peak, with the BF16 fit's gemm_k_half and kernel latency as the values held
    when the FP8 shapes are too few to fit them; its `gemm_efficiency` times the FP8
    sustained factor where the inputs hold one (burst rows). Rows timed both with and
    without fast accumulation are fitted as Transformer Engine runs them
    (results.transformer_engine_fp8_mix). The smallest GEMM fitted lasts as long as the
    BF16 fit's smallest: --min-gemm-flops times the FP8 over the BF16 peak (the
    threshold stands for a duration, the power controller's clock swings)."""
    from dataclasses import replace

    from paraplan.kernels.fit import DEFAULTS, fit_gemm, is_fp8_dtype
    from paraplan.kernels.results import transformer_engine_fp8_mix
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
    times, mix = rows.gemm_times(device, dtypes[0]), None
    fast, split = (rows.gemm_times(device, dtypes[0], fast_accum=f) for f in (True, False))
    if len(fast) and len(split):
        times = transformer_engine_fp8_mix(fast, split)
        if not len(times):
            raise InputFileError(args.inputs[0], f"FP8 GEMM rows of {device!r} with and without fast accumulation "
                                 "share no shape; expected the same shapes measured both ways")
        mix = (f"Transformer Engine's FP8 recipes: the forward GEMM fast-accumulated, dgrad and wgrad split; each of "
               f"{len(times)} shapes measured both ways timed as (t_fast + 2 t_split) / 3")
        print(f"paraplan fit: {device} FP8 GEMMs: {mix}", file=sys.stderr)
    min_flops = args.min_gemm_flops * speed.peak_flops / DeviceSpeed.of(cluster.device, args.gemm_dtype).peak_flops
    fp8 = fit_gemm(times, speed, base, min_flops=min_flops,
                   held=() if args.gemm_latency_s is None else ("kernel_latency_s",))
    print(_line(f"{device} GEMM ({dtypes[0]}, FP8 ceiling)", fp8), file=sys.stderr)
    if fp8.small_shapes:
        print(f"paraplan fit: {fp8.small_shapes} FP8 GEMM(s) below {min_flops:g} FLOPs left out of the fit; its "
              f"error on them: MAPE {fp8.small_shape_mape:.2%}", file=sys.stderr)
    used = {p for p, _, r in rows.gemm if r["device"] == device and r["dtype"] == dtypes[0]}
    held = _held({str(r["source"]) for _, _, r in rows.gemm if r["device"] == device and r["dtype"] == dtypes[0]})
    sustained = None if held else _sustained(args, sustained_rows, device, dtypes[0])
    factor = 1.0 if sustained is None else float(sustained["factor"])
    doc = {"dtype": dtypes[0], "peak_flops": speed.peak_flops, "min_flops": min_flops,
           "efficiency": {"gemm_efficiency": fp8.params["gemm_efficiency"] * factor,
                          "gemm_k_half": fp8.params["gemm_k_half"]},
           "data": _data(args.inputs, used), **fp8.as_dict()}
    if sustained is not None:
        doc["sustained"] = sustained
    if held:
        doc["held"] = HELD_NOTE
    if mix is not None:
        doc["accumulation"] = mix
    return doc


def _sustained(args: argparse.Namespace, sustained_rows, device: str, dtype: str,
               what: str = "GEMM") -> dict[str, Any] | None:
    """The sustained factor (paraplan.kernels.sustained) of the device's GEMMs in
    `dtype`, from the device's own rows, else those of --sustained-from, as the kernel
    file's `sustained` section of its `what` ceilings (GEMM, or attention: tensor-core
    bound kernels run at the same power-limited clock); None, said on stderr, when the
    inputs hold no such rows."""
    from paraplan.kernels.sustained import sustained_factor

    source = device if args.sustained_from is None or sustained_factor(sustained_rows, device, dtype) else \
        args.sustained_from
    found = sustained_factor(sustained_rows, source, dtype)
    if found is None:
        if sustained_rows:
            print(f"paraplan fit: no sustained-GEMM rows of {source} in {dtype}: its {dtype} {what} ceilings are the "
                  "burst fit's", file=sys.stderr)
        return None
    print(f"paraplan fit: {device} {dtype} {what} ceilings sustained at {found.factor:.4f} of the burst fit "
          f"({len(found.rows)} row(s) of {source} at {found.rows[0].power_limit_w:g} W, sustained/burst "
          f"{min(r.ratio for r in found.rows):.4f}-{max(r.ratio for r in found.rows):.4f})", file=sys.stderr)
    return found.as_dict(_data(args.inputs, {r.path for r in found.rows}))


def _attention_doc(args: argparse.Namespace, rows, device: str, cluster, gemm, kernel: str,
                   head_dim: int, sustained: dict[str, Any] | None) -> dict[str, Any] | None:
    """The fit of one attention kernel's causal rows of the device at head dimension
    `head_dim` (its causal backward derived where only the non-causal one is
    published, `paraplan.kernels.causal`); None when the inputs hold no rows of it.
    With `sustained` (the device's sustained factor in the attention dtype), the doc's
    `efficiency` holds the fit's two efficiencies times it (what a training step runs
    at), `params` stay the burst fit's (its errors are against burst data); rows timed
    held at the power limit take no factor."""
    from paraplan.kernels.causal import with_causal_backward
    from paraplan.kernels.fit import fit_attention
    from paraplan.predict.device_model import DeviceEfficiency, DeviceSpeed

    times = rows.attention_times(device, source=kernel)
    if not len(times):
        print(f"paraplan fit: no attention rows of {device} ({kernel}): attention not fitted", file=sys.stderr)
        return None
    times, derived = with_causal_backward(times.subset(times.head_dim == head_dim))
    if derived:
        print(f"paraplan fit: {derived} causal backward row(s) of {device} ({kernel}, head_dim {head_dim}) derived "
              "from its non-causal backward and the forward's causal/non-causal ratio (paraplan.kernels.causal)",
              file=sys.stderr)
    keep = times.causal
    if not keep.any():
        dims = sorted({int(d) for d in rows.attention_times(device, source=kernel).head_dim})
        raise ConfigError("--attention-head-dim", f"no causal attention rows of {device!r} ({kernel}) with head_dim "
                          f"{head_dim} in the inputs (head_dim there: {', '.join(map(str, dims))})")
    times = times.subset(keep)
    dtypes = sorted({str(r["dtype"]) for _, _, r in rows.attention if r["device"] == device})
    base = replace(DeviceEfficiency(), kernel_latency_s=gemm.params["kernel_latency_s"])
    attention = fit_attention(times, DeviceSpeed.of(cluster.device, str(dtypes[0])), base)
    print(_line(f"{device} attention ({kernel}, causal, head_dim {head_dim})", attention),
          file=sys.stderr)
    mine = [(p, r) for p, _, r in rows.attention if r["device"] == device and str(r["source"]).endswith(kernel)
            and int(r["head_dim"]) == head_dim]
    used = {p for p, _ in mine}
    held = _held({str(r["source"]) for _, r in mine})
    if held:
        print(f"paraplan fit: {device} attention ({kernel}, head_dim {head_dim}): rows timed held at the power "
              "limit, no sustained factor", file=sys.stderr)
    doc = {"kernel": kernel, "causal": True, "head_dim": head_dim, "dtype": str(dtypes[0]),
           "data": _data(args.inputs, used), **attention.as_dict()}
    if derived:
        doc["derived_causal_backward"] = derived
    if held:
        doc["held"] = HELD_NOTE
    elif sustained is not None:
        factor = float(sustained["factor"])
        doc["efficiency"] = {k: v * factor if k.endswith("_efficiency") else v
                             for k, v in attention.params.items()}
        doc["sustained"] = sustained
    return doc


# 16-bit float attention rows take the BF16 GEMMs' sustained factor: FP16 and BF16 run at
# the same dense tensor-core rate (one peak in the cluster file), so the power-limited
# clock that sets the factor is the same for both (the published attention figures are FP16)
_SUSTAINED_DTYPE = {"float16": "bfloat16"}


def _attention_sustained(args: argparse.Namespace, rows, sustained_rows, device: str) -> dict[str, Any] | None:
    """The sustained factor of the device's attention kernels: its GEMMs' in the
    attention rows' dtype (FP16 rows: BF16's, `_SUSTAINED_DTYPE`), with why it applies
    (docs/kernels.md, "Sustained at the power limit": a fused attention pass at
    training lengths is tensor-core bound, its throughput follows the SM clock the power
    limit settles, as a GEMM's does)."""
    dtypes = sorted({str(r["dtype"]) for _, _, r in rows.attention if r["device"] == device})
    if not dtypes or not sustained_rows:
        return None
    dtype = _SUSTAINED_DTYPE.get(dtypes[0], dtypes[0])
    found = _sustained(args, sustained_rows, device, dtype, what=f"attention ({dtypes[0]} rows)")
    if found is None:
        return None
    return {**found, "why": "a fused attention pass at training sequence lengths is tensor-core bound: its "
            "throughput follows the SM clock, which a training step's GEMMs hold at the power limit below the "
            "boost clock of the burst measurements it was fitted on; the GEMMs' sustained/burst ratio of the same "
            "die and dtype prices that clock (docs/kernels.md, Sustained at the power limit)"}


def _kernels_present(rows, device: str) -> str:
    """The attention kernels (the end of the rows' `source`) of `device` in the inputs."""
    names = sorted({str(r["source"]).rsplit(":", 1)[-1] for _, _, r in rows.attention if r["device"] == device})
    return ", ".join(names) or "none"


def _head_dims(text: str) -> list[int]:
    """`--attention-head-dim`: head dimensions, comma-separated, distinct, the first the main fit's."""
    try:
        dims = [int(d) for d in str(text).split(",") if d.strip()]
    except ValueError:
        dims = []
    if not dims or len(set(dims)) != len(dims) or min(dims) < 1:
        raise ConfigError("--attention-head-dim", f"expected distinct positive integers, comma-separated; got {text!r}")
    return dims


def run_kernel_fit(args: argparse.Namespace) -> int:
    from dataclasses import replace

    import numpy as np

    from paraplan.clusters import load_cluster
    from paraplan.files import check_outputs, write_json
    from paraplan.kernels.ceilings import KernelCeilings, head_dim_kernel
    from paraplan.kernels.fit import DEFAULTS, GEMM_BOUNDS, fit_gemm
    from paraplan.kernels.results import read_kernel_csvs
    from paraplan.kernels.sustained import is_sustained_csv, read_sustained_csvs
    from paraplan.predict.device_model import DeviceSpeed
    from paraplan.track import RunLog

    for option, value in (("--plots", args.plots), ("--a2av-output", args.a2av_output)):
        if value is not None:
            raise ConfigError(option, "applies to collective fits only (--kind collectives)")
    if args.cluster is None:
        raise ConfigError("--cluster", "fit --kind kernels needs the device's cluster file (peaks, compute units)")
    kernels = [k.strip() for k in args.attention_kernel.split(",")]
    if len(set(kernels)) != len(kernels) or not all(kernels):
        raise ConfigError("--attention-kernel", f"expected distinct kernel names, comma-separated; got "
                                                f"{args.attention_kernel!r}")
    head_dims = _head_dims(args.attention_head_dim)
    check_outputs(files=[args.output])
    cluster = load_cluster(args.cluster)
    device = args.device or cluster.device.name
    sustained_paths = [p for p in args.inputs if is_sustained_csv(p)]
    sustained_rows = read_sustained_csvs(sustained_paths)
    rows, left_out = read_kernel_csvs([p for p in args.inputs if p not in sustained_paths]).held_first()
    if left_out:
        print(f"paraplan fit: {left_out} burst-timed row(s) left out where the same device, kernel and dtype (and "
              "head_dim) have rows timed held at the power limit (bench --hold-s)", file=sys.stderr)
    if args.sustained_from is not None and not any(r.device == args.sustained_from for r in sustained_rows):
        raise ConfigError("--sustained-from", f"no sustained-GEMM rows of {args.sustained_from!r} in the inputs "
                          f"(devices: {', '.join(sorted({r.device for r in sustained_rows})) or 'none'})")
    gemm_rows = [(p, r) for p, _, r in rows.gemm if r["device"] == device and r["dtype"] == args.gemm_dtype]
    if not gemm_rows:
        raise InputFileError(args.inputs[0], f"no GEMM rows of device {device!r} in {args.gemm_dtype} "
                             f"(devices in the inputs: {', '.join(rows.devices()) or 'none'})")
    speed = DeviceSpeed.of(cluster.device, args.gemm_dtype)
    if args.gemm_latency_s is not None and not 0 <= args.gemm_latency_s <= GEMM_BOUNDS["kernel_latency_s"][1]:
        raise ConfigError("--gemm-latency-s", f"expected seconds in [0, {GEMM_BOUNDS['kernel_latency_s'][1]:g}], "
                          f"got {args.gemm_latency_s:g}")
    held_params = () if args.gemm_latency_s is None else ("kernel_latency_s",)
    base = DEFAULTS if args.gemm_latency_s is None else replace(DEFAULTS, kernel_latency_s=args.gemm_latency_s)
    gemm = fit_gemm(rows.gemm_times(device, args.gemm_dtype), speed, base, min_flops=args.min_gemm_flops,
                    held=held_params)
    print(_line(f"{device} GEMM ({args.gemm_dtype})", gemm), file=sys.stderr)
    if gemm.small_shapes:
        print(f"paraplan fit: {gemm.small_shapes} GEMM(s) below {args.min_gemm_flops:g} FLOPs left out of the fit; "
              f"its error on them: MAPE {gemm.small_shape_mape:.2%}", file=sys.stderr)
    # held by a calibration: what the kernels determined (a parameter the fit kept at its
    # default, e.g. gemm_k_half from one published shape, stays the calibration's to fit)
    efficiency = {k: gemm.params[k] for k in (*gemm.fitted, *held_params)}
    gemm_doc = {"dtype": args.gemm_dtype, "peak_flops": speed.peak_flops, "compute_units": speed.compute_units,
                "min_flops": args.min_gemm_flops, "data": _data(args.inputs, {p for p, _ in gemm_rows}),
                **gemm.as_dict()}
    # the burst fit's ceiling held at the power limit: `params` stay the burst fit's (its
    # errors are against burst data), `efficiency` holds what a training step sustains
    held = _held({str(r["source"]) for _, r in gemm_rows})
    sustained = None if held else _sustained(args, sustained_rows, device, args.gemm_dtype)
    if sustained is not None:
        efficiency["gemm_efficiency"] = gemm.params["gemm_efficiency"] * float(sustained["factor"])
        gemm_doc["sustained"] = sustained
    if held:
        gemm_doc["held"] = HELD_NOTE
    attention_sustained = _attention_sustained(args, rows, sustained_rows, device)
    docs = {k: _attention_doc(args, rows, device, cluster, gemm, k, head_dims[0], attention_sustained)
            for k in kernels}
    attention_doc = docs[kernels[0]]
    if attention_doc is not None:
        efficiency.update(attention_doc.get("efficiency", attention_doc["params"]))
    # the first kernel may be absent when the inputs hold no attention rows of the device
    # (a GEMM-only fit); a kernel named beside others that were measured is a mistake
    present = _kernels_present(rows, device)
    missing = [k for k in kernels[0 if present != "none" else 1:] if docs[k] is None]
    if missing:
        raise ConfigError("--attention-kernel", f"no attention rows of {device!r} ({missing[0]}) in the inputs to "
                                                f"fit; expected one of the kernels there: {present}")
    more = {k: doc for k in kernels[1:] if (doc := docs[k]) is not None}
    if attention_doc is not None:  # each kernel again at every further head dimension asked
        for d in head_dims[1:]:
            more.update({head_dim_kernel(k, d): doc for k in kernels
                         if (doc := _attention_doc(args, rows, device, cluster, gemm, k, d,
                                                   attention_sustained)) is not None})
    fp8_doc = _fp8_section(args, rows, sustained_rows, device, cluster, gemm)
    # the power limit the cluster file states for its device, where that is the device fitted
    power = cluster.device.power_limit_w if device == cluster.device.name else None
    doc = KernelCeilings(device, efficiency, cluster.name, gemm_doc, attention_doc, fp8_doc, more, power).to_dict()
    write_json(args.output, doc)
    print(f"paraplan fit: {device}: kernel ceilings -> {args.output}", file=sys.stderr)
    metrics = {"gemm_mape": gemm.mape, "gemm_points": float(gemm.n_points),
               **{f"param_{k}": float(v) for k, v in efficiency.items()}}
    if gemm.heldout_mape is not None:
        metrics["gemm_heldout_mape"] = gemm.heldout_mape
    if sustained is not None:
        metrics["gemm_sustained_factor"] = float(sustained["factor"])
    if attention_sustained is not None:
        metrics["attention_sustained_factor"] = float(attention_sustained["factor"])
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
                               "gemm_latency_s": args.gemm_latency_s,
                               "attention_head_dim": args.attention_head_dim,
                               "sustained_from": args.sustained_from or ""},
                       metrics={k: float(v) for k, v in metrics.items() if np.isfinite(v)},
                       artifacts=[args.output]))
    return 0
