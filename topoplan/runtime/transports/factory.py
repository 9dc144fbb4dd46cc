"""One way to build a transport by name: :func:`connect`.

``connect("mpi")`` is :meth:`MPI.world() <topoplan.runtime.transports.MPI.world>`,
``connect("nccl")`` is :meth:`NCCL.from_mpi() <topoplan.runtime.transports.NCCL.from_mpi>`,
``connect("torch", ...)`` joins or uses torch.distributed's process group, and
``connect("local", world=..., rank=...)`` is one thread rank of a
:class:`~topoplan.runtime.transports.local.LocalWorld`. The CLI (``topoplan bench``,
``topoplan calibrate``) builds its ranks' transports here; the classes' own
constructors and the launchers (``Local.launch``, ``Torch.launch``) still work.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Sequence

from ...errors import TopoplanError
from .base import Transport

__all__ = ["connect", "KINDS"]

#: The transports :func:`connect` builds, by name.
KINDS = ("mpi", "nccl", "torch", "local")


def connect(kind: str, **options: Any) -> Transport:
    """The transport ``kind`` for this rank.

    Parameters
    ----------
    kind : {"mpi", "nccl", "torch", "local"}
    **options
        - ``mpi``: ``comm`` (default ``COMM_WORLD``), ``dup``, ``poll_yield``, ``spin``,
          ``inline_max``, ``blocking_natives``, as for :class:`~topoplan.runtime.transports.MPI`.
        - ``nccl``: ``mpi_comm``, ``device``, ``share_gpus``, as for
          :meth:`NCCL.from_mpi <topoplan.runtime.transports.NCCL.from_mpi>` (rank 0 makes NCCL's
          id, MPI broadcasts it).
        - ``torch``: ``group``, over a process group that is already initialized (as
          :class:`~topoplan.runtime.transports.Torch`); or ``init_method`` (``tcp://HOST:PORT``,
          ``file://PATH``) with ``rank`` and ``size``, and optionally ``backend``
          (``"gloo"``) and ``timeout`` (seconds, 120), to join the default process group
          first.
        - ``local``: ``world`` (a :class:`~topoplan.runtime.transports.local.LocalWorld`),
          ``rank`` and ``timeout``, as for :class:`~topoplan.runtime.transports.Local`.

    Returns
    -------
    Transport

    Raises
    ------
    TopoplanError
        For an unknown ``kind`` or option (naming those there are), or a required
        option left out.
    ImportError
        When the kind's library (mpi4py, CuPy, PyTorch) is not installed, saying what to
        install.

    Examples
    --------
    >>> transport = connect("mpi")                                    # doctest: +SKIP
    >>> transport = connect("torch", init_method="tcp://127.0.0.1:29500",
    ...                     rank=rank, size=size)                     # doctest: +SKIP
    """
    build = _BUILDERS.get(kind) if isinstance(kind, str) else None
    if build is None:
        raise TopoplanError(f"unknown transport {kind!r}; expected one of "
                            f"{', '.join(repr(k) for k in KINDS)}")
    return build(options)


def _mpi(options: dict[str, Any]) -> Transport:
    from .mpi import MPI
    return _call("mpi", MPI, options)


def _nccl(options: dict[str, Any]) -> Transport:
    from .nccl import NCCL
    return _call("nccl", NCCL.from_mpi, options)


def _torch(options: dict[str, Any]) -> Transport:
    from .torch import Torch, _init_group
    if "init_method" in options:
        if "group" in options:
            raise TopoplanError("connect('torch'): give group (an initialized process group) "
                                "or init_method (to join the default one), not both")
        return _call("torch", _init_group, options, also=_names(Torch))
    return _call("torch", Torch, options, also=_names(_init_group))


def _local(options: dict[str, Any]) -> Transport:
    from .local import Local
    return _call("local", Local, options)


_BUILDERS: dict[str, Callable[[dict[str, Any]], Transport]] = {
    "mpi": _mpi, "nccl": _nccl, "torch": _torch, "local": _local}


def _names(fn: Callable[..., Any]) -> list[str]:
    """The parameters ``fn`` takes by name (``self`` and ``*args`` left out)."""
    return [p.name for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self"]


def _call(kind: str, fn: Callable[..., Any], options: dict[str, Any],
          also: Sequence[str] = ()) -> Any:
    """``fn(**options)``, options checked first against the names ``fn`` takes (and
    ``also``, those of the kind's other way, named in the message)."""
    params = inspect.signature(fn).parameters
    takes = _names(fn)
    unknown = sorted(set(options) - set(takes))
    if unknown:
        known = ", ".join(dict.fromkeys([*takes, *also]))
        plural = "s" if len(unknown) > 1 else ""
        raise TopoplanError(f"connect({kind!r}): unknown option{plural} {', '.join(unknown)}; "
                            f"{kind} takes {known}")
    missing = [name for name in takes
               if params[name].default is inspect.Parameter.empty and name not in options]
    if missing:
        given = "".join(f", {name}=..." for name in options)
        raise TopoplanError(f"connect({kind!r}{given}): give {' and '.join(missing)} too")
    return fn(**options)
