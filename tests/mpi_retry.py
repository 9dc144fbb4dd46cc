"""A retry after a timeout under real MPI: ``mpiexec -n N python tests/mpi_retry.py``.

The last rank starts late: every other rank times out in call 0 and tells it so (on
COMM_WORLD; the transport talks on a duplicate), then the late rank runs call 0 alone,
sends messages nobody waits for any more, and times out too. Calls 1..5 must each sum
their own inputs, and no message may be left over at the end: the stale ones carry
call 0's epoch and are dropped. Each rank prints ``TOPOPLAN-RETRY {json}``.
"""

from __future__ import annotations

import json
import os
import sys

sys.path[:0] = [os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                os.path.dirname(os.path.abspath(__file__))]

import numpy as np  # noqa: E402
from mpi4py import MPI as mpi  # noqa: E402

from tests.support import schedules as S  # noqa: E402
from topoplan.errors import TransportError  # noqa: E402
from topoplan.runtime.executor import Allreduce  # noqa: E402
from topoplan.runtime.transports import MPI  # noqa: E402


def main() -> None:
    t = MPI()
    n, rank, late = t.size, t.rank, t.size - 1
    run = Allreduce(S.ring(n), t, timeout=0.5)
    outcomes: list = []
    if rank == late:
        for other in range(late):
            mpi.COMM_WORLD.recv(source=other, tag=7)
    try:
        run(np.full(1000, 1000.0 + rank))
        outcomes.append("ok")
    except TransportError:
        outcomes.append("failed")
    if rank != late:
        mpi.COMM_WORLD.send("failed", dest=late, tag=7)
    run.timeout = 60
    for call in range(1, 6):
        x = np.full(1000, float(rank + 1 + 100 * call))
        run(x)
        outcomes.append(float(x[0]) if np.all(x == x[0]) else "uneven")
    t.barrier()
    left = t.comm.Iprobe(mpi.ANY_SOURCE, mpi.ANY_TAG)
    print("TOPOPLAN-RETRY " + json.dumps({"rank": rank, "outcomes": outcomes,
                                          "left_over": bool(left)}), flush=True)


if __name__ == "__main__":
    main()
