"""Reading a cluster YAML file (docs/CLUSTER.md) into a :class:`Cluster`.

Every mistake a user can make is reported as :class:`ClusterSpecError` naming
``file:line: key`` and what to do; nothing is half-loaded.
"""

from __future__ import annotations

import numbers
import os
import re
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable

import networkx as nx

from .._yaml import LineDict, LineList, load_yaml
from ..errors import ClusterSpecError, PortWarning, RangeWarning, SpecWarning, UnitWarning
from ..units import (BANDWIDTH_RANGE, LATENCY_RANGE, bare_number_note,
                     parse_bandwidth, parse_latency)
from .model import FABRIC_KINDS, GPU_MODELS, Box, Cluster, Fabric, GpuLink, Nic, SwitchLink

__all__ = ["load_cluster", "loads_cluster", "flat_cluster", "MAX_COUNT", "MAX_GPUS",
           "BANDWIDTH_LIMITS", "BANDWIDTH_PLAUSIBLE", "MAX_LATENCY", "PLAUSIBLE_LATENCY",
           "MAX_RANKS", "rank_limit", "check_cluster", "SUMMED_BANDWIDTH_LIMIT"]

MAX_COUNT = 100_000  # instances one `count` may stamp out
MAX_GPUS = 4096  # GPUs one box may hold (more is a typo that would exhaust memory)

# The ranges of docs/CLUSTER.md ("Ranges"), and why: topoplan/units.py
# (BANDWIDTH_RANGE, LATENCY_RANGE). Outside the plausible range, inside the limits, a value
# is a RangeWarning: no cluster has it.
#: Bytes/s: 1 bit/s to 1000 TB/s.
BANDWIDTH_LIMITS = BANDWIDTH_RANGE.limits
#: Bytes/s: 1 Mbit/s to 100 TB/s.
BANDWIDTH_PLAUSIBLE = BANDWIDTH_RANGE.plausible
#: Seconds: a latency above it is an error (11.6 days)...
MAX_LATENCY = LATENCY_RANGE.limits[1]
#: ... and above this one a warning: no link takes a second to deliver a byte.
PLAUSIBLE_LATENCY = LATENCY_RANGE.plausible[1]
#: GPUs a cluster may hold: the planners' memory grows with them (about 3 GB at 8192
#: GPUs, docs/RESULTS.md); a quarter of it draws a warning. Switches may number a quarter
#: of it and links (switch links, NICs and GPU links, each instance) 16 times it.
#: The environment variable TOPOPLAN_MAX_RANKS raises (or lowers) it.
MAX_RANKS = 32_768
_RANGES = {"bandwidth": BANDWIDTH_RANGE, "latency": LATENCY_RANGE}
_DEFAULT_UNIT = {"bandwidth": " GB/s", "latency": " us"}  # of a bare number


def rank_limit() -> int:
    """The most GPUs a cluster file may hold: ``TOPOPLAN_MAX_RANKS`` if set, else
    :data:`MAX_RANKS`.

    Raises
    ------
    ClusterSpecError
        For a ``TOPOPLAN_MAX_RANKS`` that is not a whole number >= 1.
    """
    text = os.environ.get("TOPOPLAN_MAX_RANKS", "").strip()
    if not text:
        return MAX_RANKS
    if not text.isdigit() or int(text) < 1:
        raise ClusterSpecError(f"TOPOPLAN_MAX_RANKS must be a whole number >= 1, got {text!r}")
    return int(text)


_TEMPLATE = re.compile(r"\{([^{}]*)\}")
_TEMPLATE_EXPR = re.compile(r"^\s*i\s*(?:(//|%|\+|-|\*)\s*(\d+)\s*)?$")


