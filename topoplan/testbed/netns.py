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

from ..errors import TopoplanError
from .layout import Layout, Veth

__all__ = ["TestbedError", "capable", "create", "destroy", "state_dir", "load_state",
           "namespace_exists", "namespace_pids", "run", "interrupts_raise", "shaping_commands"]


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
#: has its own queue, so a deep one only delays that pair's own packets; 20 ms keeps
#: tail drops rare without letting a pair's backlog grow without bound.
QUEUE_SECONDS = 0.02
#: TCP packets shorter than this (IP bytes, a power of two) go to one class served
#: first: 20 B IP + 32 B TCP with timestamps, no payload, is a pure ACK...
SMALL_PACKET = 64
#: ... guaranteed this share of the link (ACKs of a full-rate stream need ~0.5%).
SMALL_SHARE = 0.02
SMALL_CLASS = 0xfff0


def shaping_commands(dev: str, rate: float | None, latency: float,
                     addresses: Sequence[str] = (), *, netem: bool = False) -> list[str]:
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
        The ranks' IPv4 addresses.
    netem : bool
        Whether the kernel has netem.

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
           addresses: Sequence[str] = ()) -> None:
    """Shape ``dev``'s egress (:func:`shaping_commands`), in one ``tc -batch`` call."""
    lines = shaping_commands(dev, rate, latency, addresses,
                             netem=latency > 0 and netem_available())
    if not lines:
        return
    try:
        proc = subprocess.run(["tc", "-n", ns, "-batch", "-"], input="\n".join(lines) + "\n",
                              capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise TestbedError("tc not found: the testbed needs iproute2 (ip, tc)") from None
    except subprocess.TimeoutExpired:
        raise TestbedError(f"tc -batch for {ns} {dev} did not finish in 60 s") from None
    if proc.returncode != 0:
        raise TestbedError(f"shaping {dev} in {ns} failed: "
                           f"{proc.stderr.strip() or proc.returncode}")


#: Kernel settings of each rank namespace. A testbed link should deliver its rate from
#: the first byte of every step: TCP's restart from a small window after 1 RTO of idle
#: (between a schedule's steps) would make short steps look slow.
RANK_SYSCTLS = {"net.ipv4.tcp_slow_start_after_idle": "0"}


def _tune(ns: str) -> None:
    for key, value in RANK_SYSCTLS.items():
        run("ip", "netns", "exec", ns, "sysctl", "-qw", f"{key}={value}")


def _make_veth(v: Veth, addresses: Sequence[str] = ()) -> None:
    run("ip", "-n", v.ns_a, "link", "add", v.name_a, "type", "veth",
        "peer", "name", v.name_b, "netns", v.ns_b)
    for ns, dev, master in ((v.ns_a, v.name_a, v.master_a), (v.ns_b, v.name_b, v.master_b)):
        run("ip", "-n", ns, "link", "set", dev, "mtu", str(MTU))
        if master:
            run("ip", "-n", ns, "link", "set", dev, "master", master)
        _shape(ns, dev, v.rate, v.latency, addresses)
        run("ip", "-n", ns, "link", "set", dev, "up")


@contextlib.contextmanager
def interrupts_raise() -> Iterator[None]:
    """Turn SIGTERM/SIGHUP into KeyboardInterrupt so cleanup code runs (main thread only).

    Wrap whatever runs while a testbed is up: killing the process then still removes
    the namespaces (a background job started by a script also ignores SIGINT).
    """
    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    old = {}
    try:
        for sig in (signal.SIGTERM, signal.SIGHUP):
            old[sig] = signal.signal(sig, handler)
    except ValueError:  # not the main thread: leave signals alone
        pass
    try:
        yield
    finally:
        for sig, previous in old.items():
            signal.signal(sig, previous)


def write_state(layout: Layout, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"format": "topoplan-testbed", "version": 1, "pid": os.getpid(),
                               "created": time.time(), "layout": layout.to_dict()}, indent=1))
    os.replace(tmp, path)


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


def create(layout: Layout, state: Path | None = None) -> Path:
    """Build ``layout``; on any error or interrupt remove what was built, then re-raise.

    Returns
    -------
    Path
        The state file to hand to :func:`destroy`.
    """
    state = state or default_state_path(layout)
    with interrupts_raise():
        write_state(layout, state)
        try:
            for ns in layout.namespaces:
                if namespace_exists(ns):
                    raise TestbedError(f"namespace {ns} already exists; remove it with "
                                       f"`ip netns del {ns}` or pick another prefix")
                run("ip", "netns", "add", ns)
                run("ip", "-n", ns, "link", "set", "lo", "up")
            for ns in layout.rank_ns:
                _tune(ns)
            for bridge, _ in layout.bridges:
                # No STP (the layout is a tree) and no forwarding delay: ports forward at once.
                run("ip", "-n", layout.core, "link", "add", bridge, "type", "bridge",
                    "stp_state", "0", "forward_delay", "0")
                run("ip", "-n", layout.core, "link", "set", bridge, "up")
            for veth in layout.veths:
                _make_veth(veth, layout.addresses)
            for ns, address in zip(layout.rank_ns, layout.addresses):
                if not any(v.ns_a == ns or v.ns_b == ns for v in layout.veths):
                    continue  # a lone rank (one-box cluster of one GPU)
                run("ip", "-n", ns, "addr", "add", f"{address}/16", "dev", "eth0")
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
