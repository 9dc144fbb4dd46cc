"""Create and remove a :class:`~topoplan.testbed.layout.Layout` with ``ip`` and ``tc``.

Nothing is ever created in the host's namespace: veth pairs are made inside the core
namespace with their peer end born in the rank namespace, so a name can never clash
with a host interface, and deleting the namespaces removes every bridge and veth.
A state file, written *before* anything is created, lists the namespaces, so
``testbed down`` can finish the job even after ``up`` was killed with SIGKILL.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Iterator, Sequence

from .._util import signals_raise
from ..errors import TopoplanError
from .layout import Layout, Veth

__all__ = ["TestbedError", "capable", "create", "destroy", "state_dir", "load_state",
           "namespace_exists", "namespace_pids", "run", "interrupts_raise", "shaping_commands",
           "crossing_pairs"]


class TestbedError(TopoplanError):
    __test__ = False  # not a pytest class, despite the name

    """The emulated network could not be built, used or removed; the message says why."""


def state_dir() -> Path:
    """Where state files go: ``$TOPOPLAN_TESTBED_STATE`` or ``/run/topoplan``."""
    return Path(os.environ.get("TOPOPLAN_TESTBED_STATE", "/run/topoplan"))


def run(*argv: str, check: bool = True, timeout: float = 30.0) -> subprocess.CompletedProcess:
    """Run one ``ip``/``tc`` command; failures become :class:`TestbedError` with its stderr."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise TestbedError(f"{argv[0]} not found: the testbed needs iproute2 (ip, tc)") from None
    except subprocess.TimeoutExpired:
        raise TestbedError(f"{' '.join(argv)} did not finish in {timeout:g} s") from None
    if check and proc.returncode != 0:
        raise TestbedError(f"{' '.join(argv)} failed: {proc.stderr.strip() or proc.returncode}")
    return proc


def capable() -> str | None:
    """``None`` when this process can build a testbed, else the reason it cannot.

    Tries the real thing (a throwaway namespace with a bridge, a veth pair and a tbf
    qdisc) instead of trusting the uid: containers often run as root without
    CAP_NET_ADMIN, or lack the veth or sch_tbf modules.
    """
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"{tool} (iproute2) is not installed"
    ns = f"tp-{os.getpid()}-probe"
    try:
        run("ip", "netns", "add", ns)
    except TestbedError as exc:
        return f"cannot create network namespaces: {exc}"
    try:
        run("ip", "-n", ns, "link", "add", "tpbr", "type", "bridge")
        run("ip", "-n", ns, "link", "add", "tpv0", "type", "veth", "peer", "name", "tpv1")
        run("ip", "-n", ns, "link", "set", "tpv0", "master", "tpbr")
        run("tc", "-n", ns, "qdisc", "add", "dev", "tpv1", "root", "tbf", "rate", "100mbit",
            "burst", "32kb", "latency", "50ms")
    except TestbedError as exc:
        return f"cannot build bridges, veth pairs or tbf qdiscs: {exc}"
    finally:
        run("ip", "netns", "del", ns, check=False)
    return None


def namespace_exists(name: str) -> bool:
    return Path("/run/netns", name).exists()


def namespace_pids(name: str) -> list[int]:
    """Processes whose network namespace is ``name``."""
    proc = run("ip", "netns", "pids", name, check=False)
    return [int(p) for p in proc.stdout.split() if p.strip().isdigit()]


@functools.lru_cache(maxsize=1)
def netem_available() -> bool:
    """Whether this kernel has netem (many minimal VM kernels build without it)."""
    ns = f"tp-{os.getpid()}-netem"
    try:
        run("ip", "netns", "add", ns)
    except TestbedError:
        return False
    try:
        run("ip", "-n", ns, "link", "add", "tpv0", "type", "veth", "peer", "name", "tpv1")
        return run("tc", "-n", ns, "qdisc", "add", "dev", "tpv0", "root", "netem", "delay", "1ms",
                   check=False).returncode == 0
    except TestbedError:
        return False
    finally:
        run("ip", "netns", "del", ns, check=False)


