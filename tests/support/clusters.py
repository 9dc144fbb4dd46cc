"""Clusters for the tests: the shipped ``topologies/*.yaml`` and small ones built by hand.

``load_topology(name)`` loads a shipped file once per session (clusters are frozen, so
tests can share them); ``tests/conftest.py`` offers it as the ``topology`` fixture.
"""

from __future__ import annotations

import functools
from pathlib import Path

from topoplan.cluster import Cluster, load_cluster, loads_cluster

ROOT = Path(__file__).resolve().parents[2]
TOPOLOGIES = ROOT / "topologies"
SHIPPED = tuple(sorted(p.stem for p in TOPOLOGIES.glob("*.yaml")))  # names, no suffix


def topology_path(name: str) -> Path:
    """``topologies/<name>.yaml``."""
    return TOPOLOGIES / f"{name}.yaml"


def topology_text(name: str) -> str:
    """The YAML text of a shipped topology (for tests that edit it before loading)."""
    return topology_path(name).read_text(encoding="utf-8")


@functools.cache
def load_topology(name: str) -> Cluster:
    """A shipped topology by name (``"ddl_two_switch"``), loaded once."""
    return load_cluster(topology_path(name))


def switch_cluster(n: int, bandwidth: str = "10 GB/s", latency: str = "1 us") -> Cluster:
    """``n`` one-GPU boxes on one switch."""
    return loads_cluster(f"""
name: switch-{n}
switches: [sw0]
boxes:
  - {{name: "b{{i}}", count: {n}, gpus: 1,
      nics: [{{switch: sw0, bandwidth: {bandwidth}, latency: {latency}}}]}}
""")


def leaf_spine_cluster(nboxes: int, *, boxes_per_leaf: int = 8, spines: int = 4,
                       gpus: int = 8, uplink: float | None = None) -> Cluster:
    """``topologies/leaf_spine_1024.yaml`` scaled to ``nboxes`` boxes (same box, NICs,
    2:1 oversubscribed leaves with 8 GPUs a box; at least two leaves); ``uplink``: GB/s
    of each leaf-spine link instead."""
    per_leaf = min(boxes_per_leaf, max(1, nboxes // 2))
    leaves = -(-nboxes // per_leaf)
    nics = "\n".join(
        f'      - {{switch: "leaf{{i//{per_leaf}}}", bandwidth: 200 Gbit/s, latency: 1 us, '
        f'gpus: [{j}]}}' for j in range(gpus))
    return loads_cluster(f"""
name: leaf-spine-{nboxes * gpus}
switches:
  - {{name: "leaf{{i}}", count: {leaves}}}
  - {{name: "spine{{i}}", count: {spines}}}
boxes:
  - name: "node{{i}}"
    count: {nboxes}
    gpus: {gpus}
    fabric: {{bandwidth: 300 GB/s, latency: 0.5 us}}
    nics:
{nics}
links:
  - {{a: "leaf{{i//{spines}}}", b: "spine{{i%{spines}}}", count: {leaves * spines},
     bandwidth: {uplink or 25 * per_leaf} GB/s, latency: 0.5 us}}
""")


def flat_cluster_yaml(n: int, gpus_per_box: int = 1) -> str:
    """A cluster of ``n`` ranks: boxes of ``gpus_per_box`` GPUs on one switch."""
    boxes = n // gpus_per_box
    fabric = "\n    fabric: {bandwidth: 300 GB/s, latency: 1 us}" if gpus_per_box > 1 else ""
    nics = "\n    nics: [{switch: sw0, bandwidth: 100 Gbit/s, latency: 2 us}]" if boxes > 1 else ""
    return (f"name: flat-{boxes}x{gpus_per_box}\nswitches: [{{name: sw0}}]\nboxes:\n"
            f"  - name: \"box{{i}}\"\n    count: {boxes}\n    gpus: {gpus_per_box}{fabric}{nics}\n")
