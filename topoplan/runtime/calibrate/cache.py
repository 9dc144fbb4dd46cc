"""Calibration on the job, cached: the cost profile a running job is priced with.

A job prices its plans with the profile of the runtime it runs on. The shipped profiles
(``mpi``, ``gloo``, ``nccl``) were measured on another machine; :func:`job_profile` gives
the job its own, measured once by :func:`~topoplan.runtime.calibrate.calibrate` on the
job's ranks and kept in a cache, so that later jobs of the same shape reuse it.

The cache key (:class:`CacheKey`) is what the measurement depends on:

- the cluster the job runs (:func:`~topoplan.ir.fingerprint.cluster_fingerprint`), or
  ``host`` when the job names none;
- the transport's family (:func:`transport_family`: ``mpi``, ``gloo``, ``nccl``,
  ``torch-nccl``, ``local``);
- the number of ranks;
- the hosts the ranks run on (:func:`host_set`, a digest of their sorted names).

Each key is one YAML file in :func:`cache_root` (``$XDG_CACHE_HOME/topoplan/profiles``,
else ``~/.cache/topoplan/profiles``), named
``<fingerprint>-<transport>-n<ranks>-<hosts>.yaml``; the file records its key in
``calibration.cache``, and a file whose record is not its key's is ignored.

Every function that takes a transport is collective (every rank calls it) and gives
every rank the same answer: rank 0 alone reads the cache and decides, and hands what it
found (the profile's text itself) to the others through
:meth:`~topoplan.runtime.transports.Transport.allreduce_max_many`, six bytes to a float
(exact: every value is a whole number below 2**48), so ranks on other hosts need not see
rank 0's files. A calibration measures on every rank (the samples are maxima over the
ranks, the same on all), fits on rank 0 and hands its text to the others the same way:
a fit on every rank would record each rank's own host, date and load average, and a
profile read back from YAML has its costs to 6 significant digits, so every rank, rank 0
too, uses the profile parsed from the one text that is written to the cache.

``TOPOPLAN_CALIBRATE`` (:func:`calibration_mode`) lets whoever launches a job decide
without touching the code: ``0`` or ``off`` never calibrates, ``1`` or ``auto``
calibrates when no profile is cached, ``refresh`` measures again; when set, it decides
over :func:`job_profile`'s arguments.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Mapping, Sequence

from ...analysis.cost import CostProfile, get_profile, loads_profile
from ...errors import TopoplanError, TopoplanWarning
# What a transport is and which profile prices it live with the transports (the
# executor warns with them); they are this module's names too.
from ..transports.families import (FAMILIES, runtime_of_profile, runtime_of_transport,
                                   shipped_profile_for, transport_family)

__all__ = ["ENV_CALIBRATE", "cache_root", "transport_family", "shipped_profile_for",
           "runtime_of_transport", "runtime_of_profile", "calibration_mode", "host_set",
           "CacheKey", "job_key", "lookup", "store", "CacheEntry", "cached_profiles",
           "job_profile", "launcher_profile", "Pricing", "job_pricing", "TESTBED_SCALE_ENV"]

#: The environment variable that turns calibration on the job on or off
#: (:func:`calibration_mode`).
ENV_CALIBRATE = "TOPOPLAN_CALIBRATE"

_MODES = {"0": "off", "off": "off", "1": "auto", "auto": "auto", "refresh": "refresh"}

_FILE_NAME = re.compile(r"(?P<fingerprint>[0-9a-f]{16}|host)-(?P<transport>[a-z0-9]+(?:-[a-z0-9]+)*)"
                        r"-n(?P<nranks>\d+)-(?P<hosts>[0-9a-f]{12})\.yaml")

_BYTES_PER_FLOAT = 6  # 48 bits: every value a float holds exactly


# ----------------------------------------------------------------------------------
# Names: where the cache is, what a transport is
# ----------------------------------------------------------------------------------
def cache_root() -> Path:
    """The folder of the cached profiles: ``$XDG_CACHE_HOME/topoplan/profiles``, else
    ``~/.cache/topoplan/profiles``.

    As the XDG Base Directory specification says, an ``XDG_CACHE_HOME`` that is empty or
    not an absolute path is ignored. Nothing is created here (:func:`store` makes the
    folder).

    References
    ----------
    XDG Base Directory Specification, version 0.8,
    https://specifications.freedesktop.org/basedir-spec/0.8/
    """
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "topoplan" / "profiles"


def calibration_mode(value: str | None = None) -> str | None:
    """What ``TOPOPLAN_CALIBRATE`` asks for: ``"off"`` (``0`` or ``off``: never
    calibrate), ``"auto"`` (``1`` or ``auto``: calibrate when nothing is cached),
    ``"refresh"`` (measure again), or None when it is unset or empty (the caller's
    arguments decide). Case and surrounding blanks do not matter.

    Parameters
    ----------
    value : str, optional
        The text to read; by default the environment variable's.

    Raises
    ------
    TopoplanError
        For any other value, naming it and the allowed ones.
    """
    if value is None:
        value = os.environ.get(ENV_CALIBRATE, "")
    text = value.strip().lower()
    if not text:
        return None
    mode = _MODES.get(text)
    if mode is None:
        raise TopoplanError(f"{ENV_CALIBRATE}={value!r}: use 0 or off (never calibrate), 1 or "
                            "auto (calibrate when no profile is cached) or refresh (measure "
                            "again), or leave it unset")
    return mode


# ----------------------------------------------------------------------------------
# Agreeing: floats that carry text
# ----------------------------------------------------------------------------------
def _hash52(text: str) -> int:
    """A stable 52-bit hash of ``text`` (a float holds it exactly)."""
    return int(hashlib.sha256(text.encode("utf-8")).hexdigest()[:13], 16)


def _words(nbytes: int) -> int:
    return -(-nbytes // _BYTES_PER_FLOAT)


def _pack(data: bytes) -> list[float]:
    data += b"\0" * (_words(len(data)) * _BYTES_PER_FLOAT - len(data))
    return [float(int.from_bytes(data[i:i + _BYTES_PER_FLOAT], "big"))
            for i in range(0, len(data), _BYTES_PER_FLOAT)]


def _unpack(values: Sequence[float], nbytes: int) -> bytes:
    return b"".join(int(v).to_bytes(_BYTES_PER_FLOAT, "big") for v in values)[:nbytes]


def _broadcast_text(transport: Any, text: str | None) -> str:
    """Rank 0's ``text`` on every rank (the others pass None); collective.

    Two :meth:`allreduce_max_many`: the length, then the bytes six to a float, rank 0's
    values against the others' lowest (-1 for the length, 0 for the bytes)."""
    data = (text or "").encode("utf-8") if transport.rank == 0 else b""
    length = int(transport.allreduce_max_many(
        [float(len(data)) if transport.rank == 0 else -1.0])[0])
    if length <= 0:
        return ""
    values = _pack(data) if transport.rank == 0 else [0.0] * _words(length)
    return _unpack(transport.allreduce_max_many(values), length).decode("utf-8")


