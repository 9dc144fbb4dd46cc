"""A rank of a job that runs planned allreduces until it fails, as ``topoplan bench``'s
ranks do (``python -m tests.support.fault_rank mpi|torch`` under mpiexec, from the
repository root): it prints ``READY <rank>`` after its first call, so a test knows every
rank is inside the timed loop before it kills one; on a failure it prints the located
line and leaves as bench's ranks leave (tests/test_faults.py)."""

from __future__ import annotations

import sys

import numpy as np

from tests.support import schedules as S
from topoplan.commands.common import choose_port, rank_transport
from topoplan.errors import TransportError
from topoplan.runtime.executor import Allreduce
from topoplan.runtime.transports.mpi import LEAVE_GRACE, leave_after_failure


def main() -> int:
    name = sys.argv[1]
    transport = rank_transport(name, timeout=60)
    run = Allreduce(S.ring(transport.size), transport, timeout=60)
    x = np.ones(1 << 20, dtype=np.float32)
    try:
        for i in range(1_000_000):
            run(x)
            if i == 0:
                transport.barrier()
                print(f"READY {transport.rank}", flush=True)
    except TransportError as exc:
        print(f"topoplan: error: {exc}", file=sys.stderr, flush=True)
        if name == "mpi":
            leave_after_failure(1, grace=LEAVE_GRACE)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
