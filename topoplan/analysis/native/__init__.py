"""Models of what native collective libraries run: NCCL's own algorithms, priced as its
tuner prices them, on the channels its topology search builds, loading the real fabric.

- :mod:`~topoplan.analysis.native.nccl_tables`: NCCL's constants, each with its source;
- :mod:`~topoplan.analysis.native.nccl_search`: NCCL's channel search on one box;
- :mod:`~topoplan.analysis.native.nccl`: the tuner, NCCL's choice per size, and its time on the
  cluster (:func:`nccl_model`, :class:`NcclModel`, :class:`NcclChoice`);
- :mod:`~topoplan.analysis.native.clusters`: the cluster a runtime moves bytes on
  (:func:`runtime_cluster`, NVLink as NCCL counts it) and the sub-cluster of a group;
- :mod:`~topoplan.analysis.native.loads`: the bytes a collective lays on each link;
- :mod:`~topoplan.analysis.native.price`: what a native step costs under a profile.
"""