def host_set(transport: Any) -> tuple[str, ...]:
    """The sorted distinct host names of the job's ranks, the same on every rank;
    collective.

    Two :meth:`~topoplan.runtime.transports.Transport.allreduce_max_many`: in the first,
    every rank fills its own two slots of ``2 * size`` with a stable 52-bit hash of its
    ``socket.gethostname()`` (SHA-256's first 13 hex digits, exact as a float) and the
    name's length, so that every rank learns which ranks share a host; in the second,
    the lowest rank of each host writes its name, six bytes to a float, into that host's
    slots. Every rank ends with the same names, in the same order.

    Parameters
    ----------
    transport : Transport

    Returns
    -------
    tuple of str
        Such as ``("node01", "node02")``; one name for a job on one host.
    """
    rank, size = transport.rank, transport.size
    data = socket.gethostname().encode("utf-8")
    mine = _hash52(data.decode("utf-8", "replace"))
    slots = [-1.0] * (2 * size)
    slots[2 * rank], slots[2 * rank + 1] = float(mine), float(len(data))
    got = transport.allreduce_max_many(slots)
    first: dict[int, int] = {}  # host hash -> the lowest rank on that host
    for r in range(size):
        first.setdefault(int(got[2 * r]), r)
    offsets: dict[int, tuple[int, int]] = {}  # host hash -> (first slot, bytes)
    total = 0
    for h in sorted(first):
        nbytes = int(got[2 * first[h] + 1])
        offsets[h] = (total, nbytes)
        total += _words(nbytes)
    values = [0.0] * total
    if first[mine] == rank:
        at, _ = offsets[mine]
        values[at:at + _words(len(data))] = _pack(data)
    if total:
        values = transport.allreduce_max_many(values)
    names = {_unpack(values[at:at + _words(n)], n).decode("utf-8", "replace")
             for at, n in offsets.values()}
    return tuple(sorted(names))


