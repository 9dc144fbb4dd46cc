"""No ``nan`` or ``inf`` in what ``topoplan plan`` prints: a row with no time says why in
words (``n/a`` and a note in the table; ``time_s: null`` and ``unpriced`` in JSON)."""

from __future__ import annotations

import json
import re

import pytest

import topoplan.commands.plan as plan_command
import topoplan.planners.request as request_module
from tests.support.clusters import SHIPPED, topology_path
from topoplan.cli import main

NOT_A_NUMBER = re.compile(r"\b(nan|inf|infinity)\b", re.I)
# Cheap planners: every shipped topology at two sizes stays fast; the costly ones (mcf,
# composed) are run below, unsimulated.
CHEAP = "ring,rhd,tree,hierarchical"


def strict_json(text: str) -> dict:
    """``text`` as JSON that holds no NaN or Infinity (Python's json writes them, which is
    not JSON)."""
    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} in JSON output")
    return json.loads(text, parse_constant=refuse)


@pytest.fixture
def one_plan_per_request(monkeypatch):
    """The table and --json of one request share one plan (half the time)."""
    made: dict = {}
    original = plan_command.plan_result

    def cached(args):
        key = tuple(sorted((k, repr(v)) for k, v in vars(args).items()
                           if k not in ("json", "func")))
        if key not in made:
            made[key] = original(args)
        return made[key]
    monkeypatch.setattr(plan_command, "plan_result", cached)


def both_outputs(capsys, args: list[str]) -> tuple[str, dict]:
    assert main(args) == 0
    table = capsys.readouterr().out
    assert main([*args, "--json"]) == 0
    return table, strict_json(capsys.readouterr().out)


@pytest.mark.parametrize("name", [n for n in SHIPPED if n != "leaf_spine_1024"])
def test_plan_prints_no_nan_on_shipped_topologies(capsys, one_plan_per_request, name):
    for size in ("4KiB", "1MiB"):
        table, data = both_outputs(capsys, ["plan", str(topology_path(name)), "--size", size,
                                            "--candidates", CHEAP])
        assert not NOT_A_NUMBER.search(table), table
        assert all(row["time_s"] > 0 and row["unpriced"] is None for row in data["candidates"])


@pytest.mark.parametrize("name", ["ddl_two_switch", "dgx_a100_x4"])
def test_rows_too_big_to_simulate_without_an_estimate_say_why(capsys, monkeypatch,
                                                               one_plan_per_request, name):
    # Every plan over the simulation limit, as a 16,384-GPU cluster's are: mcf and composed
    # rank by their own estimates, nccl by its model; the others have no time at all.
    monkeypatch.setattr(request_module, "MAX_SIM_OPS", 0)
    table, data = both_outputs(capsys, ["plan", str(topology_path(name)), "--size", "1MiB"])
    assert not NOT_A_NUMBER.search(table), table
    rows = {row["algorithm"]: row for row in data["candidates"]}
    for planner in ("ring", "rhd", "tree", "hierarchical"):
        row = rows[planner]
        assert row["time_s"] is None and row["x_bound"] is None, row
        assert row["unpriced"].startswith("too many ops to simulate here, and no estimate")
        assert re.search(rf"^{planner} +n/a +- ", table, re.M), table
    assert rows["nccl"]["time_s"] > 0 and rows["nccl"]["unpriced"] is None
    flat = " ".join(table.split())  # the note may wrap
    assert re.search(r"n/a \(([a-z-]+, )*hierarchical(, [a-z-]+)*\): too many ops to simulate "
                     r"here, and no estimate from the planner", flat), flat
    # a named planner without a time: chosen_time_s null, and why
    table, data = both_outputs(capsys, ["plan", str(topology_path(name)), "--size", "1MiB",
                                        "-a", "ring"])
    assert data["chosen"] == "ring" and data["chosen_time_s"] is None
    assert data["chosen_unpriced"].startswith("too many ops to simulate here")
    assert not NOT_A_NUMBER.search(table), table


@pytest.mark.parametrize("name", ["ddl_two_switch"])
def test_json_rows_keep_their_fields(capsys, name):
    # Backward compatible: the fields of a row are those of before, and one more.
    assert main(["plan", str(topology_path(name)), "--size", "1MiB", "-a", "ring",
                 "--json"]) == 0
    row = strict_json(capsys.readouterr().out)["candidates"][0]
    assert {"algorithm", "time_s", "algbw_GBps", "busbw_GBps", "percent_of_bound", "x_bound",
            "speedup_vs_nccl", "simulated", "messages", "steps", "chunks", "ops",
            "breakdown", "plan_s", "unpriced"} <= set(row)
    assert row["unpriced"] is None and row["time_s"] > 0
