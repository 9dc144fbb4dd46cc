"""What a schedule costs on a cluster, without running it.

- :mod:`~topoplan.analysis.cost`: cost profiles (``ideal``, ``nccl``, calibrated ones): the
  profile (:mod:`~topoplan.analysis.cost.profile`) and its reader
  (:mod:`~topoplan.analysis.cost.read`);
- :mod:`~topoplan.analysis.bound`: the lower bounds a plan is measured against;
- :mod:`~topoplan.analysis.sim`: the event-driven simulator;
- :mod:`~topoplan.analysis.native`: the models of native libraries (NCCL, docs/NCCL_MODEL.md).

It stands on the cluster model and the IR (:mod:`topoplan.ir`); planners stand on it.
"""
