"""What a transport is, for pricing: its family, the runtime its profiles describe, the
shipped profile that prices it, and the warning for a plan priced for another runtime.

:func:`transport_family` names what a transport measures as (the calibration cache's
key: ``mpi``, ``gloo``, ``nccl``, ``torch-nccl``, ``torch-mpi``, ``local``);
:func:`runtime_of_transport` and :func:`runtime_of_profile` the runtime family a
transport runs and a profile describes; :func:`shipped_profile_for` the profile a job is
priced with when nothing is calibrated; :func:`priced_elsewhere` the line the executor
(and ``topoplan bench``) warns with when they differ.
"""

from __future__ import annotations

from typing import Any

from ...analysis.cost import CostProfile, get_profile
from ...errors import ProfileError, TopoplanError

__all__ = ["FAMILIES", "transport_family", "shipped_profile_for", "runtime_of_transport",
           "runtime_of_profile", "priced_elsewhere"]

#: A transport's name (``Transport.name``, or the CLI's ``--transport``) -> its family,
#: the part of the cache key that says what was measured.
FAMILIES = {"mpi": "mpi", "torch": "gloo", "gloo": "gloo", "torch/gloo": "gloo",
             "nccl": "nccl", "torch/nccl": "torch-nccl", "torch-nccl": "torch-nccl",
             "torch/mpi": "torch-mpi", "torch-mpi": "torch-mpi", "local": "local"}
#: A family -> the runtime family its profiles describe (:func:`runtime_of_profile`).
_RUNTIMES = {"mpi": "mpi", "gloo": "gloo", "nccl": "nccl", "torch-nccl": "nccl",
             "torch-mpi": "mpi", "local": "local"}
#: A family -> the shipped profile its runs are priced with when none is calibrated.
#: ``local`` (threads of one process copying memory) takes ``mpi``: of the measured
#: profiles, Open MPI's shared-memory transport is the closest to it (ranks on one host,
#: messages as memory copies, no network).
_SHIPPED = {"mpi": "mpi", "gloo": "gloo", "nccl": "nccl", "torch-nccl": "nccl",
            "torch-mpi": "mpi", "local": "mpi"}


def _transport_name(transport: Any) -> str:
    if isinstance(transport, str):
        return transport.strip().lower()
    return str(getattr(transport, "name", type(transport).__name__)).lower()


def transport_family(transport: Any) -> str:
    """What a transport measures as, for the cache key: ``mpi``, ``gloo``, ``nccl``
    (CuPy's NCCL, topoplan's NCCL transport), ``torch-nccl`` (torch.distributed over
    NCCL: its own posting costs), ``torch-mpi`` or ``local``.

    Parameters
    ----------
    transport : Transport or str
        A transport, or its name: ``Transport.name`` (``"mpi"``, ``"torch/gloo"``,
        ``"torch/nccl"``, ``"nccl"``, ``"local"``) or the CLI's ``--transport``
        (``"torch"`` is torch.distributed over gloo).

    Raises
    ------
    TopoplanError
        For a name it does not know, listing those it does.
    """
    name = _transport_name(transport)
    family = FAMILIES.get(name)
    if family is None:
        raise TopoplanError(f"unknown transport {name!r}: expected one of "
                            f"{', '.join(sorted(FAMILIES))}")
    return family


def shipped_profile_for(transport: Any) -> str:
    """The shipped profile a transport's runs are priced with when nothing is calibrated.

    ``mpi`` for MPI, ``gloo`` for torch.distributed over gloo, ``nccl`` for NCCL (CuPy's
    or torch.distributed's), and ``mpi`` for the thread transport
    (:class:`~topoplan.runtime.transports.Local`): its ranks copy memory within one
    host, which of the measured runtimes Open MPI's shared-memory transport is closest to.

    Parameters
    ----------
    transport : Transport or str
        As :func:`transport_family` takes it (``"mpi"``, ``"torch"``, ``"gloo"``,
        ``"torch/gloo"``, ``"nccl"``, ``"torch/nccl"``, ``"local"``).

    Raises
    ------
    TopoplanError
        For a transport name it does not know.
    """
    return _SHIPPED[transport_family(transport)]


def runtime_of_transport(transport: Any) -> str:
    """The runtime family a transport runs: ``mpi``, ``gloo``, ``nccl`` (CuPy's NCCL and
    torch.distributed's alike) or ``local``; compare with :func:`runtime_of_profile`."""
    return _RUNTIMES[transport_family(transport)]


def runtime_of_profile(profile: CostProfile | str) -> str | None:
    """The runtime family a profile was made for: ``mpi``, ``gloo``, ``nccl``, ``local``
    (measured on the thread transport), or None (``ideal``, or a profile that does not
    say).

    A calibrated profile says in ``calibration.transport`` (``"mpi (Open MPI v5.0.11)"``,
    ``"torch/gloo (torch 2.13.0)"``, ``"nccl (NCCL 2.21.5, CuPy)"``); any other is known
    by its name, that of a shipped profile (``nccl``, or ``nccl*`` for a copy with
    changed costs). Used to warn when a plan priced for one runtime runs on another.

    Parameters
    ----------
    profile : CostProfile or str
        A profile, or what :func:`~topoplan.analysis.cost.get_profile` takes (a shipped
        name, a YAML path).
    """
    profile = get_profile(profile)
    record = profile.calibration.get("transport") if profile.calibration else None
    if isinstance(record, str) and record.strip():
        family = FAMILIES.get(record.split()[0].lower())
        return _RUNTIMES.get(family) if family is not None else None
    name = profile.name.rstrip("*")
    return name if name in ("mpi", "gloo", "nccl") else None


def priced_elsewhere(schedule: Any, transport: Any) -> str | None:
    """``plan priced for nccl, running on mpi: re-plan with --profile mpi or calibrate``
    when ``schedule`` was priced (``meta["profile"]``) for another runtime than
    ``transport`` (a transport or its name: ``mpi``, ``torch``, ``nccl``); else None:
    also for a profile of no known runtime, and for in-process threads."""
    name = schedule.meta.get("profile")
    try:
        if not isinstance(name, str) or transport_family(transport) == "local":
            return None
        priced = runtime_of_profile(name)
        running = runtime_of_transport(transport)
    except (ProfileError, OSError):  # a profile file of another machine: not known here
        return None
    except TopoplanError:  # a transport of the user's own: its runtime is not known
        return None
    if priced is None or priced == running:
        return None
    return (f"plan priced for {priced}, running on {running}: re-plan with --profile "
            f"{shipped_profile_for(transport)} or calibrate")
