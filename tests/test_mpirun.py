"""topoplan.runtime.mpirun: which MPI launcher, and what each kind is given.

The version texts below are what each launcher's ``--version`` and each library's
``MPI_Get_library_version`` print. The end-to-end tests put a small executable that
answers ``--version`` as Open MPI 4.1.6's mpiexec does in front of the real commands
(a real subprocess, which writes down the argv and environment it was started with).
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from topoplan.runtime.mpirun import (ENV_LAUNCHER, ENV_RANK_MARK, ENV_TERMINAL, MPI_ENV, Flavour,
                              Launcher, choose_launcher, find_launcher, inside_mpi,
                              launch_command, launcher_args, mpi_library, parse_launcher_version,
                              parse_library_version, probe, rank_and_size)
from topoplan.errors import TopoplanError

ROOT = Path(__file__).resolve().parent.parent

OPEN_MPI_4 = "mpiexec (OpenRTE) 4.1.6\n\nReport bugs to http://www.open-mpi.org/community/help/\n"
OPEN_MPI_5 = "mpiexec (Open MPI) 5.0.3\n\nReport bugs to https://www.open-mpi.org/community/help/\n"
MPICH = """HYDRA build details:
    Version:                                 4.1.2
    Release Date:                            Wed Jun  7 15:22:45 CDT 2023
    CC:                              gcc
    Configure options:                       '--disable-option-checking' '--prefix=/usr' '--with-device=ch4:ofi'
    Process Manager:                         pmi
    Launchers available:                     ssh rsh fork slurm ll lsf sge manual persist
    Topology libraries available:            hwloc
    Resource management kernels available:   user slurm ll lsf sge pbs cobalt
    Demux engines available:                 poll select
