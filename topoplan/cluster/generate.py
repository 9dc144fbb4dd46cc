"""Cluster YAML for the big fabrics people plan: rail-optimised and oversubscribed fat trees.

Both write cluster YAML v1 text (``topoplan topo generate``), so a generated cluster is a
file like any other. Defaults follow the DGX SuperPOD reference design (8 GPUs per box,
one 200 Gbit/s NIC per GPU, NVSwitch at 300 GB/s per GPU each way).

- :func:`rail_optimized`: NIC k of every box on rail k. A rail is ``leaves_per_rail``
  leaf switches of ``boxes_per_leaf`` boxes each; every leaf has one uplink to each
  spine, as fast as its downlinks divided by ``spines`` times ``oversubscription``.
- :func:`fat_tree`: every NIC of a box on the same leaf (boxes ``per_leaf`` to a leaf),
  leaves joined by spines with an ``oversubscription``:1 ratio of down to up bandwidth.
"""

from __future__ import annotations

from ..errors import TopoplanError
from ..units import parse_bandwidth, plural

__all__ = ["rail_optimized", "fat_tree", "bandwidth_text"]


def _check(**values: float) -> None:
    for name, value in values.items():
        if value <= 0:
            raise TopoplanError(f"generate: {name} must be positive, got {value}")


def bandwidth_text(bytes_per_s: float) -> str:
    """``2.5e10`` -> ``"25 GB/s"``, to 12 significant digits (no rounding to 3)."""
    return f"{bytes_per_s / 1e9:.12g} GB/s"


def _box(gpus: int, nvlink: str, nics: list[str]) -> list[str]:
    return [f"    gpus: {gpus}", f"    fabric: {{bandwidth: {nvlink}, latency: 0.5 us}}",
            "    nics:", *nics]


def rail_optimized(boxes: int, gpus: int = 8, *, boxes_per_leaf: int = 32, spines: int = 4,
                   nic: str = "200 Gbit/s", nvlink: str = "300 GB/s",
                   oversubscription: float = 1.0, name: str | None = None) -> str:
    """Cluster YAML of ``boxes`` x ``gpus`` GPUs on ``gpus`` rails (see the module notes)."""
    _check(boxes=boxes, gpus=gpus, boxes_per_leaf=boxes_per_leaf, spines=spines,
           oversubscription=oversubscription)
    leaves = -(-boxes // boxes_per_leaf)
    up = parse_bandwidth(nic) * min(boxes, boxes_per_leaf) / spines / oversubscription
    lines = [f"name: {name or f'rail-{boxes * gpus}'}",
             f"# {plural(boxes, 'box')} x {plural(gpus, 'GPU')}, {plural(gpus, 'rail')} of "
             f"{plural(leaves, 'leaf', 'leaves')} (up to {plural(boxes_per_leaf, 'box')} each), "
             f"{plural(spines, 'spine')}, {oversubscription:g}:1",
             "switches:"]
    lines += [f"  - {{name: 'r{k}l{{i}}', count: {leaves}}}" for k in range(gpus)]
    lines += [f"  - {{name: 'spine{{i}}', count: {spines}}}", "boxes:",
              f"  - name: 'node{{i}}'", f"    count: {boxes}"]
    lines += _box(gpus, nvlink, [
        f"      - {{switch: 'r{k}l{{i//{boxes_per_leaf}}}', bandwidth: {nic}, latency: 1 us, "
        f"gpus: [{k}]}}" for k in range(gpus)])
    lines.append("links:")
    lines += [f"  - {{a: 'r{k}l{{i//{spines}}}', b: 'spine{{i%{spines}}}', "
              f"count: {leaves * spines}, bandwidth: {bandwidth_text(up)}, latency: 0.5 us}}"
              for k in range(gpus)]
    return "\n".join(lines) + "\n"


def fat_tree(boxes: int, gpus: int = 8, *, boxes_per_leaf: int = 8, spines: int = 8,
             nic: str = "200 Gbit/s", nvlink: str = "300 GB/s", oversubscription: float = 2.0,
             name: str | None = None) -> str:
    """Cluster YAML of ``boxes`` x ``gpus`` GPUs, a box's NICs on one leaf, leaves joined
    by ``spines`` spines at ``oversubscription``:1 (see the module notes)."""
    _check(boxes=boxes, gpus=gpus, boxes_per_leaf=boxes_per_leaf, spines=spines,
           oversubscription=oversubscription)
    leaves = -(-boxes // boxes_per_leaf)
    down = parse_bandwidth(nic) * gpus * min(boxes, boxes_per_leaf)
    up = down / spines / oversubscription
    lines = [f"name: {name or f'fat-tree-{boxes * gpus}'}",
             f"# {plural(boxes, 'box')} x {plural(gpus, 'GPU')}, "
             f"{plural(leaves, 'leaf', 'leaves')} (up to {plural(boxes_per_leaf, 'box')} each), "
             f"{plural(spines, 'spine')}, {oversubscription:g}:1",
             "switches:", f"  - {{name: 'leaf{{i}}', count: {leaves}}}",
             f"  - {{name: 'spine{{i}}', count: {spines}}}", "boxes:",
             f"  - name: 'node{{i}}'", f"    count: {boxes}"]
    lines += _box(gpus, nvlink, [
        f"      - {{switch: 'leaf{{i//{boxes_per_leaf}}}', bandwidth: {nic}, latency: 1 us, "
        f"gpus: [{k}]}}" for k in range(gpus)])
    lines += ["links:",
              f"  - {{a: 'leaf{{i//{spines}}}', b: 'spine{{i%{spines}}}', "
              f"count: {leaves * spines}, bandwidth: {bandwidth_text(up)}, latency: 0.5 us}}"]
    return "\n".join(lines) + "\n"
