"""topoplan._util.atomic_write: every file topoplan writes has the mode open() gives, and a failed
write leaves nothing behind (plans, XML and YAML came out -rw------- under umask 022)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from topoplan._util import atomic_write
from topoplan.cli import main
from topoplan.errors import TopoplanError

ROOT = Path(__file__).resolve().parent.parent
CLUSTER = ROOT / "topologies" / "ddl_two_switch.yaml"
NCCL_XML = ROOT / "tests" / "data" / "nccl_topo_hgx_h100.xml"


@pytest.fixture
def umask():
    """Run the test under the given umask (022 by default), and put the old one back."""
    old = os.umask(0o022)
    yield lambda mask: os.umask(mask)
    os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_every_writer_gives_the_mode_open_would(umask, tmp_path, capsys):
    from topoplan import plan
    from topoplan.cluster import load_cluster
    from topoplan.analysis.cost import get_profile

    written = {}
    schedule = plan(load_cluster(CLUSTER), algorithm="ring", size=1 << 20)
    schedule.save(tmp_path / "api.json")
    written["Schedule.save"] = tmp_path / "api.json"
    get_profile("mpi").save(tmp_path / "profile.yaml", header="a header")
    written["CostProfile.save"] = tmp_path / "profile.yaml"
    commands = {
        "plan -o": (["plan", str(CLUSTER), "-a", "ring", "-o", str(tmp_path / "plan.json")],
                    "plan.json"),
        "export -o": (["export", str(tmp_path / "plan.json"), "-o", str(tmp_path / "algo.xml")],
                      "algo.xml"),
        "import -o": (["import", "msccl", str(tmp_path / "algo.xml"), "-o",
                       str(tmp_path / "imported.json")], "imported.json"),
        "topo import -o": (["topo", "import", "nccl", str(NCCL_XML), "-o",
                            str(tmp_path / "imported.yaml")], "imported.yaml"),
        "topo generate -o": (["topo", "generate", "fat-tree", "--boxes", "2", "--gpus", "2",
                              "-o", str(tmp_path / "generated.yaml")], "generated.yaml"),
        "show -o": (["show", str(CLUSTER), "-a", "ring", "--size", "1MiB", "--figures",
                     "cluster", "-o", str(tmp_path / "picture.png")], "picture.png"),
    }
    for name, (argv, file) in commands.items():
        assert main(argv) == 0, (name, capsys.readouterr().err)
        written[name] = tmp_path / file
    assert {name: oct(mode(p)) for name, p in written.items()} == {
        name: "0o644" for name in written}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in written.values())


def test_the_mode_follows_the_umask_and_an_existing_file(umask, tmp_path):
    umask(0o077)
    atomic_write(tmp_path / "private.txt", "x")
    assert mode(tmp_path / "private.txt") == 0o600
    umask(0o002)
    atomic_write(tmp_path / "group.txt", b"\x00\x01")
    assert mode(tmp_path / "group.txt") == 0o664
    assert (tmp_path / "group.txt").read_bytes() == b"\x00\x01"
    # Rewriting keeps the file's own mode, as open(path, "w") does.
    (tmp_path / "group.txt").chmod(0o640)
    atomic_write(tmp_path / "group.txt", "new")
    assert mode(tmp_path / "group.txt") == 0o640
    assert (tmp_path / "group.txt").read_text() == "new"


def test_a_failed_write_leaves_nothing_behind(umask, tmp_path):
    old = tmp_path / "plan.json"
    old.write_text("old")
    with pytest.raises(UnicodeEncodeError):
        atomic_write(old, "caf\u00e9", encoding="ascii")  # fails after the temporary file
    assert old.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["plan.json"]

    from topoplan import plan
    from topoplan.cluster import load_cluster
    schedule = plan(load_cluster(CLUSTER), algorithm="ring", size=1 << 20)
    with pytest.raises(TopoplanError, match="cannot write schedule"):
        schedule.save(tmp_path / "missing" / "plan.json")
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]


def test_a_picture_in_an_unknown_format_writes_nothing(tmp_path, capsys):
    code = main(["show", str(CLUSTER), "-a", "ring", "--size", "1MiB", "--figures", "cluster",
                 "-o", str(tmp_path / "picture.nope")])
    assert code == 1
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(
        f"topoplan: error: cannot write {tmp_path / 'picture.nope'}")
    assert list(tmp_path.iterdir()) == []
