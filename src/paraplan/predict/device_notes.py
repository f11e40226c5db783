"""What a prediction on a cluster leaves unpriced about its devices, as notes `predict` and
`plan` print beside their results: the wait for the slowest GPU where the device's
GPU-to-GPU spread is not measured (`variability.unpriced_spread_note`), and a power
limit other than the one its kernel ceilings were measured at
(`kernels.ceilings.power_limit_note`)."""

from __future__ import annotations

from paraplan.core.cluster import Cluster
from paraplan.kernels.ceilings import power_limit_note
from paraplan.predict.variability import unpriced_spread_note


def device_notes(cluster: Cluster, gpus: int) -> list[str]:
    """The notes for a job of `gpus` devices (the largest a table holds) on `cluster`."""
    device = cluster.device
    notes = [unpriced_spread_note(device, gpus, cluster.devices_per_node),
             power_limit_note(device.name, device.compute_name, device.power_limit_w)]
    return [note for note in notes if note]