# ----------------------------------------------------------------------------------
# The key and the files
# ----------------------------------------------------------------------------------
def _hosts_digest(names: Sequence[str]) -> str:
    return hashlib.sha256("\n".join(sorted(set(names))).encode("utf-8")).hexdigest()[:16]


@dataclass(frozen=True)
class CacheKey:
    """What a cached profile was measured for; equal keys share one file.

    Attributes
    ----------
    fingerprint : str
        The cluster's (``"sha256:3f0c9a1e5b7d2c44"``,
        :func:`~topoplan.ir.fingerprint.cluster_fingerprint`), or ``"host"`` when the
        job names no cluster.
    transport : str
        The transport's family (:func:`transport_family`).
    nranks : int
        The job's ranks.
    hosts : str
        16 hex digits of SHA-256 over the sorted host names (:func:`host_set`).
    host_names : tuple of str
        Those names, for people (recorded, not compared).
    """

    fingerprint: str
    transport: str
    nranks: int
    hosts: str
    host_names: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        if self.fingerprint != "host" and not re.fullmatch(r"sha256:[0-9a-f]{16,64}",
                                                           str(self.fingerprint)):
            raise TopoplanError(f"cache key: fingerprint {self.fingerprint!r}: expected "
                                "'host' or a cluster fingerprint 'sha256:<16 hex digits>'")
        if not re.fullmatch(r"[a-z0-9]+(?:-[a-z0-9]+)*", str(self.transport)):
            raise TopoplanError(f"cache key: transport {self.transport!r}: expected a "
                                f"family such as {', '.join(sorted(set(FAMILIES.values())))}")
        if isinstance(self.nranks, bool) or not isinstance(self.nranks, int) or self.nranks < 1:
            raise TopoplanError(f"cache key: nranks {self.nranks!r}: expected an integer >= 1")
        if not re.fullmatch(r"[0-9a-f]{12,64}", str(self.hosts)):
            raise TopoplanError(f"cache key: hosts {self.hosts!r}: expected a hex digest "
                                "of the host names")

    @classmethod
    def make(cls, transport: Any, *, nranks: int, hosts: Sequence[str],
             cluster: Any = None) -> CacheKey:
        """The key of a job: ``transport`` (a transport or its name, :func:`transport_family`),
        ``nranks`` ranks on ``hosts`` (names), running ``cluster`` (a Cluster, a cluster
        YAML path, or None). Collects nothing: :func:`job_key` is the collective one."""
        fingerprint = "host"
        if cluster is not None:
            from ...cluster import as_cluster
            from ...ir.fingerprint import cluster_fingerprint
            fingerprint = cluster_fingerprint(as_cluster(cluster))
        names = tuple(sorted(set(hosts)))
        return cls(fingerprint, transport_family(transport), nranks, _hosts_digest(names),
                   names)

    @property
    def filename(self) -> str:
        """``<fingerprint>-<transport>-n<ranks>-<hosts>.yaml``: the fingerprint's 16 hex
        digits (or ``host``) and the hosts digest's first 12."""
        fingerprint = self.fingerprint.removeprefix("sha256:")[:16]
        return f"{fingerprint}-{self.transport}-n{self.nranks}-{self.hosts[:12]}.yaml"

    @property
    def path(self) -> Path:
        """The key's file in :func:`cache_root` (which may not exist)."""
        return cache_root() / self.filename

    def describe(self) -> str:
        """In words: ``mpi, 4 ranks on node01, cluster sha256:3f0c9a1e5b7d2c44``."""
        hosts = ", ".join(self.host_names) if self.host_names else f"hosts {self.hosts}"
        cluster = ("no cluster named" if self.fingerprint == "host"
                   else f"cluster {self.fingerprint}")
        return f"{self.transport}, {self.nranks} rank{'s' * (self.nranks != 1)} on {hosts}, " \
               f"{cluster}"

    def to_dict(self) -> dict[str, Any]:
        """The record a cached file keeps in ``calibration.cache``."""
        return {"fingerprint": self.fingerprint, "transport": self.transport,
                "ranks": self.nranks, "hosts": list(self.host_names),
                "hosts_digest": self.hosts}

    @classmethod
    def from_dict(cls, record: Mapping[str, Any]) -> CacheKey:
        """The key of a ``calibration.cache`` record.

        Raises
        ------
        TopoplanError
            When a field is missing or wrong.
        """
        try:
            return cls(record["fingerprint"], record["transport"], record["ranks"],
                       record["hosts_digest"], tuple(str(h) for h in record.get("hosts") or ()))
        except (KeyError, TypeError) as exc:
            raise TopoplanError(f"cache record: missing or bad {exc}") from None


