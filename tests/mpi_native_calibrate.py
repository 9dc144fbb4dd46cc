"""The transport's own collectives over groups, under real MPI: ``mpiexec -n 4 python -m
tests.mpi_native_calibrate``, from the repository root (tests/test_simulate_native.py).

Every rank measures :func:`topoplan.runtime.calibrate.native_cases` at two sizes with
:func:`~topoplan.runtime.calibrate.measure_native` over
:class:`topoplan.runtime.transports.MPI` (sub-communicators by ``Comm.Split``); rank 0
prints one line ``TOPOPLAN-RESULT {json}`` with the samples and what was left out.
"""

from __future__ import annotations

import json

from topoplan.runtime.calibrate import measure_native, native_cases
from topoplan.runtime.transports import MPI


def main() -> None:
    transport = MPI.world()
    cases = native_cases(transport.size, sizes=(4 << 10, 1 << 20))
    samples, skipped = measure_native(transport, cases, repeats=3, block_s=0.005)
    if transport.rank == 0:
        print("TOPOPLAN-RESULT " + json.dumps({
            "skipped": skipped,
            "samples": [{"label": s.label, "measured_s": s.measured_s,
                         "repeats_s": list(s.repeats_s), "calls": s.calls} for s in samples]}),
              flush=True)


if __name__ == "__main__":
    main()