#: Jumbo frames, as in the data centres the YAML files describe: fewer packets for two
#: busy cores, and 0.7% header overhead instead of 4.5%.
MTU = 9000
#: tbf counts Ethernet frames; YAML bandwidths are what applications get. Scale the
#: shaped rate up by frame bytes / TCP payload bytes (14 B Ethernet, 20 B IP, 32 B TCP
#: with timestamps) so a TCP stream gets the YAML rate.
WIRE_OVERHEAD = (MTU + 14) / (MTU - 52)


def _burst(rate: float) -> int:
    # Enough tokens for 1 ms at the rate (timer granularity), at least four full frames:
    # more would let short transfers run above the rate, less starves TCP.
    return max(int(rate * 1e-3), 4 * (MTU + 14))


#: Per-flow queue depth in seconds at the link rate. Each (source, destination) pair
#: has its own queue, so a deep one only delays that pair's own packets, and a TCP
#: flow's window (tcp_wmem, 4 MiB) bounds what it holds. At 20 ms, drops cut the windows
#: of flows sharing a link and HTB's fair split showed as 0.84/1.15 of the model's share
#: (dgx1_v100, shift patterns); at 0.5 s no drops, and 0.93-1.07.
QUEUE_SECONDS = 0.5
#: TCP packets shorter than this (IP bytes, a power of two) go to one class served
#: first: 20 B IP + 32 B TCP with timestamps, no payload, is a pure ACK...
SMALL_PACKET = 64
#: ... guaranteed this share of the link (ACKs of a full-rate stream need ~0.5%).
SMALL_SHARE = 0.02
SMALL_CLASS = 0xfff0