def job_key(transport: Any, cluster: Any = None) -> CacheKey:
    """This job's :class:`CacheKey`; collective (:func:`host_set`).

    Parameters
    ----------
    transport : Transport
    cluster : Cluster or path, optional
        The cluster the job runs; loaded before anything is exchanged, so that a bad
        file fails on every rank alike.
    """
    if cluster is not None:
        from ...cluster import as_cluster
        cluster = as_cluster(cluster)
    return CacheKey.make(transport, nranks=transport.size, hosts=host_set(transport),
                         cluster=cluster)


def _read(path: Path, key: CacheKey | None) -> tuple[CostProfile, str] | str:
    """The profile in ``path`` and its text, or why it cannot be used."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return f"cannot be read ({getattr(exc, 'strerror', None) or exc})"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # bare numbers: the file is ours or refused
            profile = loads_profile(text, str(path))
    except TopoplanError as exc:
        return f"is not a cost profile ({getattr(exc, 'reason', exc)})"
    record = profile.calibration.get("cache") if profile.calibration else None
    if not isinstance(record, Mapping):
        return "records no cache key (calibration.cache)"
    try:
        found = CacheKey.from_dict(record)
    except TopoplanError as exc:
        return f"has a bad cache key ({exc})"
    if key is not None and found != key:
        return f"holds the profile of another key ({found.describe()})"
    return profile, text


def _ignored(path: Path, why: str) -> None:
    warnings.warn(TopoplanWarning(f"{path}: cached cost profile ignored: it {why}; it is "
                                  "measured again where calibration is on (topoplan calibrate "
                                  "--clear removes it)"), stacklevel=3)


def lookup(key: CacheKey) -> CostProfile | None:
    """The cached profile of ``key``, or None.

    A file that cannot be read, is not a profile or holds another key's is ignored with a
    :class:`~topoplan.errors.TopoplanWarning` naming it (never an error: the job goes on
    with what it would use without a cache).
    """
    path = key.path
    if not path.exists():
        return None
    found = _read(path, key)
    if isinstance(found, str):
        _ignored(path, found)
        return None
    return found[0]


def _cached_text(key: CacheKey, profile: CostProfile, header: str | None) -> tuple[CostProfile, str]:
    record = dict(profile.calibration)
    record["cache"] = MappingProxyType(key.to_dict())
    profile = replace(profile, calibration=MappingProxyType(record))
    if header is None:
        header = _default_header(key, profile)
    comment = "".join(f"# {line}".rstrip() + "\n" for line in header.splitlines())
    return profile, comment + profile.dumps()


def _default_header(key: CacheKey, profile: CostProfile) -> str:
    import textwrap
    record = profile.calibration
    repeats = record.get("repeats")
    lines = [
        f"Cost profile cached by topoplan for {key.describe()}.",
        f"Measured on the job's ranks over {record.get('transport', key.transport)} on "
        f"{record.get('date', 'an unknown date')}"
        f"{f', median of {repeats} repeats' if repeats else ''}; reused by every job with "
        "this key.",
        "`topoplan calibrate --show` lists the cache, --refresh measures again, --clear "
        "removes it.",
    ]
    return "\n".join("\n".join(textwrap.wrap(line, 88, subsequent_indent="  ",
                                             break_on_hyphens=False)) for line in lines)


def store(key: CacheKey, profile: CostProfile, header: str | None = None) -> Path:
    """Write ``profile`` as ``key``'s cached file, atomically, making the folder; the file
    records the key in ``calibration.cache``.

    Parameters
    ----------
    key : CacheKey
    profile : CostProfile
    header : str, optional
        ``#`` comment lines above the YAML; by default the key and how to manage the cache.

    Returns
    -------
    Path
        The file written (:attr:`CacheKey.path`).

    Raises
    ------
    OSError
        When the folder cannot be made or the file written (nothing half-written stays).
    """
    _, text = _cached_text(key, profile, header)
    return _write(key.path, text)


def _write(path: Path, text: str) -> Path:
    from ..._util import atomic_write
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, text)
    return path


@dataclass(frozen=True)
class CacheEntry:
    """A file in the cache, for listing and removing (:func:`cached_profiles`).

    Attributes
    ----------
    path : Path
    key : CacheKey or None
        The key the file records; None when it cannot be read.
    profile : CostProfile or None
    problem : str or None
        Why the file cannot be used (``"is not a cost profile (...)"``), else None.
    """

    path: Path
    key: CacheKey | None
    profile: CostProfile | None
    problem: str | None = None

    @property
    def date(self) -> str:
        """When the profile was measured (``calibration.date``), or ``"-"``."""
        if self.profile is None:
            return "-"
        return str(self.profile.calibration.get("date") or "-")


def cached_profiles(*, cluster: Any = None, transport: Any = None,
                    nranks: int | None = None) -> list[CacheEntry]:
    """The cached profiles, by file name, those of the given cluster, transport and
    ranks only where given (files that cannot be read are matched by their names).

    Parameters
    ----------
    cluster : Cluster, path or str, optional
        A cluster, its YAML file, a fingerprint (``"sha256:..."``) or ``"host"``.
    transport : Transport or str, optional
        As :func:`transport_family` takes it.
    nranks : int, optional
    """
    wanted: dict[str, str] = {}
    if cluster is not None:
        if isinstance(cluster, str) and (cluster == "host" or cluster.startswith("sha256:")):
            fingerprint = cluster
        else:
            from ...cluster import as_cluster
            from ...ir.fingerprint import cluster_fingerprint
            fingerprint = cluster_fingerprint(as_cluster(cluster))
        wanted["fingerprint"] = fingerprint.removeprefix("sha256:")[:16]
    if transport is not None:
        wanted["transport"] = transport_family(transport)
    if nranks is not None:
        wanted["nranks"] = str(nranks)
    try:
        paths = sorted(p for p in cache_root().iterdir() if p.is_file())
    except OSError:  # no cache yet
        return []
    out = []
    for path in paths:
        named = _FILE_NAME.fullmatch(path.name)
        if named is None or any(named[k] != v for k, v in wanted.items()):
            continue  # not one of ours, or not the one asked for
        found = _read(path, None)
        if isinstance(found, str):
            out.append(CacheEntry(path, None, None, found))
            continue
        key = CacheKey.from_dict(found[0].calibration["cache"])
        if key.filename != path.name:
            out.append(CacheEntry(path, None, None, "holds the profile of another key "
                                                    f"({key.describe()})"))
            continue
        out.append(CacheEntry(path, key, found[0]))
    return out


# ----------------------------------------------------------------------------------
# The job's profile
# ----------------------------------------------------------------------------------
def job_profile(transport: Any, cluster: Any = None, *, calibrate_missing: bool = False,
                refresh: bool = False, quick: bool = True,
                progress: Callable[[str], None] | None = None, name: str | None = None,
                timeout: float = 60.0,
                environment: bool = True) -> tuple[CostProfile, str]:
    """The cost profile this job is priced with; collective, the same on every rank.

    The cached profile of the job's :class:`CacheKey` if there is one; else, where asked
    to, one measured now on the job's ranks
    (:func:`~topoplan.runtime.calibrate.calibrate`, a few seconds quick) and cached; else
    the shipped profile of the transport (:func:`shipped_profile_for`). Rank 0 reads the
    cache and decides, and the others take its answer and the profile's text (module
    docstring), so every rank returns an equal profile and the same source even where
    only rank 0 sees the cache.

    Parameters
    ----------
    transport : Transport
    cluster : Cluster or path, optional
        The cluster the job runs (its fingerprint keys the cache); None: ``host``.
    calibrate_missing : bool
        Measure when nothing is cached.
    refresh : bool
        Measure even when a profile is cached (and replace it).
    quick : bool
        A quick calibration (5 repeats of 10 ms blocks) rather than a full one.
    progress : callable, optional
        Gets a line of text at each stage, on rank 0.
    name : str, optional
        The name of a profile measured now (default ``<transport>-n<ranks>``).
    timeout : float
        Seconds any one step of a calibration may wait.
    environment : bool
        Read ``TOPOPLAN_CALIBRATE`` (:func:`calibration_mode`; rank 0's): when set, it
        decides over ``calibrate_missing`` and ``refresh``. ``topoplan calibrate`` passes
        False: its own options say what to do.

    Returns
    -------
    (CostProfile, str)
        The profile and where it came from: ``"cache FILE"``, ``"calibrated now (cached
        in FILE)"`` (``"calibrated now (not cached: FILE: why)"`` when the file cannot be
        written, with a warning on rank 0), or ``"shipped NAME"``. A job of one rank has
        nothing to measure and gets the shipped profile unless one is cached.

    Raises
    ------
    TopoplanError
        On every rank alike: a bad ``TOPOPLAN_CALIBRATE`` or cluster, or a fit that
        failed on rank 0. A calibration's measuring errors are those of
        :func:`~topoplan.runtime.calibrate.calibrate`.
    """
    from .profile import fit_measured, measure_all
    key = job_key(transport, cluster)
    root = transport.rank == 0

    def say(text: str) -> None:
        if progress is not None and root:
            progress(text)

    verdict: dict[str, Any] | None = None
    if root:
        verdict = _guarded(lambda: _decide(key, transport.size, calibrate_missing, refresh,
                                           environment, say))
    verdict = _agree(transport, verdict)
    if verdict["action"] == "calibrate":
        measured = measure_all(transport, quick=quick, timeout=timeout, progress=progress)
        verdict = None
        if root:
            verdict = _guarded(lambda: _fit_and_store(
                key, transport, measured, name or f"{key.transport}-n{key.nranks}", say,
                fit_measured))
        verdict = _agree(transport, verdict)
    if verdict["action"] == "error":
        raise TopoplanError(verdict["message"])
    if verdict["action"] == "shipped":
        return get_profile(verdict["name"]), verdict["source"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # rank 0 read this text already
        profile = loads_profile(verdict["text"], verdict["file"])
    return profile, verdict["source"]


def launcher_profile(transport: Any, cluster: Any, nranks: int | None = None
                     ) -> tuple[CostProfile, str]:
    """What :func:`job_profile` would give a job of ``nranks`` (default the cluster's)
    ranks of ``transport`` (its name) on this host, without a job: the profile cached for
    that key, else the transport's shipped one. For a launcher (``topoplan bench``) that
    plans before its ranks start here; it never measures."""
    import socket
    from ...cluster import as_cluster
    cluster = as_cluster(cluster)
    key = CacheKey.make(transport, nranks=nranks or cluster.nranks,
                        hosts=(socket.gethostname(),), cluster=cluster)
    cached = lookup(key)
    if cached is not None:
        return cached, f"cache {key.path}"
    name = shipped_profile_for(transport)
    return get_profile(name), f"shipped {name}"


def _agree(transport: Any, verdict: dict[str, Any] | None) -> dict[str, Any]:
    """Rank 0's verdict on every rank."""
    return json.loads(_broadcast_text(transport, json.dumps(verdict) if verdict else None))


def _guarded(decide: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``decide()`` on rank 0, or an error verdict for every rank: a rank 0 that raised
    alone would leave the others waiting for its answer."""
    try:
        return decide()
    except TopoplanError as exc:
        return {"action": "error", "message": str(exc)}
    except Exception as exc:  # noqa: BLE001 - told to every rank, not swallowed
        return {"action": "error", "message": f"rank 0: {type(exc).__name__}: {exc}"}


def _decide(key: CacheKey, nranks: int, calibrate_missing: bool, refresh: bool,
            environment: bool, say: Callable[[str], None]) -> dict[str, Any]:
    mode = calibration_mode() if environment else None
    if mode is not None:
        calibrate_missing, refresh = mode != "off", mode == "refresh"
    shipped = shipped_profile_for(key.transport)
    if not refresh:
        path = key.path
        if path.exists():
            found = _read(path, key)
            if isinstance(found, str):
                _ignored(path, found)
            else:
                say(f"using the cached profile {path}")
                return {"action": "use", "source": f"cache {path}", "text": found[1],
                        "file": str(path)}
    if (calibrate_missing or refresh) and nranks >= 2:
        say(f"{'measuring again' if refresh else 'no cached profile'} for {key.describe()}: "
            "calibrating")
        return {"action": "calibrate"}
    return {"action": "shipped", "source": f"shipped {shipped}", "name": shipped}


def _fit_and_store(key: CacheKey, transport: Any, measured: Any, name: str,
                   say: Callable[[str], None], fit: Callable[..., CostProfile]) -> dict[str, Any]:
    profile = fit(transport, measured, name=name, progress=say)
    _, text = _cached_text(key, profile, None)
    path = key.path
    try:
        _write(path, text)
    except OSError as exc:
        why = f"{exc.filename or path}: {exc.strerror or exc}"
        warnings.warn(TopoplanWarning(f"the profile measured now is not cached: {why}"),
                      stacklevel=2)
        return {"action": "use", "source": f"calibrated now (not cached: {why})", "text": text,
                "file": str(path)}
    say(f"cached in {path}")
    return {"action": "use", "source": f"calibrated now (cached in {path})", "text": text,
            "file": str(path)}


# ----------------------------------------------------------------------------------
# The job's price: the profile and the machine
# ----------------------------------------------------------------------------------
#: Set by ``topoplan testbed run`` for the ranks it starts: the testbed's bandwidth scale,
#: so that a job on it is priced on the cluster it emulates.
TESTBED_SCALE_ENV = "TOPOPLAN_TESTBED_SCALE"


@dataclass(frozen=True)
class Pricing:
    """What a job's plans are priced with: the cost profile, the cluster the bytes move
    on (``machine``; None: the cluster planned for) and where the profile came from."""

    profile: Any
    machine: Any
    source: str

    @property
    def name(self) -> str:
        return str(self.profile.name)


def job_pricing(transport: Any, cluster: Any, *, profile: Any = None,
                machine: Any = None) -> Pricing:
    """The price of this job's plans: the profile of the transport it runs on, unless
    ``profile`` names one; collective when ``profile`` is None.

    - The profile: ``profile``, else the calibration cached for this cluster, transport
      and hosts, else the shipped profile of the transport
      (:func:`job_profile`; ``$TOPOPLAN_CALIBRATE`` may have
      it calibrate now).
    - The machine: ``machine``, else on the testbed (``$TOPOPLAN_TESTBED_SCALE``) the
      cluster it emulates, else, for a profile measured on a host (``host_bandwidth``)
      with every rank on one host, that host (:meth:`CostProfile.host_cluster`): the
      ranks then move bytes through its memory, whatever the cluster file says.
    """
    if profile is None:
        costs, source = job_profile(transport, cluster)
    else:
        costs, source = get_profile(profile), "given"
    if machine is None:
        scale = os.environ.get(TESTBED_SCALE_ENV)
        if scale:
            machine = cluster.scaled(float(scale))
        elif costs.host_bandwidth is not None and _one_host(transport):
            machine = costs.host_cluster(transport.size)
    return Pricing(costs, machine, source)


def _one_host(transport: Any) -> bool:
    return len(host_set(transport)) == 1
