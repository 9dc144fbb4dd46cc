"""Small clusters of n ranks, written as YAML (one switch, boxes with a fabric, NVLink-only
boxes, mixed box sizes, two switches, leaf-spine), and random ones for property tests:
the shapes every planner, bound and executor test runs over."""

from __future__ import annotations

import itertools
import math

from hypothesis import strategies as st

from topoplan.cluster import Cluster, loads_cluster

def _nic(switch: str) -> str:
    return f"[{{switch: '{switch}', bandwidth: 100 Gbit/s, latency: 2 us}}]"


def single_switch(n: int) -> str:
    """n one-GPU boxes on one switch."""
    return (f"name: single-switch-{n}\nswitches: [{{name: sw}}]\n"
            f"boxes:\n  - {{name: 'h{{i}}', count: {n}, gpus: 1, nics: {_nic('sw')}}}\n")


def _boxes(sizes: list[int], switch_of, fabric: bool = True) -> str:
    lines = []
    for b, g in enumerate(sizes):
        entry = f"  - {{name: b{b}, gpus: {g}"
        if g > 1 and fabric:
            entry += ", fabric: {bandwidth: 200 GB/s, latency: 1 us}"
        if len(sizes) > 1:
            entry += f", nics: {_nic(switch_of(b))}"
        lines.append(entry + "}")
    return "boxes:\n" + "\n".join(lines) + "\n"