class _Reader:
    """Walks the parsed YAML, checking types and naming ``file:line: key`` on errors."""

    def __init__(self, file: str) -> None:
        self.file = file
        self.warned: set[tuple[int, str]] = set()  # a box with count: N is read N times
        self.max_ranks = rank_limit()
        self.totals: dict[str, int] = {}  # GPUs, switches, links (instances) so far
        self.totals_warned: set[str] = set()

    def warn(self, warning: type[SpecWarning], line: int, key: str,
             message: str) -> None:
        """Issue ``warning`` once per ``line`` and ``key`` (a box with ``count: N`` is read
        N times)."""
        if (line, key) in self.warned:
            return
        self.warned.add((line, key))
        warnings.warn(warning(message, file=self.file, line=line, key=key), stacklevel=3)

    def add(self, what: str, amount: int, line: int, key: str) -> None:
        """Count ``amount`` more ``what`` (``"GPUs"``, ``"switches"`` or ``"links"``):
        refuse the cluster past its limit (:func:`rank_limit`: GPUs; a quarter of it:
        switches; 16 times it: links), warn once past a quarter of that."""
        limit = {"GPUs": self.max_ranks, "switches": max(1, self.max_ranks // 4),
                 "links": 16 * self.max_ranks}[what]
        total = self.totals[what] = self.totals.get(what, 0) + amount
        if total > limit:
            raise self.fail(line, key, f"{total} {what} in all, more than {limit}, the most "
                            "topoplan plans for (its memory grows with them); is a count "
                            "wrong? TOPOPLAN_MAX_RANKS raises the limit (docs/CLUSTER.md, "
                            "'Ranges')")
        if total > limit // 4 and what not in self.totals_warned:
            self.totals_warned.add(what)
            self.warn(RangeWarning, line, key,
                      f"{total} {what} in all, more than {limit // 4}, the most of the "
                      "plausible range: planning takes minutes and GBs (8192 GPUs: 30 s, "
                      "3 GB, docs/RESULTS.md); is a count wrong?")

    def fail(self, line: int | None, key: str, message: str) -> ClusterSpecError:
        return ClusterSpecError(message, file=self.file, line=line, key=key)

    def mapping(self, value: Any, line: int, key: str) -> LineDict:
        if not isinstance(value, LineDict):
            raise self.fail(line, key, f"expected a mapping, got {_describe(value)}")
        return value

    def sequence(self, value: Any, line: int, key: str) -> LineList:
        if not isinstance(value, LineList):
            raise self.fail(line, key, f"expected a list, got {_describe(value)}")
        return value

    def keys(self, mapping: LineDict, path: str, required: Iterable[str],
             optional: Iterable[str]) -> None:
        required, allowed = list(required), set(required) | set(optional)
        for key in mapping:
            if key not in allowed:
                hint = _closest(key, allowed)
                raise self.fail(mapping.line_of(key), _join(path, key),
                                f"unknown key{hint}; allowed: {', '.join(sorted(allowed))}")
        for key in required:
            if key not in mapping:
                raise self.fail(mapping.line, _join(path, key), "missing required key")

    def string(self, mapping: LineDict, key: str, path: str) -> str:
        value = mapping[key]
        if not isinstance(value, str) or not value:
            raise self.fail(mapping.line_of(key), _join(path, key),
                            f"expected a non-empty string, got {_describe(value)}")
        return value

    def integer(self, mapping: LineDict, key: str, path: str, minimum: int) -> int:
        value = mapping[key]
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(mapping.line_of(key), _join(path, key),
                            f"expected an integer, got {_describe(value)}")
        if value < minimum:
            raise self.fail(mapping.line_of(key), _join(path, key),
                            f"must be >= {minimum}, got {value}")
        return value

    def quantity(self, mapping: LineDict, key: str, path: str,
                 parse: Callable[[object], float], positive: bool) -> float:
        value = mapping[key]
        line, where = mapping.line_of(key), _join(path, key)
        try:
            number = parse(value)
        except ValueError as exc:
            raise self.fail(line, where, str(exc)) from None
        if positive and not number > 0:
            raise self.fail(line, where, f"must be > 0, got {_show(value)}")
        if not positive and number < 0:
            raise self.fail(line, where, f"must be >= 0, got {_show(value)}")
        what = "latency" if parse is parse_latency else "bandwidth"
        shown = _show(value) + (_DEFAULT_UNIT[what] if _bare(value) else "")
        error, warning = _RANGES[what].problems(number, shown)
        if error is not None:
            raise self.fail(line, where, error)
        # A bare number has a default unit, which may not be the one meant: never silent.
        note = bare_number_note(value, what)
        if note is not None:
            self.warn(UnitWarning, line, where, note)
        if warning is not None:
            self.warn(RangeWarning, line, where, warning)
        return number

    def boolean(self, mapping: LineDict, key: str, path: str) -> bool:
        value = mapping[key]
        if not isinstance(value, bool):
            raise self.fail(mapping.line_of(key), _join(path, key),
                            f"expected true or false, got {_describe(value)}")
        return value

    def choice(self, mapping: LineDict, key: str, path: str, choices: Iterable[str]) -> str:
        """A string that must be one of ``choices`` (case-insensitive, returned as listed)."""
        value = mapping[key]
        choices = list(choices)
        if isinstance(value, str):
            for choice in choices:
                if value.strip().lower() == choice.lower():
                    return choice
        hint = _closest(str(value), choices) if isinstance(value, str) else f" {value!r}"
        raise self.fail(mapping.line_of(key), _join(path, key),
                        f"unknown value{hint}; use one of {', '.join(choices)}")

    def bandwidth(self, mapping: LineDict, path: str) -> float:
        return self.quantity(mapping, "bandwidth", path, parse_bandwidth, positive=True)

    def latency(self, mapping: LineDict, path: str) -> float:
        if "latency" not in mapping:
            return 0.0
        return self.quantity(mapping, "latency", path, parse_latency, positive=False)

    def count(self, mapping: LineDict, path: str) -> int:
        if "count" not in mapping:
            return 1
        count = self.integer(mapping, "count", path, 1)
        if count > MAX_COUNT:  # a typo like 10000000 would otherwise hang the loader
            raise self.fail(mapping.line_of("count"), _join(path, "count"),
                            f"must be <= {MAX_COUNT}, got {count}")
        return count

    def expand(self, template: str, i: int, line: int, key: str) -> str:
        """Fill ``{i}``, ``{i//K}``, ``{i%K}`` (also ``+ - *``) with instance ``i``."""

        def substitute(match: re.Match) -> str:
            expr = _TEMPLATE_EXPR.match(match.group(1))
            if expr is None:
                raise self.fail(line, key, f"bad template {{{match.group(1)}}} in {template!r}; "
                                "use {i}, {i//K}, {i%K}, {i+K}, {i-K} or {i*K}")
            op, operand = expr.groups()
            if op is None:
                return str(i)
            k = int(operand)
            if op in ("//", "%") and k == 0:
                raise self.fail(line, key, f"bad template {{{match.group(1)}}} in {template!r}: "
                                "division by zero")
            return str({"//": lambda: i // k, "%": lambda: i % k, "+": lambda: i + k,
                        "-": lambda: i - k, "*": lambda: i * k}[op]())

        result = _TEMPLATE.sub(substitute, template)
        if "{" in result or "}" in result:
            raise self.fail(line, key, f"bad template {template!r}: unbalanced braces")
        return result


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _describe(value: Any) -> str:
    if value is None:
        return "nothing"
    names: dict[type, str] = {LineDict: "mapping", LineList: "list"}
    kind = names.get(type(value), type(value).__name__)
    return kind if isinstance(value, (LineDict, LineList)) else f"{kind} {value!r}"


def _bare(value: Any) -> bool:
    """A number written without a unit (read as GB/s or us)."""
    return bare_number_note(value, "latency") is not None


def _show(value: Any) -> str:
    return value if isinstance(value, str) else f"{value:g}" if isinstance(value, float) else str(value)


def _closest(key: str, allowed: Iterable[str]) -> str:
    import difflib
    match = difflib.get_close_matches(key, list(allowed), n=1)
    return f" {key!r} (did you mean {match[0]!r}?)" if match else f" {key!r}"


def as_cluster(cluster: Cluster | str | os.PathLike, who: str = "topoplan") -> Cluster:
    """``cluster`` itself, or the cluster YAML file it names (:func:`load_cluster`), so the
    API takes a path where the CLI does.

    Raises
    ------
    ClusterSpecError
        A file that does not load (naming ``file:line: key``), a :class:`Cluster` with a
        bandwidth or latency beyond what topoplan computes with (:func:`check_cluster`),
        or something that is neither a :class:`Cluster` nor a path.
    """
    if isinstance(cluster, Cluster):
        check_cluster(cluster, who)
        return cluster
    if isinstance(cluster, (str, os.PathLike)):
        return load_cluster(cluster)
    raise ClusterSpecError(f"{who}: expected a Cluster (topoplan.load_cluster) or a cluster "
                           f"YAML path, got {type(cluster).__name__}")


#: Bytes/s a link of the model or an edge of the graph may carry at most: parallel links
#: add up (``count: N`` of them, N <= MAX_COUNT), so a summed link may exceed what one
#: link of the file may say.
SUMMED_BANDWIDTH_LIMIT = BANDWIDTH_LIMITS[1] * MAX_COUNT


def check_cluster(cluster: Cluster, who: str = "topoplan") -> None:
    """Refuse a cluster built in code (or a graph edited after it was built) whose
    bandwidths or latencies are beyond what topoplan computes with: NaN, infinite,
    not positive (a bandwidth) or negative (a latency), or outside the ranges a cluster
    file may say (docs/CLUSTER.md, "Ranges"). A loaded file was checked line by line;
    a :class:`Cluster` made through the API was not, and such a value makes a planner or
    the simulator divide by zero, carry NaN or wait forever.

    Raises
    ------
    ClusterSpecError
        Naming the cluster, the field (``boxes[0].nics[1].bandwidth``) or graph edge, the
        link and the value, and the range.
    """
    def bad(key: str, link: str, what: str, value: object, limit: float) -> ClusterSpecError:
        shown = f"{value:g}" if number(value) else repr(value)
        unit = " bytes/s" if what == "bandwidth" else " s"
        top = (_RANGES[what].limits_text if limit == BANDWIDTH_LIMITS[1] or what == "latency"
               else f"1 bit/s to {limit:g} bytes/s (parallel links summed)")
        return ClusterSpecError(f"{shown}{unit} on link {link} is out of range: a {what} "
                                f"must be a number, {top}", key=f"{who}: cluster "
                                f"{cluster.name!r}: {key}")

    def number(value: object) -> bool:
        return isinstance(value, numbers.Real) and not isinstance(value, bool)  # numpy's too

    def check(key: str, link: str, bandwidth: Any, latency: Any,
              limit: float = BANDWIDTH_LIMITS[1]) -> None:
        if not number(bandwidth) or not BANDWIDTH_LIMITS[0] <= bandwidth <= limit:  # NaN too
            raise bad(f"{key}.bandwidth", link, "bandwidth", bandwidth, limit)
        if not number(latency) or not 0 <= latency <= MAX_LATENCY:
            raise bad(f"{key}.latency", link, "latency", latency, limit)

    for b, box in enumerate(cluster.boxes):
        if box.fabric is not None:
            check(f"boxes[{b}].fabric", f"{box.name}/gpu* <-> {box.fabric_node}",
                  box.fabric.bandwidth, box.fabric.latency)
        for n, link in enumerate(box.gpu_links):
            check(f"boxes[{b}].gpu_links[{n}]",
                  f"{box.gpu_node(link.a)} <-> {box.gpu_node(link.b)}", link.bandwidth,
                  link.latency, SUMMED_BANDWIDTH_LIMIT)
        for k, nic in enumerate(box.nics):
            check(f"boxes[{b}].nics[{k}]", f"{box.nic_node(k)} <-> {nic.switch}",
                  nic.bandwidth, nic.latency)
            plugin = nic.plugin_latency
            if not number(plugin) or not 0 <= plugin <= MAX_LATENCY:
                raise bad(f"boxes[{b}].nics[{k}].plugin_latency",
                          f"{box.nic_node(k)} <-> {nic.switch}", "latency", plugin, 0.0)
    for n, switch_link in enumerate(cluster.links):
        check(f"links[{n}]", f"{switch_link.a} <-> {switch_link.b}", switch_link.bandwidth,
              switch_link.latency, SUMMED_BANDWIDTH_LIMIT)
    graph = cluster.__dict__.get("graph")  # built (cached) and perhaps edited since
    if graph is not None:
        for u, v, data in graph.edges(data=True):
            check(f"graph[{u!r}][{v!r}]", f"{u} -> {v}", data.get("bandwidth"),
                  data.get("latency"), SUMMED_BANDWIDTH_LIMIT)


def load_cluster(path: str | os.PathLike) -> Cluster:
    """Load and validate a cluster YAML file.

    Parameters
    ----------
    path : str or Path
        The YAML file (format: docs/CLUSTER.md).

    Returns
    -------
    Cluster

    Raises
    ------
    ClusterSpecError
        For any mistake, naming ``file:line: key``; also when the file cannot be read.
    """
    from .._yaml import read_text
    return loads_cluster(read_text(path, "cluster file"), file=str(path))


def loads_cluster(text: str, file: str = "<string>") -> Cluster:
    """Like :func:`load_cluster`, from YAML text; ``file`` is used in error messages."""
    reader = _Reader(file)
    doc = load_yaml(text, file)
    if doc is None:
        raise reader.fail(1, "", "empty file; a cluster file is a mapping with name and boxes")
    if not isinstance(doc, LineDict):
        raise reader.fail(getattr(doc, "line", 1), "",
                          f"a cluster file is a mapping with name and boxes, got {_describe(doc)}")
    if doc.get("format") == "topoplan-schedule":
        raise reader.fail(1, "", "looks like a schedule JSON (a plan); a cluster YAML file is "
                                 "wanted here, such as topologies/dgx_a100_x4.yaml")
    reader.keys(doc, "", ("name", "boxes"), ("version", "switches", "links", "description"))
    name = reader.string(doc, "name", "")
    if "version" in doc and doc["version"] != 1:
        raise reader.fail(doc.line_of("version"), "version",
                          f"unsupported version {doc['version']!r}; this topoplan reads version 1")

    switches, switch_lines, sharp = _read_switches(reader, doc)
    boxes, box_lines = _read_boxes(reader, doc, switches)
    links = _read_links(reader, doc, switches)

    clash = set(switches) & {box.name for box in boxes}
    if clash:
        dup = sorted(clash)[0]
        raise reader.fail(box_lines[dup], "boxes", f"duplicate name {dup!r}: a switch has it too")
    cluster = Cluster(name=name, boxes=tuple(boxes), switches=tuple(switches), links=tuple(links),
                      source=file, sharp=frozenset(sharp))
    _check_connected(reader, cluster, doc, box_lines, switch_lines)
    return cluster


def flat_cluster(nranks: int) -> Cluster:
    """``nranks`` one-GPU boxes on one switch (100 Gbit/s, 2 us NICs): the cluster that
    ``topoplan bench --algorithm`` plans for when no cluster file is given."""
    nics = "\n    nics: [{switch: sw0, bandwidth: 100 Gbit/s, latency: 2 us}]" if nranks > 1 else ""
    return loads_cluster(f"name: flat-{nranks}\nswitches: [{{name: sw0}}]\nboxes:\n"
                         f"  - name: \"node{{i}}\"\n    count: {nranks}\n    gpus: 1{nics}\n",
                         f"<flat cluster of {nranks} ranks>")


def _read_switches(reader: _Reader, doc: LineDict) -> tuple[list[str], dict[str, int], set[str]]:
    names: list[str] = []
    lines: dict[str, int] = {}
    sharp: set[str] = set()
    if "switches" not in doc:
        return names, lines, sharp
    items = reader.sequence(doc["switches"], doc.line_of("switches"), "switches")
    for s, item in enumerate(items):
        path = f"switches[{s}]"
        if isinstance(item, str):  # shorthand: "- sw0"
            item_map = LineDict(name=item)
            item_map.line, item_map.key_lines = items.line_of(s), {}
            item = item_map
        entry = reader.mapping(item, items.line_of(s), path)
        reader.keys(entry, path, ("name",), ("count", "sharp"))
        template = reader.string(entry, "name", path)
        count = reader.count(entry, path)
        reader.add("switches", count, entry.line_of("count"), _join(path, "count"))
        reduces = "sharp" in entry and reader.boolean(entry, "sharp", path)
        for i in range(count):
            switch = reader.expand(template, i, entry.line_of("name"), _join(path, "name"))
            _check_name(reader, switch, entry.line_of("name"), _join(path, "name"))
            if switch in lines:
                raise reader.fail(entry.line_of("name"), _join(path, "name"),
                                  f"duplicate switch name {switch!r} (first on line {lines[switch]})"
                                  + ("; add {i} to the name" if count > 1 and "{" not in template else ""))
            lines[switch] = entry.line_of("name")
            names.append(switch)
            if reduces:
                sharp.add(switch)
    return names, lines, sharp


def _check_name(reader: _Reader, name: str, line: int, key: str) -> None:
    if "/" in name or not name.strip():
        raise reader.fail(line, key, f"bad name {name!r}: names are non-empty and contain no '/'")


def _read_boxes(reader: _Reader, doc: LineDict,
                switches: list[str]) -> tuple[list[Box], dict[str, int]]:
    items = reader.sequence(doc["boxes"], doc.line_of("boxes"), "boxes")
    if not items:
        raise reader.fail(doc.line_of("boxes"), "boxes", "must list at least one box")
    entries = []
    total_boxes = 0
    for b, item in enumerate(items):
        path = f"boxes[{b}]"
        entry = reader.mapping(item, items.line_of(b), path)
        reader.keys(entry, path, ("name", "gpus"), ("count", "fabric", "gpu_links", "nics", "gpu"))
        count = reader.count(entry, path)
        gpus = reader.integer(entry, "gpus", path, 1)
        if gpus > MAX_GPUS:
            raise reader.fail(entry.line_of("gpus"), _join(path, "gpus"),
                              f"must be <= {MAX_GPUS}, got {gpus}")
        reader.add("GPUs", count * gpus, entry.line_of("count" if count > 1 else "gpus"),
                   _join(path, "count" if count > 1 else "gpus"))
        entries.append((path, entry, count))
        total_boxes += count

    boxes: list[Box] = []
    lines: dict[str, int] = {}
    known = set(switches)
    rank = 0
    for path, entry, count in entries:
        template = reader.string(entry, "name", path)
        gpus = reader.integer(entry, "gpus", path, 1)
        model = reader.choice(entry, "gpu", path, GPU_MODELS) if "gpu" in entry else None
        fabric = None
        if "fabric" in entry:
            fabric = _read_fabric(reader, entry, path, model)
        gpu_links = _read_gpu_links(reader, entry, path, gpus)
        if gpus > 1 and fabric is None:
            graph = nx.Graph()
            graph.add_nodes_from(range(gpus))
            graph.add_edges_from((link.a, link.b) for link in gpu_links)
            if not nx.is_connected(graph):
                parts = sorted(sorted(c) for c in nx.connected_components(graph))
                raise reader.fail(entry.line_of("gpu_links") if gpu_links else entry.line, path,
                                  f"the {gpus} GPUs are not connected (groups {parts}); "
                                  "add a fabric or gpu_links joining them")
        if "nics" not in entry:
            if total_boxes > 1:
                raise reader.fail(entry.line, _join(path, "nics"),
                                  "missing: a cluster with more than one box needs NICs in every box")
            nic_items: list = []
            nics_list = None
        else:
            nics_list = reader.sequence(entry["nics"], entry.line_of("nics"), _join(path, "nics"))
            nic_items = list(nics_list)
            if not nic_items and total_boxes > 1:
                raise reader.fail(entry.line_of("nics"), _join(path, "nics"),
                                  "empty: a cluster with more than one box needs NICs in every box")
        reader.add("links", count * (len(nic_items) + len(gpu_links)), entry.line, path)
        for i in range(count):
            name = reader.expand(template, i, entry.line_of("name"), _join(path, "name"))
            _check_name(reader, name, entry.line_of("name"), _join(path, "name"))
            if name in lines:
                hint = "; add {i} to the name" if count > 1 and "{" not in template else ""
                raise reader.fail(entry.line_of("name"), _join(path, "name"),
                                  f"duplicate box name {name!r} (first on line {lines[name]}){hint}")
            lines[name] = entry.line_of("name")
            nics = tuple(_read_nic(reader, nics_list, k, f"{path}.nics[{k}]", gpus, i, known)
                         for k in range(len(nic_items)))
            if i == 0:
                _check_ports(reader, nics, gpus, entry.line_of("nics") if nics else entry.line,
                             _join(path, "nics"))
            boxes.append(Box(name=name, gpus=gpus, first_rank=rank, fabric=fabric,
                             gpu_links=gpu_links, nics=nics, template=template, gpu=model))
            rank += gpus
    return boxes, lines


#: GPU models whose NVSwitch can reduce and multicast (NVLink SHARP, third-generation
#: NVSwitch and later; NVIDIA's Hopper and Blackwell architecture whitepapers).
NVLS_MODELS = ("H100", "H200", "B200")


def _read_fabric(reader: _Reader, entry: LineDict, path: str, model: str | None) -> Fabric:
    where = _join(path, "fabric")
    fab = reader.mapping(entry["fabric"], entry.line_of("fabric"), where)
    reader.keys(fab, where, ("bandwidth",), ("latency", "nvls", "kind"))
    kind = reader.choice(fab, "kind", where, FABRIC_KINDS) if "kind" in fab else None
    nvls = "nvls" in fab and reader.boolean(fab, "nvls", where)
    if nvls and kind == "pcie":
        raise reader.fail(fab.line_of("nvls"), _join(where, "nvls"),
                          "NVLS is NVLink SHARP, a feature of NVSwitches: a PCIe fabric has none")
    if nvls and model is not None and model not in NVLS_MODELS:
        raise reader.fail(fab.line_of("nvls"), _join(where, "nvls"),
                          f"a {model} box has no NVLink SHARP (NVSwitch generation 3, in "
                          f"{', '.join(NVLS_MODELS)} systems); remove nvls or fix gpu")
    return Fabric(reader.bandwidth(fab, where), reader.latency(fab, where), nvls=nvls,
                  kind=kind)


def _read_gpu_links(reader: _Reader, entry: LineDict, path: str, gpus: int) -> tuple[GpuLink, ...]:
    if "gpu_links" not in entry:
        return ()
    items = reader.sequence(entry["gpu_links"], entry.line_of("gpu_links"), _join(path, "gpu_links"))
    merged: dict[tuple[int, int], GpuLink] = {}
    for n, item in enumerate(items):
        lpath = f"{path}.gpu_links[{n}]"
        link = reader.mapping(item, items.line_of(n), lpath)
        reader.keys(link, lpath, ("a", "b", "bandwidth"), ("latency", "count"))
        a = _gpu_index(reader, link, "a", lpath, gpus)
        b = _gpu_index(reader, link, "b", lpath, gpus)
        if a == b:
            raise reader.fail(link.line_of("b"), _join(lpath, "b"),
                              f"a link joins two different GPUs, got a = b = {a}")
        bandwidth = reader.bandwidth(link, lpath) * reader.count(link, lpath)
        latency = reader.latency(link, lpath)
        key = (min(a, b), max(a, b))
        if key in merged:  # parallel NVLinks add up
            old = merged[key]
            merged[key] = GpuLink(old.a, old.b, old.bandwidth + bandwidth, min(old.latency, latency))
        else:
            merged[key] = GpuLink(key[0], key[1], bandwidth, latency)
    return tuple(merged.values())


def _gpu_index(reader: _Reader, mapping: LineDict, key: str, path: str, gpus: int,
               value: Any = None, line: int | None = None, where: str | None = None) -> int:
    value = mapping[key] if value is None else value
    line = mapping.line_of(key) if line is None else line
    where = _join(path, key) if where is None else where
    if isinstance(value, bool) or not isinstance(value, int):
        raise reader.fail(line, where, f"expected a GPU index, got {_describe(value)}")
    if not 0 <= value < gpus:
        raise reader.fail(line, where, f"GPU index {value} out of range: the box has {gpus} GPUs "
                                       f"(0..{gpus - 1})")
    return value


def _check_ports(reader: _Reader, nics: tuple[Nic, ...], gpus: int, line: int,
                 where: str) -> None:
    """Warn (:class:`~topoplan.errors.PortWarning`) where a box lists more NICs than GPUs
    and two of them serve the same GPUs: most likely the ports of one card, which NCCL
    merges into one device (src/transport/net_ib/init.cc:69-70 and :198,
    ``NCCL_IB_MERGE_NICS``)."""
    if len(nics) <= gpus:
        return
    seen: dict[tuple[int, ...], int] = {}
    for k, nic in enumerate(nics):
        first = seen.setdefault(nic.gpus, k)
        if first == k:
            continue
        same = [j for j, other in enumerate(nics) if other.gpus == nic.gpus]
        total = sum(nics[j].bandwidth for j in same)
        gbit = f"{total * 8 / 1e9:g} Gbit/s"
        on = (f"on switch {nic.switch}" if nic.switch == nics[first].switch
              else f"(switches {nics[first].switch}, {nic.switch})")
        warnings.warn(PortWarning(
            f"{len(nics)} NICs for {gpus} GPUs: nics[{first}] and nics[{k}] serve the same "
            f"GPUs {list(nic.gpus)} {on}; if they are "
            f"the ports of one card, NCCL merges them (NCCL_IB_MERGE_NICS=1; aws-ofi-nccl "
            f"groups a GPU's EFA devices): write them as one NIC of {gbit}",
            file=reader.file, line=line, key=where), stacklevel=2)
        return


def _read_nic(reader: _Reader, items: LineList | None, k: int, path: str, gpus: int, i: int,
              switches: set[str]) -> Nic:
    assert items is not None
    nic = reader.mapping(items[k], items.line_of(k), path)
    reader.keys(nic, path, ("switch", "bandwidth"), ("latency", "gpus", "plugin_latency"))
    template = reader.string(nic, "switch", path)
    switch = reader.expand(template, i, nic.line_of("switch"), _join(path, "switch"))
    if switch not in switches:
        hint = _closest(switch, switches)
        known = ", ".join(sorted(switches)[:8]) or "none are declared"
        raise reader.fail(nic.line_of("switch"), _join(path, "switch"),
                          f"unknown switch{hint}" + (f" (from {template!r} with i={i})"
                                                     if template != switch else "")
                          + f"; switches: {known}")
    bandwidth = reader.bandwidth(nic, path)
    latency = reader.latency(nic, path)
    plugin_latency = (reader.quantity(nic, "plugin_latency", path, parse_latency, positive=False)
                      if "plugin_latency" in nic else 0.0)
    if "gpus" in nic:
        listed = reader.sequence(nic["gpus"], nic.line_of("gpus"), _join(path, "gpus"))
        if not listed:
            raise reader.fail(nic.line_of("gpus"), _join(path, "gpus"),
                              "empty: list the GPUs that use this NIC, or leave the key out")
        served = tuple(_gpu_index(reader, nic, "gpus", path, gpus, value=g,
                                  line=listed.line_of(n), where=f"{path}.gpus[{n}]")
                       for n, g in enumerate(listed))
        if len(set(served)) != len(served):
            raise reader.fail(nic.line_of("gpus"), _join(path, "gpus"), f"repeated GPU in {list(served)}")
    else:
        served = tuple(range(gpus))
    return Nic(switch=switch, bandwidth=bandwidth, latency=latency, gpus=served,
               plugin_latency=plugin_latency)


def _read_links(reader: _Reader, doc: LineDict, switches: list[str]) -> list[SwitchLink]:
    if "links" not in doc:
        return []
    items = reader.sequence(doc["links"], doc.line_of("links"), "links")
    known = set(switches)
    merged: dict[tuple[str, str], SwitchLink] = {}
    for n, item in enumerate(items):
        path = f"links[{n}]"
        link = reader.mapping(item, items.line_of(n), path)
        reader.keys(link, path, ("a", "b", "bandwidth"), ("latency", "count"))
        ta, tb = reader.string(link, "a", path), reader.string(link, "b", path)
        bandwidth, latency = reader.bandwidth(link, path), reader.latency(link, path)
        count = reader.count(link, path)
        reader.add("links", count, link.line_of("count"), _join(path, "count"))
        for i in range(count):
            ends = []
            for key, template in (("a", ta), ("b", tb)):
                name = reader.expand(template, i, link.line_of(key), _join(path, key))
                if name not in known:
                    hint = _closest(name, known)
                    raise reader.fail(link.line_of(key), _join(path, key),
                                      f"unknown switch{hint}" + (f" (from {template!r} with i={i})"
                                                                 if template != name else "")
                                      + "; links join switches declared under switches")
                ends.append(name)
            a, b = ends
            if a == b:
                raise reader.fail(link.line_of("b"), _join(path, "b"),
                                  f"a link joins two different switches, got {a!r} twice")
            key2 = (min(a, b), max(a, b))
            if key2 in merged:  # parallel links add up
                old = merged[key2]
                merged[key2] = SwitchLink(old.a, old.b, old.bandwidth + bandwidth,
                                          min(old.latency, latency))
            else:
                merged[key2] = SwitchLink(a, b, bandwidth, latency)
    return list(merged.values())


def _check_connected(reader: _Reader, cluster: Cluster, doc: LineDict, box_lines: dict[str, int],
                     switch_lines: dict[str, int]) -> None:
    """Every GPU must reach every other GPU over NICs and switches."""
    if len(cluster.boxes) < 2:
        return
    graph = cluster.graph.to_undirected(as_view=True)
    first = cluster.boxes[0]
    reach = nx.node_connected_component(graph, first.gpu_node(0))
    for box in cluster.boxes[1:]:
        if box.gpu_node(0) not in reach:
            switches_a = sorted({nic.switch for nic in first.nics})
            switches_b = sorted({nic.switch for nic in box.nics})
            raise reader.fail(box_lines[box.name], "boxes",
                              f"no network path between box {first.name!r} (switches {switches_a}) "
                              f"and box {box.name!r} (switches {switches_b}); add links between "
                              "their switches")

