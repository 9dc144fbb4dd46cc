"""``python -m topoplan.commands.torchrun ARGS``: torchrun (``torch.distributed.run``),
as ``topoplan launch --transport torch`` runs it, with its own reports made short.

torchrun answers a failed worker with a ``ChildFailedError`` traceback and a 30-line
report, a signal with a ``SignalException`` traceback, and logs each step of ending the
workers. Here a failed job prints one line per failed rank, the first failure first
(``topoplan: error: rank 1 (pid 5539) was killed by SIGKILL``, then ``rank 0 (pid 5538)
was stopped after rank 1 failed``), and exits 1 as torchrun does; a signal ends it with
128 + the signal's number; torchrun's log is left out.
``topoplan --verbose`` (``TOPOPLAN_VERBOSE=1``) leaves all of it as torchrun prints it.
"""

from __future__ import annotations

import logging
import signal
import sys

from .common import verbose


def _line(rank: int, failure: object, first: int | None = None) -> str:
    """One failed rank; ``first``: the rank whose failure made torchrun stop the rest."""
    code = getattr(failure, "exitcode", None)
    pid = getattr(failure, "pid", "?")
    if first is not None and code == -signal.SIGTERM:
        return f"topoplan: error: rank {rank} (pid {pid}) was stopped after rank {first} failed"
    if isinstance(code, int) and code < 0:
        name = getattr(failure, "signal_name", lambda: f"signal {-code}")()
        what = f"was killed by {name}"
    else:
        what = f"exited with status {code}"
    return f"topoplan: error: rank {rank} (pid {pid}) {what}"


def main(argv: list[str]) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun
    if verbose():
        torchrun(argv)
        return 0
    # Its log (the OMP_NUM_THREADS banner, each worker it stops, the failure the lines
    # below say) is left out; so are its tracebacks.
    # (torch's elastic loggers set their own levels, so each one is set here).
    for name in [n for n in logging.root.manager.loggerDict if n.startswith("torch.distributed")]:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    try:
        torchrun(argv)
    except ChildFailedError as exc:
        failures = dict(exc.failures)
        first, _ = exc.get_first_failure()
        print(_line(first, failures[first]), file=sys.stderr, flush=True)
        for rank in sorted(r for r in failures if r != first):
            print(_line(rank, failures[rank], first), file=sys.stderr, flush=True)
        return 1
    except SignalException as exc:
        return 128 + int(getattr(exc, "sigval", signal.SIGTERM))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