def fabric_boxes(n: int) -> str:
    """Boxes of 4 GPUs with an NVSwitch-like fabric on one switch (last box smaller)."""
    sizes = [4] * (n // 4) + ([n % 4] if n % 4 else [])
    return f"name: fabric4-{n}\nswitches: [{{name: sw}}]\n" + _boxes(sizes, lambda b: "sw")


def mixed_boxes(n: int) -> str:
    """Boxes of 3, 1, 2, 3, 1, 2, ... GPUs (as many as n allows) on one switch."""
    sizes, left, k = [], n, 0
    while left:
        g = min([3, 1, 2][k % 3], left)
        sizes.append(g)
        left -= g
        k += 1
    return f"name: mixed-{n}\nswitches: [{{name: sw}}]\n" + _boxes(sizes, lambda b: "sw")


def two_switches(n: int) -> str:
    """Boxes of 2 GPUs alternating between two switches joined by a narrow link, so
    file (rank) order crosses the narrow link at every box."""
    sizes = [2] * (n // 2) + ([1] if n % 2 else [])
    return (f"name: two-switch-{n}\nswitches: [{{name: s0}}, {{name: s1}}]\n"
            + _boxes(sizes, lambda b: f"s{b % 2}")
            + "links: [{a: s0, b: s1, bandwidth: 10 GB/s, latency: 1 us}]\n")


def leaf_spine(n: int) -> str:
    """One-GPU boxes spread over 3 leaves, each leaf joined to 2 spines."""
    return (f"name: leaf-spine-{n}\nswitches:\n  - {{name: 'leaf{{i}}', count: 3}}\n"
            "  - {name: 'spine{i}', count: 2}\n"
            f"boxes:\n  - {{name: 'h{{i}}', count: {n}, gpus: 1, nics: {_nic('leaf{i%3}')}}}\n"
            "links:\n  - {a: 'leaf{i//2}', b: 'spine{i%2}', count: 6, bandwidth: 50 GB/s}\n")


def nvlink_box(n: int) -> str:
    """One box of n GPUs with only direct links: a ring 0-1-...-(n-1)-0 plus chords
    0-(n/2) at double width, and no fabric."""
    links = []
    if n > 1:
        pairs = {(j, (j + 1) % n) for j in range(n)} if n > 2 else {(0, 1)}
        for a, b in sorted({tuple(sorted(p)) for p in pairs}):
            links.append(f"{{a: {a}, b: {b}, bandwidth: 25 GB/s}}")
        if n >= 4:
            links.append(f"{{a: 0, b: {n // 2}, bandwidth: 25 GB/s, count: 2}}")
    body = f"  - {{name: box, gpus: {n}" + (f", gpu_links: [{', '.join(links)}]" if links else "")
    return f"name: nvlink-{n}\nboxes:\n{body}}}\n"


CLUSTERS = {"single-switch": single_switch, "fabric4": fabric_boxes, "mixed": mixed_boxes,
            "two-switch": two_switches, "leaf-spine": leaf_spine, "nvlink-box": nvlink_box}


def cluster(kind: str, n: int) -> Cluster:
    return loads_cluster(CLUSTERS[kind](n), f"<{kind}-{n}>")




def brute_force_ratio(cluster) -> float:
    """max over every node set S (some, not all GPUs) of |S ∩ GPUs| / B_out(S)."""
    graph = cluster.graph
    nodes = list(graph.nodes)
    gpus = {cluster.gpu_node(r) for r in range(cluster.nranks)}
    best = 0.0
    for bits in itertools.product((False, True), repeat=len(nodes)):
        inside = {v for v, b in zip(nodes, bits) if b}
        g = len(inside & gpus)
        if g == 0 or g == len(gpus):
            continue
        out = math.fsum(d["bandwidth"] for u, v, d in graph.edges(data=True)
                        if u in inside and v not in inside)
        best = max(best, g / out)
    return best


@st.composite
def small_clusters(draw):
    nswitch = draw(st.integers(1, 2))
    bw = st.sampled_from([1, 2, 3, 5, 8, 13])
    lines = ["name: random", "switches: [" + ", ".join(f"s{k}" for k in range(nswitch)) + "]",
             "boxes:"]
    nboxes = draw(st.integers(2, 3))
    nodes = nswitch
    for b in range(nboxes):
        gpus = draw(st.integers(1, 2))
        sw = draw(st.integers(0, nswitch - 1))
        line = f"  - {{name: b{b}, gpus: {gpus}, nics: [{{switch: s{sw}, bandwidth: {draw(bw)}}}]"
        if gpus == 2:
            line += f", gpu_links: [{{a: 0, b: 1, bandwidth: {draw(bw)}}}]"
        lines.append(line + "}")
        nodes += gpus + 1
    if nswitch == 2:
        lines.append(f"links: [{{a: s0, b: s1, bandwidth: {draw(bw)}}}]")
    return loads_cluster("\n".join(lines) + "\n")


@st.composite
def uneven_clusters(draw):
    """1-3 switches in a chain, boxes of 1-3 GPUs with a fabric or a chain of NVLinks and
    NICs of uneven bandwidth: cuts with more than half of the GPUs behind them."""
    nswitch = draw(st.integers(1, 3))
    bw = st.sampled_from(["5 GB/s", "10 GB/s", "25 GB/s", "100 GB/s"])
    lines = ["name: uneven", "switches: [" + ", ".join(f"s{k}" for k in range(nswitch)) + "]",
             "boxes:"]
    for b in range(draw(st.integers(2, 4))):
        gpus = draw(st.integers(1, 3))
        inside = (f"fabric: {{bandwidth: {draw(bw)}}}, " if draw(st.booleans())
                  else "gpu_links: [" + ", ".join(f"{{a: {j}, b: {(j + 1) % gpus}, "
                                                  f"bandwidth: {draw(bw)}}}"
                                                  for j in range(gpus - 1)) + "], ")
        if gpus == 1:
            inside = ""
        lines.append(f"  - {{name: b{b}, gpus: {gpus}, {inside}nics: [{{switch: "
                     f"s{draw(st.integers(0, nswitch - 1))}, bandwidth: {draw(bw)}, "
                     f"latency: 1 us}}]}}")
    if nswitch > 1:
        lines.append("links:")
        for k in range(1, nswitch):
            lines.append(f"  - {{a: s{k - 1}, b: s{k}, bandwidth: {draw(bw)}}}")
    return loads_cluster("\n".join(lines) + "\n")