"""
INTEL = ("Intel(R) MPI Library for Linux* OS, Version 2021.10 Build 20230619 (id: c2e19c2f3e)\n"
         "Copyright 2003-2023, Intel Corporation.\n")
INTEL_2019 = ("Intel(R) MPI Library for Linux* OS, Version 2019 Update 8 Build 20200624 "
              "(id: 4f16ad915)\nCopyright 2003-2020, Intel Corporation.\n")
SRUN = "slurm 23.02.7\n"

LIB_OPEN_MPI_4 = ("Open MPI v4.1.6, package: Debian OpenMPI, ident: 4.1.6, repo rev: v4.1.6, "
                  "Sep 30, 2023\x00")
LIB_OPEN_MPI_5 = ("Open MPI v5.0.11, package: Open MPI user@localhost Distribution, ident: "
                  "5.0.11, repo rev: v5.0.11rc1, Sep 16, 2026\x00")
LIB_MPICH = ("MPICH Version:\t4.1.2\nMPICH Release date:\tWed Jun  7 15:22:45 CDT 2023\n"
             "MPICH ABI:\t15:1:3\nMPICH Device:\tch4:ofi\nMPICH configure:\t--prefix=/usr\n")
LIB_INTEL = "Intel(R) MPI Library 2021.10 for Linux* OS\n"


@pytest.mark.parametrize("text, kind, version", [
    (OPEN_MPI_4, Flavour.OPEN_MPI_4, "4.1.6"),
    ("mpirun (Open MPI) 4.1.6\n\nReport bugs to http://www.open-mpi.org/community/help/\n",
     Flavour.OPEN_MPI_4, "4.1.6"),
    (OPEN_MPI_5, Flavour.OPEN_MPI_5, "5.0.3"),
    (MPICH, Flavour.MPICH, "4.1.2"),
    (INTEL, Flavour.INTEL, "2021.10"),
    (INTEL_2019, Flavour.INTEL, "2019.8"),
    (SRUN, Flavour.SRUN, "23.02.7"),
    ("slurm-wlm 21.08.5\n", Flavour.SRUN, "21.08.5"),
    ("usage: mpiexec [options]\n", Flavour.UNKNOWN, ""),
])
def test_launcher_versions_are_read(text, kind, version):
    assert parse_launcher_version(text) == (kind, version)


@pytest.mark.parametrize("text, kind, version", [
    (LIB_OPEN_MPI_4, Flavour.OPEN_MPI_4, "4.1.6"),
    (LIB_OPEN_MPI_5, Flavour.OPEN_MPI_5, "5.0.11"),
    (LIB_MPICH, Flavour.MPICH, "4.1.2"),
    (LIB_INTEL, Flavour.INTEL, "2021.10"),
    ("Microsoft MPI 10.1.12498.18\n", Flavour.UNKNOWN, ""),
])
def test_library_versions_are_read(text, kind, version):
    assert parse_library_version(text) == (kind, version)


WHEEL = Launcher("/venv/bin/mpiexec", Flavour.OPEN_MPI_5, "5.0.11")
SYSTEM = Launcher("/usr/bin/mpiexec", Flavour.OPEN_MPI_4, "4.1.6")
HYDRA = Launcher("/opt/intel/bin/mpiexec", Flavour.INTEL, "2021.10")
SRUN_L = Launcher("/usr/bin/srun", Flavour.SRUN, "23.02.7")


@pytest.mark.parametrize("candidates, library, chosen, note", [
    # A GPU machine whose system MPI is Open MPI 4.1.6, which mpi4py is built on.
    ([WHEEL, SYSTEM], LIB_OPEN_MPI_4, SYSTEM, None),
    ([WHEEL, SYSTEM], LIB_OPEN_MPI_5, WHEEL, None),
    ([WHEEL, SYSTEM, SRUN_L], LIB_OPEN_MPI_4, SYSTEM, None),
    ([SYSTEM], LIB_OPEN_MPI_4.replace("4.1.6", "4.1.5"), SYSTEM, "another version of the same MPI"),
    ([WHEEL, HYDRA], LIB_MPICH, HYDRA, "which starts its ranks through PMI"),
    ([WHEEL, SYSTEM, SRUN_L], LIB_MPICH, SRUN_L, "which starts its ranks through PMI"),
    ([WHEEL], LIB_MPICH, WHEEL, "its ranks may not start, or each start alone; choose a "
                                "launcher of MPICH 4.1.2 with --mpiexec PATH or "
                                "TOPOPLAN_MPIEXEC=PATH"),
    ([SYSTEM, WHEEL], None, SYSTEM, None),
])
def test_the_launcher_that_fits_mpi4py_is_chosen(candidates, library, chosen, note):
    lib = parse_library_version(library) if library else None
    got, notes = choose_launcher(candidates, lib)
    assert got == chosen
    if note is None:
        assert notes == []
    else:
        assert len(notes) == 1 and note in notes[0]
        assert f"mpi4py is built on {lib[0].label} {lib[1]}" in notes[0]
        assert "\n" not in notes[0]


def test_no_launcher_is_an_error_that_says_what_to_install():
    with pytest.raises(TopoplanError, match=r"pip install 'topoplan\[mpi\]'.*TOPOPLAN_MPIEXEC"):
        choose_launcher([], None)


def test_each_kind_gets_only_the_options_it_knows():
    argv = ["python", "x.py"]
    five = launch_command(3, argv, fault_tolerant=True, launcher=WHEEL)
    assert five.command == [WHEEL.path, "--with-ft", "ulfm", "-n", "3",
                            "--mca", "mpi_yield_when_idle", "1", *argv]
    assert all(five.env[k] == v for k, v in MPI_ENV.items()) and five.notes == ()
    # The launcher's part alone (which the testbed's command starts with, too).
    assert launcher_args(WHEEL, 3, fault_tolerant=True) == (five.command[:-2], MPI_ENV)
    assert launcher_args(SYSTEM, 3)[0] == launch_command(3, argv, launcher=SYSTEM).command[:-2]
    assert launcher_args(HYDRA, 2) == ([HYDRA.path, "-n", "2"], {})
    assert launch_command(3, argv, launcher=WHEEL).command[1:3] == ["-n", "3"]

    four = launch_command(3, argv, fault_tolerant=True, launcher=SYSTEM)
    assert four.command == [SYSTEM.path, "--oversubscribe", "-n", "3",
                            "--mca", "mpi_yield_when_idle", "1", *argv]
    assert four.env["OMPI_ALLOW_RUN_AS_ROOT"] == "1"
    assert four.env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] == "1"
    assert four.notes == ("Open MPI 4.1.6 has no fault tolerance (Open MPI 5's --with-ft ulfm): "
                          "a rank that dies ends the whole job, with no error naming it",)
    assert launch_command(3, argv, launcher=SYSTEM).notes == ()

    for other in (Launcher("/usr/bin/mpiexec", Flavour.MPICH, "4.1.2"), HYDRA, SRUN_L):
        run = launch_command(4, argv, fault_tolerant=True, launcher=other)
        assert run.command == [other.path, "-n", "4", *argv]
        added = {k: v for k, v in run.env.items() if os.environ.get(k) != v}
        added.pop(ENV_TERMINAL, None)
        assert added == {ENV_RANK_MARK: other.flavour.value}
        assert len(run.notes) == 1 and "has no fault tolerance" in run.notes[0]

    unknown = launch_command(2, argv, launcher=Launcher("/x/mpiexec", Flavour.UNKNOWN))
    assert unknown.command == ["/x/mpiexec", "-n", "2", *argv]
    assert unknown.notes == ("/x/mpiexec --version names no MPI topoplan knows; it gets -n 2 "
                             "and nothing else",)
    with pytest.raises(TopoplanError, match="need at least 1 rank, got 0"):
        launch_command(0, argv, launcher=WHEEL)


def test_ranks_know_they_are_ranks_whatever_started_them(monkeypatch):
    for key in ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK",
                "PMI_SIZE", "SLURM_PROCID", "SLURM_NTASKS", ENV_RANK_MARK):
        monkeypatch.delenv(key, raising=False)
    assert not inside_mpi() and rank_and_size() is None
    monkeypatch.setenv("SLURM_PROCID", "2")
    monkeypatch.setenv("SLURM_NTASKS", "4")
    assert not inside_mpi()  # a batch script has SLURM_PROCID too
    monkeypatch.setenv(ENV_RANK_MARK, Flavour.SRUN.value)
    assert inside_mpi() and rank_and_size() == (2, 4)
    monkeypatch.setenv("PMI_RANK", "1")
    monkeypatch.setenv("PMI_SIZE", "3")
    assert rank_and_size() == (1, 3)  # Hydra's, before Slurm's


# --- real launchers -------------------------------------------------------------------

def _fake_open_mpi_4(folder: Path) -> Path:
    """An executable ``mpiexec`` that answers ``--version`` as Open MPI 4.1.6 does and
    otherwise writes down its arguments and environment, then exits 0."""
    folder.mkdir()
    fake = folder / "mpiexec"
    fake.write_text(f"""#!/bin/sh
