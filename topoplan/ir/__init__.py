"""The schedule IR: what a plan is, independent of any cluster's speed.

- :mod:`~topoplan.ir.schedule`: the schedule (IR v1 to v4, docs/SCHEDULE.md), its ops and
  their JSON form;
- :mod:`~topoplan.ir.parse`: reading a schedule file, every field checked;
- :mod:`~topoplan.ir.passes`: the passes (coalesce, vectorize, lower native steps, cut
  over channels), each returning a new schedule;
- :mod:`~topoplan.ir.collectives`: what each collective starts and ends with;
- :mod:`~topoplan.ir.matching`: send/recv matching and deadlock detection;
- :mod:`~topoplan.ir.fingerprint`: the cluster fingerprint a plan records;
- :mod:`~topoplan.ir.verify`: the symbolic verifier (the test oracle).

It stands on the cluster model and nothing above it.
"""