def shaping_commands(dev: str, rate: float | None, latency: float,
                     addresses: Sequence[str] = (), *, netem: bool = False,
                     pairs: Sequence[tuple[str, str]] | None = None) -> list[str]:
    """``tc -batch`` lines that shape ``dev``'s egress to ``rate`` bytes/s, fairly per flow.

    One HTB class holds the link rate; under it every ordered pair of rank addresses
    gets a class of its own (matched by a u32 filter on source and destination), plus
    one for everything else (ARP). Sibling classes share the link max-min fairly (equal
    guaranteed rates, equal quanta, each may borrow up to the whole link), as
    :func:`topoplan.simulate` assumes, and each has its own queue: a pair's ACKs and
    small messages never wait behind another pair's bulk data. A single tbf FIFO did
    neither (two flows split one link 30/70, and a flow whose ACKs shared the queue
    with a reverse-direction bulk flow ran at a fraction of the rate).

    Parameters
    ----------
    dev : str
    rate : float or None
        Bytes/s the applications should get (``None``: no rate limit).
    latency : float
        One-way delay in seconds, added with netem under each class when ``netem``.
    addresses : sequence of str
        The ranks' IPv4 addresses: a class for every ordered pair of them...
    netem : bool
        Whether the kernel has netem.
    pairs : sequence of (str, str), optional
        ... or for these (source, destination) address pairs only: those whose routes
        cross ``dev``.

    Returns
    -------
    list of str
        Empty when there is nothing to shape.
    """
    delay = latency if netem and latency > 0 else 0.0
    if rate is None:
        if not delay:
            return []
        return [f"qdisc add dev {dev} root handle 1: netem delay {delay * 1e6:.0f}us "
                "limit 100000"]
    wire = rate * WIRE_OVERHEAD
    burst = _burst(wire)
    if pairs is None:
        pairs = [(a, b) for a in addresses for b in addresses if a != b]
    share = wire * (1 - SMALL_SHARE) / (len(pairs) + 1)
    quantum = 2 * (MTU + 14)
    limit = max(int(wire * QUEUE_SECONDS), 8 * (MTU + 14))
    lines = [f"qdisc add dev {dev} root handle 1: htb default 2",
             f"class add dev {dev} parent 1: classid 1:1 htb rate {int(wire * 8)}bit "
             f"ceil {int(wire * 8)}bit burst {burst} cburst {burst}",
             # Pure TCP ACKs first: a connection carrying bulk data both ways would
             # otherwise queue its ACKs behind its own reverse-direction data (MPI's
             # exchanges ran 25% slow). Only packets without payload: a small data
             # segment overtaking the bulk of its own flow would reorder TCP (tried:
             # spurious retransmits made pipelined plans 10-20% slower).
             f"class add dev {dev} parent 1:1 classid 1:{SMALL_CLASS:x} htb "
             f"rate {max(int(wire * 8 * SMALL_SHARE), 8000)}bit ceil {int(wire * 8)}bit "
             f"burst {burst} cburst {burst} quantum {quantum} prio 0",
             f"qdisc add dev {dev} parent 1:{SMALL_CLASS:x} handle {SMALL_CLASS:x}: bfifo "
             f"limit {limit}",
             f"filter add dev {dev} parent 1: protocol ip prio 1 u32 match ip protocol 6 0xff "
             f"match u16 0x0000 0x{0xffff & ~(SMALL_PACKET - 1):04x} at 2 "
             f"flowid 1:{SMALL_CLASS:x}"]
    for i in range(len(pairs) + 1):
        minor = f"{i + 2:x}"
        lines.append(f"class add dev {dev} parent 1:1 classid 1:{minor} htb "
                     f"rate {max(int(share * 8), 8000)}bit ceil {int(wire * 8)}bit "
                     f"burst {burst} cburst {burst} quantum {quantum} prio 1")
        if delay:
            lines.append(f"qdisc add dev {dev} parent 1:{minor} handle {minor}: netem "
                         f"delay {delay * 1e6:.0f}us limit {max(100, limit // MTU)}")
        else:
            lines.append(f"qdisc add dev {dev} parent 1:{minor} handle {minor}: bfifo "
                         f"limit {limit}")
        if i:
            src, dst = pairs[i - 1]
            lines.append(f"filter add dev {dev} parent 1: protocol ip prio 2 u32 "
                         f"match ip src {src}/32 match ip dst {dst}/32 flowid 1:{minor}")
    return lines


def _shape(ns: str, dev: str, rate: float | None, latency: float,
           addresses: Sequence[str] = (), pairs: Sequence[tuple[str, str]] | None = None
           ) -> None:
    """Shape ``dev``'s egress (:func:`shaping_commands`), in one ``tc -batch`` call."""
    lines = shaping_commands(dev, rate, latency, addresses,
                             netem=latency > 0 and netem_available(), pairs=pairs)
    _batch(["tc", "-n", ns, "-batch", "-"], lines, f"shaping {dev} in {ns}")


def _batch(argv: list[str], lines: Sequence[str], what: str) -> None:
    """Feed ``lines`` to a ``-batch -``/``-f -`` command; failures name ``what``."""
    if not lines:
        return
    try:
        proc = subprocess.run(argv, input="\n".join(lines) + "\n", capture_output=True,
                              text=True, timeout=60)
    except FileNotFoundError:
        raise TestbedError(f"{argv[0]} not found: the testbed needs iproute2 (ip, tc)"
                           + (" and nftables (nft)" if argv[0] == "nft" else "")) from None
    except subprocess.TimeoutExpired:
        raise TestbedError(f"{what} did not finish in 60 s") from None
    if proc.returncode != 0:
        raise TestbedError(f"{what} failed: {proc.stderr.strip() or proc.returncode}")


