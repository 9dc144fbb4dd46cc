"""Link faults on a live testbed: a link at a fraction of its bandwidth (``--degrade``).

A fault names a physical link of the cluster (:func:`topoplan.cluster.links.links`:
``A/nic0``, ``switch0-switch1``, ``h3/fabric``, ``dgx1/gpu0-gpu3``) and a factor. Every
veth pair that stands for one of the link's graph edges (:attr:`Veth.edges`; a folded
pair stands for several links in series and runs at the slowest) gets ``factor`` times
its layout rate, in both directions: its two ends' HTB trees are changed in place with
``tc class change`` (the link class ``1:1``, and every child class's rate and ceil, as
:func:`~topoplan.testbed.netns.shaping_commands` would build them at the new rate), one
``tc -batch`` per namespace; the queues, filters and latencies stay. Factor 1 restores the
layout's rates. A link the layout left unshaped (above
:data:`~topoplan.testbed.layout.MAX_SHAPED_RATE`) gets an HTB tree of its own at factor
times its modelled rate times the scale, and loses it again at factor 1; a factor that
leaves it above what this machine shapes is refused (the testbed could not slow it).

The factors in force live in the testbed's state file (``degrades``, next to the layout,
with the cluster's link table ``links`` that names are resolved against), so ``testbed
probe`` and ``bench`` check the network against the degraded model
(:func:`current_layout`), and a later ``testbed degrade STATE LINK=F`` knows what to
change. A delayed fault (``LINK=F@SECONDS``) is applied by :func:`start_timer`, a
detached process that waits inside one of the testbed's namespaces, so ``testbed down``
kills it with the testbed, and it exits without touching anything once the testbed is
gone; or, in a front-end that stays up (``bench``, ``run``), by :class:`Timers`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import math
import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from ..cluster import Cluster
from ..cluster.links import Degrade, Link, links, parse_degrade
from .layout import MAX_SHAPED_RATE, Layout, Veth, _pair_rate
from .netns import (TestbedError, _batch, crossing_pairs, namespace_exists, netem_available,
                    run, shaping_commands)

__all__ = ["link_table", "find_link", "veth_factors", "degraded_layout", "reshape_commands",
           "current_layout", "state_degrades", "apply_degrades", "htb_classes",
           "start_timer", "Timers", "describe"]


def link_table(cluster: Cluster) -> list[dict[str, Any]]:
    """The cluster's links as the state file keeps them: name, kind, bandwidth (bytes/s,
    unscaled) and directed edges as ``"u>v"`` strings."""
    return [{"name": link.name, "kind": link.kind, "bandwidth": link.bandwidth,
             "edges": [f"{u}>{v}" for u, v in link.edges]} for link in links(cluster)]


def _links(table: Sequence[Mapping[str, Any]]) -> list[Link]:
    return [Link(d["name"], d["kind"], tuple(tuple(e.split(">", 1)) for e in d["edges"]),
                 float(d["bandwidth"])) for d in table]  # type: ignore[misc]


def find_link(table: Sequence[Mapping[str, Any]], name: str, cluster: str = "the testbed"
              ) -> Link:
    """The link of a state file's ``table`` called ``name``, as
    :func:`topoplan.cluster.links.find_link` finds it in a cluster (a switch link in
    either order).

    Raises
    ------
    TestbedError
        No such link; the message names the closest ones.
    """
    import difflib
    text = name.strip()
    found = _links(table)
    for link in found:
        if link.name == text or (link.kind == "switch" and
                                 text == f"{link.edges[0][1]}-{link.edges[0][0]}"):
            return link
    names = [link.name for link in found]
    close = difflib.get_close_matches(text, names, n=3)
    hint = (f"did you mean {', '.join(close)}?" if close
            else f"it has {', '.join(names[:6])}{', ...' if len(names) > 6 else ''}")
    raise TestbedError(f"{cluster} has no link {text!r}: {hint}")


def veth_factors(layout: Layout, table: Sequence[Mapping[str, Any]],
                 factors: Mapping[str, float]) -> list[float]:
    """Each veth pair's factor: the smallest of the degraded links it stands for
    (links in series run at the slowest), 1 for the others."""
    by_edge = {e: d["name"] for d in table for e in d["edges"]}
    return [min((factors.get(by_edge.get(e, ""), 1.0) for e in v.edges), default=1.0)
            for v in layout.veths]


def _model_rate(veth: Veth, table: Sequence[Mapping[str, Any]], scale: float) -> float | None:
    """The rate the model gives ``veth`` (bytes/s, scaled), shaped or not: its slowest
    link (a folded pair's links have one rate)."""
    bandwidth = {e: float(d["bandwidth"]) for d in table for e in d["edges"]}
    rates = [bandwidth[e] for e in veth.edges if e in bandwidth]
    return min(rates) * scale if rates else veth.rate


def _rate(veth: Veth, factor: float, table: Sequence[Mapping[str, Any]],
          scale: float) -> float | None:
    """What ``veth`` is shaped to at ``factor`` (``None``: unshaped)."""
    if factor == 1.0:
        return veth.rate
    if veth.rate is not None:
        return veth.rate * factor
    model = _model_rate(veth, table, scale)
    if model is None or model * factor > MAX_SHAPED_RATE:
        return None
    return model * factor


def degraded_layout(layout: Layout, table: Sequence[Mapping[str, Any]],
                    factors: Mapping[str, float]) -> Layout:
    """``layout`` with the rates it has under ``factors`` (link name -> factor): what
    :mod:`~topoplan.testbed.probe` checks the network against.

    A veth pair's rate is its layout rate times :func:`veth_factors`; an unshaped one
    becomes shaped at its modelled rate times the factor. Every pair of ranks' rate
    alone (:attr:`PairRoute.rate`) follows. The result equals, rate for rate, the layout
    of ``degraded(cluster, factors)`` scaled alike, but keeps this layout's folding.
    """
    if not any(f != 1.0 for f in factors.values()):
        return layout
    veths = tuple(dataclasses.replace(v, rate=_rate(v, f, table, layout.scale))
                  for v, f in zip(layout.veths, veth_factors(layout, table, factors)))
    rate_of = {(v.ns_a, v.name_a): v.rate for v in veths} | {(v.ns_b, v.name_b): v.rate
                                                              for v in veths}
    pairs = tuple(dataclasses.replace(p, rate=_pair_rate(
        list(p.paths), rate_of)) for p in layout.pairs)
    return dataclasses.replace(layout, veths=veths, pairs=pairs)


def _check_shapeable(layout: Layout, table: Sequence[Mapping[str, Any]],
                     factors: Mapping[str, float]) -> None:
    by_edge = {e: d["name"] for d in table for e in d["edges"]}
    for v, f in zip(layout.veths, veth_factors(layout, table, factors)):
        if v.rate is not None or f == 1.0:
            continue
        model = _model_rate(v, table, layout.scale)
        if model is None or model * f > MAX_SHAPED_RATE:
            names = sorted({by_edge[e] for e in v.edges if e in by_edge})
            most = MAX_SHAPED_RATE / model if model else 0.0
            raise TestbedError(
                f"{' / '.join(names)} at x{f:g} is "
                f"{(model or 0) * f * 8 / 1e9:.1f} Gbit/s at this testbed's scale, above what "
                f"this machine shapes ({MAX_SHAPED_RATE * 8 / 1e9:.0f} Gbit/s): the testbed "
                f"cannot slow it. Use a factor of at most {most:.3g}, or build the testbed "
                "with a smaller --scale")


def reshape_commands(layout: Layout, table: Sequence[Mapping[str, Any]],
                     old: Mapping[str, float], new: Mapping[str, float], *,
                     netem: bool = False) -> dict[str, list[str]]:
    """``tc -batch`` lines, per namespace, that take the testbed from ``old`` factors to
    ``new`` (link name -> factor; missing: 1).

    Only veth ends whose rate changes get lines. A shaped end's HTB classes are changed
    in place (``class change``: the link class ``1:1`` and each child's rate and ceil, as
    :func:`~topoplan.testbed.netns.shaping_commands` builds them at the new rate; its
    queues, filters and netem delays stay). An end the layout left unshaped gets the
    whole tree (after removing the root qdisc it had: netem, or an earlier degrade's
    tree), and back at its layout rate, its netem delay alone or nothing.

    Parameters
    ----------
    layout : Layout
    table : sequence of dict
        The cluster's links (:func:`link_table`).
    old, new : mapping of str to float
    netem : bool
        Whether the kernel has netem (unshaped ends with a latency have it as root).

    Raises
    ------
    TestbedError
        An unshaped link that ``new`` leaves above what this machine can shape.
    """
    _check_shapeable(layout, table, new)
    crossing = crossing_pairs(layout)
    before = veth_factors(layout, table, old)
    after = veth_factors(layout, table, new)
    out: dict[str, list[str]] = {}
    for v, f0, f1 in zip(layout.veths, before, after):
        r0, r1 = (_rate(v, f, table, layout.scale) for f in (f0, f1))
        if r0 == r1:
            continue
        back = v.latency if v.latency_back is None else v.latency_back
        for ns, dev, latency in ((v.ns_a, v.name_a, v.latency), (v.ns_b, v.name_b, back)):
            pairs = crossing.get((ns, dev), [])
            lines = out.setdefault(ns, [])
            if v.rate is not None:  # shaped by the layout: change the classes in place
                lines += [line.replace("class add ", "class change ", 1)
                          for line in shaping_commands(dev, r1, latency, pairs=pairs)
                          if line.startswith("class add ")]
                continue
            delayed = netem and latency > 0
            if r0 is not None or delayed:  # a root qdisc to replace
                lines.append(f"qdisc del dev {dev} root")
            lines += shaping_commands(dev, r1, latency, pairs=pairs, netem=netem)
    return {ns: lines for ns, lines in out.items() if lines}


# ---- the state file --------------------------------------------------------------------

@contextlib.contextmanager
def _locked(state: Path) -> Iterator[None]:
    """Serialise read-modify-write of state files (timers and commands may race)."""
    fd = os.open(state.parent, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _read(state: Path) -> dict[str, Any]:
    try:
        return json.loads(state.read_text())
    except FileNotFoundError:
        raise TestbedError(f"{state}: no such testbed state file") from None
    except ValueError as exc:
        raise TestbedError(f"{state}: not a testbed state file ({exc})") from None


def _write(state: Path, data: dict[str, Any]) -> None:
    from .._util import atomic_write
    atomic_write(state, json.dumps(data, indent=1))


def state_degrades(state: str | Path) -> dict[str, float]:
    """The factors in force on the testbed of ``state`` (link name -> factor); empty for
    a healthy testbed or a state file of a version before faults."""
    return {k: float(v) for k, v in _read(Path(state)).get("degrades", {}).items()}


def current_layout(layout: Layout, state: str | Path | None) -> Layout:
    """``layout`` at the rates the state file's degrades give it (:func:`degraded_layout`);
    ``layout`` itself when there are none or no state file."""
    if state is None:
        return layout
    try:
        data = _read(Path(state))
    except TestbedError:
        return layout
    factors = data.get("degrades") or {}
    return degraded_layout(layout, data.get("links", []), factors) if factors else layout


def _table(data: dict[str, Any], state: Path) -> list[dict[str, Any]]:
    table = data.get("links")
    if not table:
        raise TestbedError(f"{state}: this testbed was built by a version without link faults "
                           "(no link table in its state file); build it again to degrade links")
    return table


def _resolve(data: dict[str, Any], state: Path, degrades: Sequence[Degrade | str] |
             Mapping[str, float]) -> dict[str, float]:
    """Link name (canonical) -> factor, checked against the state's link table."""
    if isinstance(degrades, Mapping):
        items = [Degrade(k, float(f)) for k, f in degrades.items()]
    else:
        items = [parse_degrade(d) if isinstance(d, str) else d for d in degrades]
    table = _table(data, state)
    out: dict[str, float] = {}
    for d in items:
        link = find_link(table, d.link, data.get("layout", {}).get("cluster", "the testbed"))
        if not (math.isfinite(d.factor) and 0 < d.factor <= 1):
            raise TestbedError(f"{link.describe()}: factor {d.factor:g} must be in (0, 1] "
                               "(1 restores the link)")
        out[link.name] = d.factor
    return out


def apply_degrades(state: str | Path, degrades: Sequence[Degrade | str] | Mapping[str, float]
                   ) -> dict[str, float]:
    """Set links of the live testbed of ``state`` to factors of their bandwidth, now.

    Parameters
    ----------
    state : path
        The testbed's state file (``testbed up`` prints it; :attr:`Testbed.state`).
    degrades : sequence of Degrade or ``"LINK=F"``, or mapping of link name to factor
        Factor 1 restores a link; links not named keep their factor. A delay
        (``@SECONDS``) is ignored here: :func:`start_timer` and :class:`Timers` wait.

    Returns
    -------
    dict of str to float
        Every link's factor in force afterwards (restored links left out), as recorded
        in the state file.

    Raises
    ------
    TestbedError
        An unknown link (the closest names given), a factor outside (0, 1], an unshaped
        link that would stay above what this machine shapes, a testbed that is gone, or
        a ``tc`` command that failed.
    """
    state = Path(state)
    with _locked(state):
        data = _read(state)
        changes = _resolve(data, state, degrades)
        layout = Layout.from_dict(data["layout"])
        missing = [ns for ns in layout.namespaces if not namespace_exists(ns)]
        if missing:
            raise TestbedError(f"{state}: testbed is gone (namespaces {missing[:3]} missing)")
        old = {k: float(v) for k, v in (data.get("degrades") or {}).items()}
        new = {k: v for k, v in {**old, **changes}.items() if v != 1.0}
        needs_netem = any(v.rate is None and (v.latency or v.latency_back)
                          for v in layout.veths)
        commands = reshape_commands(layout, data["links"], old, new,
                                    netem=needs_netem and netem_available())
        for ns, lines in commands.items():
            _batch(["tc", "-n", ns, "-batch", "-"], lines, f"degrading links in {ns}")
        data["degrades"] = new
        _write(state, data)
    return new


def describe(factors: Mapping[str, float]) -> str:
    """``"switch0-switch1 x0.25, A/nic0 x0.5"``, or ``"none"``."""
    return ", ".join(f"{k} x{v:g}" for k, v in factors.items()) or "none"


_UNIT = {"": 1, "K": 1e3, "M": 1e6, "G": 1e9}


def _bits(text: str) -> float:
    match = re.fullmatch(r"([\d.]+)([KMG]?)bit", text)
    if not match:
        raise TestbedError(f"cannot read tc rate {text!r}")
    return float(match[1]) * _UNIT[match[2]]


def htb_classes(ns: str, dev: str) -> dict[str, tuple[float, float]]:
    """The HTB classes on ``dev`` in ``ns``: handle -> (rate, ceil) in bits/s on the wire
    (``tc -j class show``, read as text where this iproute2 prints no JSON for classes)."""
    out = run("tc", "-j", "-n", ns, "class", "show", "dev", dev).stdout
    classes: dict[str, tuple[float, float]] = {}
    if out.lstrip().startswith("["):
        for c in json.loads(out):
            if c.get("class") == "htb" or c.get("kind") == "htb":
                classes[c["handle"]] = (float(c["rate"]) * 8, float(c["ceil"]) * 8)
        return classes
    for line in out.splitlines():
        words = line.split()
        if len(words) > 2 and words[:2] == ["class", "htb"]:
            classes[words[2]] = (_bits(words[words.index("rate") + 1]),
                                 _bits(words[words.index("ceil") + 1]))
    return classes


# ---- delayed faults --------------------------------------------------------------------

def start_timer(state: str | Path, degrade: Degrade) -> int:
    """Apply ``degrade`` after ``degrade.after`` seconds, from a detached process.

    The link and factor are checked first (:class:`TestbedError` as in
    :func:`apply_degrades`).
    The process waits inside the testbed's first namespace: ``testbed down`` (which kills
    every process in them) ends it, and if the testbed is gone when it wakes it exits
    without a change. What it applied, or why it failed, is in the state file
    (``timers``). Returns its pid.
    """
    state = Path(state).resolve()
    data = _read(state)
    name = next(iter(_resolve(data, state, [degrade])))  # checked before it waits
    degrade = dataclasses.replace(degrade, link=name)
    layout_ns = Layout.from_dict(data["layout"]).namespaces[0]
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [
        root, os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen(["ip", "netns", "exec", layout_ns, sys.executable, "-m",
                             "topoplan.testbed.degrade", str(state), str(degrade)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=env, start_new_session=True)
    with _locked(state):
        data = _read(state)
        data.setdefault("timers", []).append({"degrade": str(degrade), "pid": proc.pid,
                                              "due": time.time() + degrade.after})
        _write(state, data)
    return proc.pid


def _timer_main(state: Path, degrade: Degrade) -> int:
    """The detached process of :func:`start_timer`."""
    due = time.monotonic() + degrade.after
    while time.monotonic() < due:
        time.sleep(min(0.1, max(due - time.monotonic(), 0)))
        if not state.exists():
            return 0  # the testbed is gone: nothing to do
    try:
        apply_degrades(state, [degrade])
        outcome: dict[str, Any] = {"applied": time.time()}
    except Exception as exc:  # recorded for `testbed degrade`/`probe` to show
        outcome = {"error": str(exc)}
    with contextlib.suppress(TestbedError, OSError), _locked(state):
        data = _read(state)
        for timer in data.get("timers", []):
            if timer.get("pid") == os.getpid():
                timer.update(outcome)
        _write(state, data)
    return 0 if "applied" in outcome else 1


class Timers:
    """Delayed faults applied by threads of this process, from :meth:`start` on; leaving
    the ``with`` block cancels those not yet due. ``applied`` holds (degrade, seconds
    after start) of each applied one; a failure is raised by :meth:`check`."""

    def __init__(self, state: str | Path, degrades: Sequence[Degrade]) -> None:
        self.state = Path(state)
        self.degrades = [d for d in degrades if d.after > 0]
        self.applied: list[tuple[Degrade, float]] = []
        self.errors: list[str] = []
        self._timers: list[threading.Timer] = []
        self._started = 0.0

    def _fire(self, degrade: Degrade) -> None:
        try:
            apply_degrades(self.state, [degrade])
            self.applied.append((degrade, time.monotonic() - self._started))
        except Exception as exc:
            self.errors.append(f"--degrade {degrade}: {exc}")

    def start(self) -> Timers:
        self._started = time.monotonic()
        for d in self.degrades:
            timer = threading.Timer(d.after, self._fire, args=(d,))
            timer.daemon = True
            timer.start()
            self._timers.append(timer)
        return self

    def cancel(self) -> None:
        for timer in self._timers:
            timer.cancel()

    def check(self) -> None:
        """Raise :class:`TestbedError` if a delayed fault could not be applied."""
        if self.errors:
            raise TestbedError("; ".join(self.errors))

    def __enter__(self) -> Timers:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.cancel()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m topoplan.testbed.degrade STATE LINK=F@SECONDS``: the timer process."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2:
        print("usage: python -m topoplan.testbed.degrade STATE LINK=F[@SECONDS]",
              file=sys.stderr)
        return 2
    return _timer_main(Path(args[0]), parse_degrade(args[1]))


if __name__ == "__main__":
    sys.exit(main())
