"""``topoplan doctor``: explain a measured collective curve by ranking fault hypotheses.

- :mod:`.logs` reads a benchmark log (nccl-tests output, ``topoplan bench --json``,
  ``topoplan testbed bench --json``, a CSV) into a :class:`BenchLog`;
- :mod:`.hypotheses` lists the faults to try on a cluster, each a changed cluster with
  a parameter grid;
- :mod:`.fit` prices each on the measured sizes and ranks them (:func:`diagnose`).

docs/DOCTOR.md says what each fault means and what to check on the machine.
"""

from __future__ import annotations

from .fit import NOISE, PENALTY, Diagnosis, DoctorError, Fit, Predictor, diagnose, \
    nccl_predictor
from .hypotheses import KINDS, Hypothesis, hypotheses
from .logs import BenchLog, DoctorLogError, Point, bus_factor, parse_log, read_log

__all__ = ["BenchLog", "Point", "DoctorLogError", "DoctorError", "read_log", "parse_log",
           "bus_factor", "Hypothesis", "KINDS", "hypotheses", "Fit", "Diagnosis", "diagnose",
           "Predictor", "nccl_predictor", "NOISE", "PENALTY"]