#: Kernel settings of each rank namespace. A testbed link should deliver its rate from
#: the first byte of every step: TCP's restart from a small window after 1 RTO of idle
#: (between a schedule's steps) would make short steps look slow.
#: Reno, a loss-based congestion control, keeps every pair's queue backlogged, so HTB's
#: fair scheduling alone decides the shares, as the max-min model does; BBR (this
#: kernel's default) paces below the queue, leaves it empty at times, and lets the other
#: pairs borrow: flows sharing a link measured 0.87-1.13 of their share with BBR,
#: 0.985-1.015 with Reno (dgx1_v100, every shift pattern).
RANK_SYSCTLS = {"net.ipv4.tcp_slow_start_after_idle": "0",
                "net.ipv4.tcp_congestion_control": "reno"}
#: Kernel settings of every namespace of a routed layout: forward packets (GPUs relay
#: for pairs without a link, as the simulator routes them), and accept them whichever
#: interface they come in on (a pair's paths and its reverse paths may differ).
ROUTER_SYSCTLS = {"net.ipv4.ip_forward": "1", "net.ipv4.conf.all.rp_filter": "0",
                  "net.ipv4.conf.default.rp_filter": "0",
                  "net.ipv4.conf.all.send_redirects": "0",
                  "net.ipv4.conf.default.send_redirects": "0"}


def _tune(ns: str, settings: dict[str, str]) -> None:
    run("ip", "netns", "exec", ns, "sysctl", "-qw",
        *(f"{key}={value}" for key, value in settings.items()))


def _make_veth(v: Veth, addresses: Sequence[str],
               pairs: dict[tuple[str, str], list[tuple[str, str]]]) -> None:
    mac_a = ("address", v.mac_a) if v.mac_a else ()
    mac_b = ("address", v.mac_b) if v.mac_b else ()
    run("ip", "-n", v.ns_a, "link", "add", v.name_a, *mac_a, "type", "veth",
        "peer", "name", v.name_b, *mac_b, "netns", v.ns_b)
    back = v.latency if v.latency_back is None else v.latency_back
    for ns, dev, latency in ((v.ns_a, v.name_a, v.latency), (v.ns_b, v.name_b, back)):
        run("ip", "-n", ns, "link", "set", dev, "mtu", str(MTU))
        _shape(ns, dev, v.rate, latency, addresses, pairs.get((ns, dev), []))
        run("ip", "-n", ns, "link", "set", dev, "up")


def crossing_pairs(layout: Layout) -> dict[tuple[str, str], list[tuple[str, str]]]:
    """(namespace, interface) -> the (source, destination) address pairs it transmits."""
    out: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for pair in layout.pairs:
        key = (layout.addresses[pair.src], layout.addresses[pair.dst])
        for path in pair.paths:
            for hop in path:
                found = out.setdefault(tuple(hop), [])  # type: ignore[arg-type]
                if key not in found:
                    found.append(key)
    return out


def interrupts_raise() -> contextlib.AbstractContextManager[None]:
    """Turn SIGTERM/SIGHUP into KeyboardInterrupt so cleanup code runs (main thread only):
    :func:`topoplan._util.signals_raise`.

    Wrap whatever runs while a testbed is up: killing the process then still removes
    the namespaces (a background job started by a script also ignores SIGINT).
    """
    return signals_raise()


def write_state(layout: Layout, path: Path, links: Sequence[dict] = ()) -> None:
    """Write the state file: the layout, and the cluster's link table (``links``, what
    :mod:`~topoplan.testbed.degrade` resolves link names against) with no link degraded."""
    path.parent.mkdir(parents=True, exist_ok=True)
    from .._util import atomic_write
    atomic_write(path, json.dumps({"format": "topoplan-testbed", "version": 1, "pid": os.getpid(),
                                   "created": time.time(), "layout": layout.to_dict(),
                                   "links": list(links), "degrades": {}}, indent=1))


def load_state(path: str | Path) -> Layout:
    """The layout recorded in a state file."""
    try:
        data = json.loads(Path(path).read_text())
        return Layout.from_dict(data["layout"])
    except FileNotFoundError:
        raise TestbedError(f"{path}: no such testbed state file") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise TestbedError(f"{path}: not a testbed state file ({exc})") from None


