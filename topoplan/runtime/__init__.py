"""Running schedules on real ranks.

- :mod:`~topoplan.runtime.executor`: replays a schedule (``Allreduce``, ``ReduceScatter``,
  ``AllGather``);
- :mod:`~topoplan.runtime.transports`: point-to-point over MPI, torch.distributed, NCCL
  (CuPy) or threads, built by :func:`~topoplan.runtime.transports.connect`;
- :mod:`~topoplan.runtime.mpirun`: finding and driving an MPI launcher (Open MPI,
  MPICH, Slurm);
- :mod:`~topoplan.runtime.bench`: measuring a plan against the native collective;
- :mod:`~topoplan.runtime.calibrate`: fitting a cost profile to measurements;
- :mod:`~topoplan.runtime.fusion`: tensor fusion's bucketing, which tensors share a buffer.

It stands on the IR, the analyses and the planners.
"""
