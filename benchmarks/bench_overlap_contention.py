"""The occupancy model of a GEMM beside a collective (`paraplan.predict.overlap_contention`)
against published micro-benchmarks, and against Korthikanti et al. 2022 Table 4 beside the
single fitted share (docs/execution-model.md, "Overlap is not free").

1. Table 4 (data/published/korthikanti2022_table4.csv) with the a100-vtrain calibration on
   dgx-a100, NCCL's 24 CTAs for an 8-GPU NVSwitch ring (collective_ctas.csv): the backward
   with a free overlap, with the fitted share and with the occupancy model, the published
   one, and the RMS relative error of backward / forward (the fit's quantity) and of the
   backward itself.
2. Which CTA count would make the occupancy model match Table 4 (a diagnostic, used nowhere).
3. Micro-benchmarks (data/published/overlap/gemm_beside_collective.csv; nothing fitted, every
   row held out): each row's published GEMM slowdown, the occupancy model's where the row
   states tiles, SMs and CTAs, and the slowdown the fitted share implies (share = 1 - 1/s for
   a collective shorter than its GEMM: s = 1 / (1 - share)).

    python benchmarks/bench_overlap_contention.py
"""

from __future__ import annotations

import numpy as np

from paraplan.clusters import load_cluster
from paraplan.predict.calibration import load_calibration
from paraplan.predict.contention_fit import fit_contention
from paraplan.predict.overlap_contention import many_wave_slowdown, read_slowdowns, sm_slowdown
from paraplan.predict.overlap_table4 import occupancy_backward, ratio_errors, rms

NVSWITCH_RING_CTAS = 24  # collective_ctas.csv: A100 and H100, 8 GPUs, NCCL's ring


def micro_benchmarks(share: float) -> None:
    print("3. GEMM slowdown beside a collective (published micro-benchmarks, all held out)")
    print(f"   the fitted share {share:.3f} implies a GEMM slowdown of {1 / (1 - share):.2f}x")
    print(f"   {'source':<22} {'device':<22} {'statistic':<9} {'published':>9} {'occupancy':>10}")
    for row in read_slowdowns():
        if row.gemm_tiles and row.compute_units and row.collective_ctas:
            model = f"{float(sm_slowdown(np.array([row.gemm_tiles]), row.compute_units, row.collective_ctas)[0]):.2f}x"
        else:
            a100 = many_wave_slowdown(108, NVSWITCH_RING_CTAS)
            h100 = many_wave_slowdown(132, NVSWITCH_RING_CTAS)
            model = f"{h100:.2f}-{a100:.2f}x (many waves, 24 CTAs; 1-2x with quantisation)"
        print(f"   {row.source:<22} {row.device:<22} {row.statistic:<9} {row.gemm_slowdown:>8.2f}x {model:>10}")


def table4() -> float:
    cal = load_calibration("a100-vtrain")
    cluster = load_cluster("dgx-a100")
    comm = cal.comm_model(cluster)
    occ = occupancy_backward(cluster, comm, cal.efficiency, NVSWITCH_RING_CTAS)
    layer = occ.layer
    share = fit_contention(layer)
    print(f"1. Korthikanti et al. 2022 Table 4 (a100-vtrain, dgx-a100, {NVSWITCH_RING_CTAS} CTAs), backward in ms")
    print(f"   {'variant':<24} {'fwd model/pub':>13} {'free':>7} {'share':>7} {'occup.':>7} {'pub':>6}"
          f" {'occ. share':>10} {'HBM f<=':>7}")
    shared = layer.backward_s(share)
    for i, name in enumerate(layer.experiment):
        print(f"   {name:<24} {layer.forward_s[i] * 1e3:>6.2f}/{layer.measured_forward_s[i] * 1e3:<5.1f}"
              f" {layer.backward_free_s[i] * 1e3:>7.2f} {shared[i] * 1e3:>7.2f} {occ.backward_s[i] * 1e3:>7.2f}"
              f" {layer.measured_backward_s[i] * 1e3:>6.1f} {occ.share[i]:>10.3f} {occ.hbm_fraction[i]:>7.2f}")
    print(f"   {'model':<24} {'RMS err bwd/fwd':>16} {'RMS err bwd':>12}")
    for name, b in (("free overlap (share 0)", layer.backward_free_s), (f"fitted share {share:.3f}", shared),
                    ("occupancy (0 fitted)", occ.backward_s)):
        print(f"   {name:<24} {rms(ratio_errors(layer, b)):>15.1%} {rms(b / layer.measured_backward_s - 1):>12.1%}")
    print("\n2. CTAs the occupancy model would need to match Table 4 (diagnostic only)")
    errors = {ctas: rms(ratio_errors(layer, occupancy_backward(cluster, comm, cal.efficiency, ctas).backward_s))
              for ctas in (8, 16, 24, 32, 48, 64, 80, 96, 104)}
    print("   " + "  ".join(f"{c}: {e:.1%}" for c, e in errors.items()))
    return share


def main() -> None:
    share = table4()
    print()
    micro_benchmarks(share)


if __name__ == "__main__":
    main()
