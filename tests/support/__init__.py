"""Code the tests share: hand-built schedules and clusters, the shipped topologies, and
the executor cases that multi-process launches run (``tests/mpi_cases.py`` under
mpiexec, ``python -m tests.mpi_cases``)."""