def default_state_path(layout: Layout) -> Path:
    return state_dir() / f"{layout.prefix.rstrip('-')}.json"


def create(layout: Layout, state: Path | None = None, links: Sequence[dict] = ()) -> Path:
    """Build ``layout``; on any error or interrupt remove what was built, then re-raise.

    ``links`` is the cluster's link table for the state file
    (:func:`topoplan.testbed.degrade.link_table`; without it links cannot be degraded).

    Returns
    -------
    Path
        The state file to hand to :func:`destroy`.
    """
    state = state or default_state_path(layout)
    with interrupts_raise():
        write_state(layout, state, links)
        try:
            if layout.bridges:
                raise TestbedError("this state file holds a bridged layout of an older "
                                   "version: it can only be removed (testbed down)")
            if layout.sprays and shutil.which("nft") is None:
                raise TestbedError(
                    "this cluster has pairs of ranks with several equal-cost paths, and the "
                    "testbed spreads their packets over them with nftables: install it "
                    "(e.g. apt install nftables)")
            for ns in layout.namespaces:
                if namespace_exists(ns):
                    raise TestbedError(f"namespace {ns} already exists; remove it with "
                                       f"`ip netns del {ns}` or pick another prefix")
                run("ip", "netns", "add", ns)
                run("ip", "-n", ns, "link", "set", "lo", "up")
                _tune(ns, {**ROUTER_SYSCTLS,
                           **(RANK_SYSCTLS if ns in layout.rank_ns else {})})
            for ns, address in zip(layout.rank_ns, layout.addresses):
                # The rank's address sits on eth0 (what gloo and Open MPI are told to
                # use), one end of a veth pair whose other end stays in the namespace
                # (many VM kernels have no dummy device); the routes to every other rank
                # leave by the link veths.
                run("ip", "-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name",
                    "eth0-stub")
                run("ip", "-n", ns, "link", "set", "eth0-stub", "up")
                run("ip", "-n", ns, "link", "set", "eth0", "mtu", str(MTU), "up")
                run("ip", "-n", ns, "addr", "add", f"{address}/16", "dev", "eth0",
                    "noprefixroute")
            crossing = crossing_pairs(layout)
            for veth in layout.veths:
                _make_veth(veth, layout.addresses, crossing)
            for ns, lines in layout.routing:
                _batch(["ip", "-n", ns, "-batch", "-"], lines, f"routes of {ns}")
            for ns, ruleset in layout.sprays:
                _batch(["ip", "netns", "exec", ns, "nft", "-f", "-"], [ruleset],
                       f"nftables rules of {ns}")
        except BaseException:
            destroy(state)
            raise
    return state


def kill_namespace_processes(ns: str, grace: float = 2.0) -> None:
    """SIGTERM every process in ``ns``, SIGKILL those still alive after ``grace`` s."""
    pids = namespace_pids(ns)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace
        while pids and time.monotonic() < deadline:
            pids = [p for p in pids if _alive(p)]
            time.sleep(0.05)
        if not pids:
            return


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie counts as gone: its parent reaps it.
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    return False


def destroy(state: str | Path) -> list[str]:
    """Kill the processes inside the testbed's namespaces and delete the namespaces.

    Deleting a namespace removes its bridges and veths (and so their peers). Safe to
    call twice and on a half-built testbed. Returns what was removed.

    Raises
    ------
    TestbedError
        When something is left behind; the state file is kept then, for a retry.
    """
    layout = load_state(state)
    removed = []
    for ns in reversed(layout.namespaces):
        if not namespace_exists(ns):
            continue
        kill_namespace_processes(ns)
        run("ip", "netns", "del", ns, check=False)
        removed.append(ns)
    left = [ns for ns in layout.namespaces if namespace_exists(ns)]
    if left:
        raise TestbedError(f"could not remove namespaces {left}; state kept in {state}")
    with contextlib.suppress(FileNotFoundError):
        Path(state).unlink()
    return removed