if [ "$1" = "--version" ]; then printf '%s' '{OPEN_MPI_4}'; exit 0; fi
here=$(dirname "$0")
printf '%s\\n' "$@" > "$here/argv"
env > "$here/env"
""")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    return fake


def _topoplan(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "topoplan", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("command, how", [
    (["launch", "-n", "3", "--", "python", "-c", "pass"], "env"),
    (["bench", "--algorithm", "ring", "-n", "2", "--sizes", "4KiB"], "option"),
    (["calibrate", "-n", "2", "-o", "out.yaml", "--quick"], "env"),
])
def test_an_open_mpi_4_launcher_gets_no_open_mpi_5_options(command, how, tmp_path):
    """On a machine whose mpiexec is Open MPI 4, bench / calibrate / launch passed
    ``--with-ft ulfm`` and died with ``unknown option "--with-ft"``; no more."""
    pytest.importorskip("mpi4py")
    fake = _fake_open_mpi_4(tmp_path / "bin")
    env = {k: v for k, v in os.environ.items() if k != ENV_LAUNCHER}
    env["PYTHONPATH"] = str(ROOT)
    if how == "env":
        env[ENV_LAUNCHER] = str(fake)
    else:  # --mpiexec with a name, looked up on PATH: the fake comes first there
        env["PATH"] = f"{fake.parent}{os.pathsep}{env.get('PATH', '')}"
        command = [*command, "--mpiexec", "mpiexec"]
    done = _topoplan(*command, env=env, cwd=tmp_path)
    assert "Traceback" not in done.stderr, done.stderr
    argv = (fake.parent / "argv").read_text().splitlines()
    assert "--with-ft" not in argv and "ulfm" not in argv
    assert argv[:6] == ["--oversubscribe", "-n", command[command.index("-n") + 1],
                        "--mca", "mpi_yield_when_idle", "1"]
    rank_env = dict(line.split("=", 1) for line in (fake.parent / "env").read_text().splitlines()
                    if "=" in line)
    assert rank_env["OMPI_ALLOW_RUN_AS_ROOT"] == "1"
    assert rank_env[ENV_RANK_MARK] == "openmpi4"
    assert "PRTE_MCA_rmaps_default_mapping_policy" not in rank_env
    notes = [line for line in done.stderr.splitlines() if line.startswith("topoplan: note: ")]
    if command[0] != "launch":  # bench and calibrate ask for fault tolerance
        assert ("topoplan: note: Open MPI 4.1.6 has no fault tolerance (Open MPI 5's --with-ft "
                "ulfm): a rank that dies ends the whole job, with no error naming it") in notes
    library = mpi_library()
    if library != (Flavour.OPEN_MPI_4, "4.1.6"):
        assert any(f"mpi4py is built on {library[0].label} {library[1]}" in line
                   and f"the launcher is mpiexec of Open MPI 4.1.6 ({fake})" in line
                   for line in notes), done.stderr


@pytest.mark.parametrize("how", ["option", "env"])
def test_a_launcher_that_is_not_there_is_a_one_line_error(how, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = ["launch", "-n", "2", "--", "true"]
    if how == "option":
        args[3:3] = ["--mpiexec", str(tmp_path / "nope")]
        want = f"topoplan: error: --mpiexec {tmp_path / 'nope'}: no such executable file"
    else:
        env[ENV_LAUNCHER] = "no-such-mpiexec"
        want = "topoplan: error: TOPOPLAN_MPIEXEC=no-such-mpiexec: not found on PATH"
    done = _topoplan(*args, env=env, cwd=tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith(want), done.stderr


@pytest.mark.mpi
def test_this_machines_launcher_is_found_and_fits_mpi4py():
    pytest.importorskip("mpi4py")
    launcher, notes = find_launcher()
    assert probe(launcher.path) == launcher
    assert (launcher.flavour, launcher.version) == mpi_library() and notes == []
