"""``topoplan.cluster.generate`` and ``topoplan topo generate``: big fabrics as cluster files."""

from __future__ import annotations

import pytest

from tests.support.clusters import ROOT
from topoplan.analysis.bound import lower_bound
from topoplan.cli import main
from topoplan.cluster import load_cluster, loads_cluster
from topoplan.cluster.generate import fat_tree, rail_optimized
from topoplan.errors import TopoplanError
from topoplan.planners.mcf import plan_mcf
from topoplan.ir.verify import verify


def _uplinks(cluster, leaf: str) -> float:
    return sum(link.bandwidth for link in cluster.links if leaf in (link.a, link.b))


def test_rail_puts_nic_k_of_every_box_on_rail_k():
    cluster = loads_cluster(rail_optimized(40, 4, boxes_per_leaf=16, spines=2))
    assert cluster.nranks == 160 and len(cluster.boxes) == 40
    # 3 leaves per rail (16, 16, 8 boxes), 4 rails, 2 spines.
    assert len(cluster.switches) == 4 * 3 + 2
    for b, box in enumerate(cluster.boxes):
        assert [nic.switch for nic in box.nics] == [f"r{k}l{b // 16}" for k in range(4)]
        assert [nic.gpus for nic in box.nics] == [(k,) for k in range(4)]
    # Non-blocking: a full leaf's uplinks carry all of its 16 NICs.
    assert _uplinks(cluster, "r2l0") == pytest.approx(16 * 25e9)


def test_fat_tree_oversubscription_is_down_over_up():
    cluster = loads_cluster(fat_tree(32, 8, boxes_per_leaf=8, spines=4, oversubscription=3))
    assert cluster.nranks == 256 and len(cluster.switches) == 4 + 4
    assert {nic.switch for nic in cluster.boxes[9].nics} == {"leaf1"}
    down = 8 * 8 * 25e9
    assert _uplinks(cluster, "leaf3") == pytest.approx(down / 3, rel=1e-9)


def test_bad_parameters_are_named():
    with pytest.raises(TopoplanError, match="spines must be positive"):
        rail_optimized(8, spines=0)
    with pytest.raises(TopoplanError, match="oversubscription must be positive"):
        fat_tree(8, oversubscription=0)


@pytest.mark.parametrize("make", [rail_optimized, fat_tree])
def test_generated_clusters_plan_and_verify(make):
    cluster = loads_cluster(make(4, 4, boxes_per_leaf=2, spines=2))
    schedule = plan_mcf(cluster, size=1 << 24)
    verify(schedule)
    assert schedule.meta["estimate_s"] >= lower_bound(cluster, 1 << 24) * (1 - 1e-9)


def test_cli_writes_a_file_that_loads(tmp_path, capsys):
    out = tmp_path / "rail.yaml"
    assert main(["topo", "generate", "rail", "--boxes", "64", "--nic", "400Gbit/s",
                 "--name", "my-rails", "-o", str(out)]) == 0
    assert "512 ranks in 64 boxes" in capsys.readouterr().err
    cluster = load_cluster(out)
    assert cluster.name == "my-rails" and cluster.nranks == 512
    assert {nic.bandwidth for box in cluster.boxes for nic in box.nics} == {50e9}
    assert main(["topo", "lint", str(out)]) == 0


def test_cli_prints_yaml_and_refuses_bad_input(capsys):
    assert main(["topo", "generate", "fat-tree", "--boxes", "2", "--gpus", "2"]) == 0
    assert loads_cluster(capsys.readouterr().out).nranks == 4
    with pytest.raises(SystemExit) as exc:
        main(["topo", "generate", "fat-tree", "--boxes", "2", "--oversubscription", "0"])
    assert exc.value.code == 2
    assert "--oversubscription: must be > 0" in capsys.readouterr().err
    assert not list(ROOT.glob("*.yaml"))  # nothing written in the checkout
