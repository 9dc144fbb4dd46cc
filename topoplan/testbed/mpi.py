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
``oob_tcp_if_include eth0`` for the daemons' own traffic.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any, Sequence

from .._mpirun import MPI_ENV, find_mpiexec

__all__ = ["write_launcher", "mpiexec_command", "hostname_of"]


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


def mpiexec_command(layout: Any, directory: Path, argv: Sequence[str]
                    ) -> tuple[list[str], dict[str, str]]:
    """The command (run it as is: it enters rank 0's namespace) and environment.

    Parameters
    ----------
    layout : Layout
        The testbed's layout.
    directory : Path
        Where the hostfile and agent are written.
    argv : sequence of str
        The program each rank runs.
    """
    hostfile, agent = write_launcher(layout, directory)
    n = layout.nranks
    mpiexec = find_mpiexec()
    command = [
        "ip", "netns", "exec", layout.rank_ns[0], "unshare", "--uts", "/bin/sh", "-c",
        'hostname "$0" && exec "$@"', hostname_of(0),
        mpiexec, "-n", str(n), "--hostfile", str(hostfile), "--map-by", "slot",
        "--prtemca", "plm_ssh_agent", str(agent),
        # Daemons would start further daemons themselves (tree spawn) with plain ssh.
        "--prtemca", "plm_ssh_no_tree_spawn", "1",
        "--prtemca", "oob_tcp_if_include", "eth0",
        "--mca", "pml", "ob1", "--mca", "btl", "tcp,self",
        "--mca", "btl_tcp_if_include", "eth0",
        "--mca", "mpi_yield_when_idle", "1",
        *argv]
    env = {**os.environ, **MPI_ENV}
    return command, env
