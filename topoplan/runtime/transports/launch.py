"""Running a function on N ranks of this machine: threads or fresh processes.

The launchers of tests, notebooks and benchmarks, kept out of the transports themselves:
:func:`run_threads` runs ``fn(transport)`` on one thread per rank (what
:meth:`Local.launch <topoplan.runtime.transports.Local.launch>` does), :func:`run_processes` in
one spawned process per rank (what :meth:`Torch.launch <topoplan.runtime.transports.Torch.launch>`
does). Both return the per-rank results in rank order and raise the lowest rank's error,
or return it in its slot. They know no transport: the caller says how a rank connects
(``connect``), so a transport's ``launch`` hands them its own.

:func:`free_port` picks a port for a rendezvous on the loopback interface.
"""

from __future__ import annotations

import socket
import threading
import traceback
from typing import Any, Callable, Sequence

from ...errors import TopoplanError, TransportError
from .base import Deadline

__all__ = ["run_threads", "run_processes", "free_port"]


def run_threads(nranks: int, fn: Callable[[Any], Any], connect: Callable[[int], Any], *,
                leave: Callable[..., None] | None = None, name: str = "topoplan-rank",
                return_exceptions: bool = False) -> list[Any]:
    """Run ``fn(connect(rank))`` on ``nranks`` threads; return the per-rank results.

    Parameters
    ----------
    nranks : int
    fn : callable
        Called with each rank's transport.
    connect : callable
        ``connect(rank)``: rank ``rank``'s transport, made on its thread.
    leave : callable, optional
        ``leave(rank, why, failed=...)`` when a rank's function returned (``why`` is
        ``"finished"``) or raised (``"failed (ValueError)"``, ``failed=True``): so that
        the other ranks stop waiting for it.
    name : str
        The threads are named ``f"{name}-{rank}"``.
    return_exceptions : bool
        Put each rank's exception in its result slot instead of raising.

    Raises
    ------
    Exception
        The first rank's exception (lowest rank), unless ``return_exceptions``.
    """
    results: list[Any] = [None] * nranks
    failed: list[BaseException | None] = [None] * nranks

    def run(rank: int) -> None:
        try:
            results[rank] = fn(connect(rank))
            if leave is not None:
                leave(rank, "finished", failed=False)
        except BaseException as exc:  # noqa: BLE001 - reported to the caller below
            failed[rank] = exc
            if leave is not None:
                leave(rank, f"failed ({type(exc).__name__})", failed=True)

    threads = [threading.Thread(target=run, args=(r,), name=f"{name}-{r}", daemon=True)
               for r in range(nranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return _gather(results, failed, return_exceptions)


def run_processes(nranks: int, fn: Callable[..., Any], args: Sequence[Any],
                  connect: Callable[[int, int], Any], *,
                  close: Callable[[], None] | None = None, timeout: float = 120.0,
                  name: str = "topoplan-rank", return_exceptions: bool = False,
                  start_method: str = "spawn") -> list[Any]:
    """Run ``fn(connect(rank, nranks), *args)`` in ``nranks`` spawned processes; return
    their results.

    Parameters
    ----------
    nranks : int
    fn, connect, close : callable
        Module-level functions (or ``functools.partial`` of them): they are pickled into
        the spawned processes. ``connect(rank, nranks)`` makes the rank's transport,
        ``close()`` runs in every rank when it is done, failed or not.
    args : sequence
        Further arguments of ``fn`` (pickled too).
    timeout : float
        Seconds the ranks' functions are given; after 30 s more, ranks that have not
        reported are killed and get a :class:`~topoplan.TransportError`.
    name : str
        The processes are named ``f"{name}-{rank}"``.
    return_exceptions : bool
        Return each failed rank's error in its slot instead of raising. A rank that died
        without a word gets a :class:`~topoplan.TransportError` naming its exit code.
    start_method : str
        ``"spawn"``: each rank is a fresh interpreter, which imports torch again (seconds
        a rank on a busy machine). ``"forkserver"``: ranks fork from one server process
        per caller, which imports the modules named by
        :func:`multiprocessing.set_forkserver_preload` once (the tests preload torch);
        each rank still gets the caller's environment of the moment, as when spawned.

    Raises
    ------
    Exception
        The first rank's error (lowest rank) unless ``return_exceptions``.
    """
    import multiprocessing as mp
    import os
    import queue as queue_mod

    if start_method not in ("spawn", "forkserver"):
        raise TopoplanError(f"start_method {start_method!r}: expected 'spawn' or 'forkserver'")
    ctx = mp.get_context("forkserver") if start_method == "forkserver" else mp.get_context("spawn")
    # The fork server holds the environment it started with: hand each rank today's.
    environ = dict(os.environ) if start_method == "forkserver" else None
    results: list[Any] = [None] * nranks
    errors: list[BaseException | None] = [None] * nranks
    q = ctx.Queue()
    procs = [ctx.Process(target=_process_main,
                         args=(r, nranks, q, connect, close, fn, tuple(args), environ),
                         name=f"{name}-{r}", daemon=True) for r in range(nranks)]
    for p in procs:
        p.start()
    reported: set[int] = set()
    deadline = Deadline(timeout + 30)
    while len(reported) < nranks and not deadline.passed():
        try:
            rank, ok, value = q.get(timeout=0.2)
        except queue_mod.Empty:
            if all(not p.is_alive() for i, p in enumerate(procs) if i not in reported):
                # Drain what a rank put just before exiting.
                try:
                    rank, ok, value = q.get(timeout=0.5)
                except queue_mod.Empty:
                    break
            else:
                continue
        reported.add(rank)
        if ok:
            results[rank] = value
        else:
            errors[rank] = value
    for p in procs:
        p.join(timeout=max(0.0, deadline.left()))
        if p.is_alive():
            p.kill()
            p.join()
    for r, p in enumerate(procs):
        if r not in reported:
            errors[r] = TransportError(
                f"rank {r} exited with code {p.exitcode} before reporting a result", rank=r)
    return _gather(results, errors, return_exceptions)


def _process_main(rank: int, nranks: int, q: Any, connect: Callable[[int, int], Any],
                  close: Callable[[], None] | None, fn: Callable[..., Any],
                  args: tuple, environ: dict[str, str] | None = None) -> None:
    """A spawned rank: connect, run, and put ``(rank, ok, result or error)`` on ``q``."""
    if environ is not None:
        import os
        os.environ.clear()
        os.environ.update(environ)
    try:
        result = fn(connect(rank, nranks), *args)
        q.put((rank, True, result))
    except BaseException as exc:  # noqa: BLE001 - shipped to the parent
        try:
            q.put((rank, False, exc))
        except Exception:  # noqa: BLE001 - unpicklable exception: send its text
            q.put((rank, False, RuntimeError("".join(traceback.format_exception(exc)))))
    finally:
        if close is not None:
            close()


def _gather(results: list[Any], errors: list[BaseException | None],
            return_exceptions: bool) -> list[Any]:
    if return_exceptions:
        return [err if err is not None else res for res, err in zip(results, errors)]
    for exc in errors:
        if exc is not None:
            raise exc
    return results


def free_port() -> int:
    """A TCP port free on the loopback interface now (for a rendezvous of local ranks)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
