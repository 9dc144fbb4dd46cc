"""How the tests start torch ranks: forked from one server per pytest process.

A spawned rank is a fresh interpreter that imports torch again (and FSDP, dynamo, scipy,
networkx): 3-5 s of CPU each on a busy 2-core machine, for the 30-odd gloo ranks the
suite starts. Under ``forkserver`` the server imports :data:`PRELOAD` once
(tests/conftest.py names it) and each rank is a fork of it: a real process of its own
as before, up in a fraction of a second. ``Torch.launch(..., start_method=START)`` also
hands each rank the parent's environment of the moment, as a spawned rank would get it.

One gloo launch keeps ``spawn`` (``Torch.launch``'s default, what a user gets):
tests/test_transports_torch.py's reduce-scatter and allgather bench; and
tests/test_transports_launch.py spawns its (torch-free) ranks.
"""

from __future__ import annotations

#: The start method of the tests' torch ranks.
START = "forkserver"
#: What the fork server imports before it forks a rank: third-party modules only (the
#: ranks import topoplan and the tests from the parent's sys.path, as spawned ones do).
#: A module that is not installed is skipped.
PRELOAD = ["torch", "torch.distributed", "torch.distributed.fsdp", "torch._dynamo", "numpy",
           "scipy.optimize", "scipy.sparse", "networkx", "yaml", "pytest"]
