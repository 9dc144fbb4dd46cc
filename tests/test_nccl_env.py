"""Forcing the nccl row as NCCL_ALGO / NCCL_PROTO do, and choosing the tables' version."""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys

import pytest

import topoplan
from tests.support.clusters import ROOT
from tests.support.nccl_parselist import nccl_parse_list
from tests.test_nccl_model import h100, rails
from topoplan.analysis.native import nccl_tables as T
from topoplan.analysis.native.nccl import NcclModel, nccl_group_time, nccl_model, nccl_time
from topoplan.analysis.native.nccl_env import (DEFAULT, FUNCTIONS, OFF, ON, current,
                                               nccl_settings, parse_list)
from topoplan.cluster import loads_cluster

GiB = 1 << 30
DGX = str(ROOT / "topologies" / "dgx_a100_x4.yaml")


# ---- NCCL's parseList ------------------------------------------------------------------
def test_parse_list_follows_the_examples_above_nccls_parser():
    # tuning.cc, the comment above parseList: "ring,collnetdirect;allreduce:tree,
    # collnetdirect;broadcast:ring" enables ring and collnetdirect for all functions, then
    # tree and collnetdirect for allreduce and ring for broadcast.
    masks = parse_list("ring,collnetdirect;allreduce:tree,collnetdirect;broadcast:ring",
                       T.ALGORITHM_NAMES, "NCCL_ALGO")
    on = {coll: {T.ALGORITHM_NAMES[k] for k, v in enumerate(m) if v == ON}
          for coll, m in masks.items()}
    assert on["allgather"] == on["reduce"] == {"Ring", "CollNetDirect"}
    assert on["allreduce"] == {"Tree", "CollNetDirect"}
    assert on["broadcast"] == {"Ring"}
    # "LL,Simple;allreduce:^LL": LL and Simple everywhere, everything but LL for allreduce.
    masks = parse_list("LL,Simple;allreduce:^LL", T.PROTOCOL_NAMES, "NCCL_PROTO")
    assert masks["allgather"] == (ON, OFF, ON)
    assert masks["allreduce"] == (OFF, ON, ON)
    # "^LL128;allreduce:LL128": everything but LL128, but only LL128 for allreduce.
    masks = parse_list("^LL128;allreduce:LL128", T.PROTOCOL_NAMES, "NCCL_PROTO")
    assert masks["reduce_scatter"] == (ON, OFF, ON)
    assert masks["allreduce"] == (OFF, ON, OFF)
    # Case does not matter, and topoplan's function names work too.
    assert parse_list("RING;reduce_scatter:Tree", T.ALGORITHM_NAMES, "x")["reduce_scatter"][
        T.TREE] == ON


@pytest.mark.parametrize("text, message", [
    ("bogus", "unknown name 'bogus'; use one of Tree, Ring"),
    ("ring;tree", "every entry but the first needs a function prefix"),
    ("alltoall:ring", "unknown function 'alltoall'; use one of Broadcast"),
    ("", "empty"),
])
def test_parse_list_refuses_what_nccl_refuses(text, message):
    with pytest.raises(ValueError, match=message):
        parse_list(text, T.ALGORITHM_NAMES, "NCCL_ALGO")


@pytest.mark.parametrize("text, on", [
    ("ring,,tree;", {"Ring", "Tree"}),         # strtok_r: empty pieces vanish
    ("^", set(T.ALGORITHM_NAMES)),             # nothing turned off: everything on
    (":ring", {"Ring"}),                       # one piece: no prefix
    ("allreduce:tree:ring", {"Tree"}),         # a group's third piece is never read
    ("AllReduce:^nvls,NVLSTree", set(T.ALGORITHM_NAMES) - {"NVLS", "NVLSTree"}),
])
def test_parse_list_reads_what_nccl_reads(text, on):
    mask = parse_list(text, T.ALGORITHM_NAMES, "NCCL_ALGO")["allreduce"]
    assert {T.ALGORITHM_NAMES[k] for k, v in enumerate(mask) if v == ON} == on
    assert DEFAULT not in mask


@pytest.mark.parametrize("text, message", [
    (" ring", "unknown name ' ring' (NCCL keeps spaces)"),
    ("ring; allreduce:tree", "unknown function ' allreduce'"),
    ("allreduce:", "unknown name 'allreduce'"),     # one piece: a list, not a prefix
    (";ring", "every entry but the first needs a function prefix"),  # not at offset 0
    ("::", "names neither a function nor anything to run"),          # NCCL reads NULL
    (";", "empty"),
])
def test_parse_list_refuses_what_nccl_refuses_to_the_letter(text, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_list(text, T.ALGORITHM_NAMES, "NCCL_ALGO")


@pytest.mark.parametrize("names", [T.ALGORITHM_NAMES, T.PROTOCOL_NAMES])
def test_parse_list_is_nccls_parse_list(names):
    # Against tuning.cc's parseList transcribed char by char (tests/support): the same list
    # or the same refusal, but where NCCL reads a NULL list ("::") or sees no group ("",
    # ";"), which parse_list refuses.
    defaults = [2 if name == "LL128" else 1 for name in names]   # tuning.cc:444-451
    prefixes = list(FUNCTIONS)
    pieces = [*names[:3], "RING", "ll", "Simple", "^", "bogus", " ring", ";", ";", ":", ":",
              ",", ",", "allreduce", "AllGather", "broadcast", "reducescatter", ""]
    rng = random.Random(41)
    for _ in range(3000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 7)))
        want = nccl_parse_list(text, prefixes, names, [defaults] * len(prefixes))
        try:
            masks = parse_list(text, names, "X")
            got: object = [[defaults[e] if v == DEFAULT else v for e, v in
                            enumerate(masks[FUNCTIONS[f]])] for f in prefixes]
        except ValueError:
            got = "error"
        if want == "crash" or not text.strip(";"):
            want = "error"
        assert got == want, text


# ---- the model, forced -----------------------------------------------------------------
def test_forcing_the_algorithm_and_protocol():
    cluster = loads_cluster(h100())
    assert nccl_time(cluster, GiB).algorithm == "NVLS"        # NCCL's own choice
    ring = nccl_time(cluster, GiB, algo="ring")
    assert (ring.algorithm, ring.forced) == ("Ring", "NCCL_ALGO=ring")
    assert ring.time_s > nccl_time(cluster, GiB).time_s
    small = nccl_time(cluster, 1024, proto="^ll,ll128")
    assert small.protocol == "Simple"
    assert nccl_time(cluster, 1024).protocol == "LL"
    with pytest.raises(ValueError, match="no algorithm for allreduce .* with NCCL_ALGO=pat"):
        nccl_time(cluster, GiB, algo="pat")               # PAT does not run allreduce
    # A forced model's choices never leak into NCCL's own: the caches are per setting.
    assert nccl_model(cluster).choose("allreduce", GiB).algorithm == "NVLS"


@pytest.mark.parametrize("make, algo, proto", [
    (h100, "ring", None), (h100, None, "^ll,ll128"), (lambda: rails(2), "tree", "simple"),
    (lambda: rails(2), "ring;allreduce:nvls,nvlstree", None),
])
def test_a_forced_model_shares_the_search_and_loads_not_the_tables(make, algo, proto):
    cluster = loads_cluster(make())
    own = nccl_model(cluster)
    sizes = [1024, 1 << 20, 64 << 20, GiB]
    for size in sizes:                       # NCCL's own choices fill the shared caches
        own.candidates("allreduce", size)
    forced = nccl_model(cluster, algo=algo, proto=proto)
    assert forced._box_graphs is own._box_graphs and forced.graphs is own.graphs
    assert forced._unit is own._unit and forced._totals is own._totals
    assert forced._tables is not own._tables
    # ... and prices every size as a model built forced from scratch does.
    fresh = NcclModel(cluster, algo=algo, proto=proto)
    for size in sizes:
        assert forced.candidates("allreduce", size) == fresh.candidates("allreduce", size)
    assert nccl_model(cluster).candidates("allreduce", GiB) == NcclModel(cluster).candidates(
        "allreduce", GiB)


def test_group_time_takes_the_settings_too():
    cluster = loads_cluster(rails(2))
    whole, _, _ = nccl_group_time(cluster, range(cluster.nranks), "allreduce", GiB,
                                  algo="ring", proto="simple", version="2.28")
    assert whole == nccl_time(cluster, GiB, algo="ring", proto="simple", version="2.28")
    assert (whole.algorithm, whole.protocol, whole.version) == ("Ring", "Simple", "2.28")
    assert whole.forced == "NCCL_ALGO=ring NCCL_PROTO=simple"


def test_listing_ll128_turns_it_on_where_nccl_would_not_by_default():
    # tuning.cc:446: LL128 is 2 ("on where the hardware rules allow") unless listed; a
    # listed LL128 is 1 and skips those rules. Two GPUs on PCIe get no LL128 by default.
    pcie = loads_cluster("name: p\nboxes: [{name: b, gpus: 2, gpu: A100, fabric: "
                         "{bandwidth: 24 GB/s, kind: pcie}}]\n")
    assert "LL128" not in {c.protocol for c in nccl_model(pcie).candidates("allreduce", GiB)}
    forced = nccl_model(pcie, proto="ll128").candidates("allreduce", GiB)
    assert {c.protocol for c in forced} == {"LL128"}
    assert parse_list("simple", T.PROTOCOL_NAMES, "p")["allreduce"][T.LL128] == OFF
    assert DEFAULT not in parse_list("ll", T.PROTOCOL_NAMES, "p")["allreduce"]


def test_settings_reach_every_price_inside_them_and_nest():
    cluster = loads_cluster(rails(2))
    own = nccl_time(cluster, GiB)
    with nccl_settings(algo="ring") as outer:
        assert outer.forced == "NCCL_ALGO=ring"
        assert nccl_time(cluster, GiB).algorithm == "Ring"
        with nccl_settings(proto="simple", version="2.28"):
            inner = nccl_time(cluster, GiB)
            assert (inner.algorithm, inner.protocol, inner.version) == ("Ring", "Simple", "2.28")
            assert current().forced == "NCCL_ALGO=ring NCCL_PROTO=simple"
    assert current().forced == "" and nccl_time(cluster, GiB) == own
    with pytest.raises(ValueError, match="unknown NCCL version"):
        with nccl_settings(version="3.0"):
            pass


def test_plan_and_simulate_take_the_same_arguments():
    cluster = topoplan.load_cluster(DGX)
    schedule = topoplan.plan(cluster, "ring", size="64MiB", nccl_algo="tree",
                             nccl_version="2.28")
    assert (schedule.meta["nccl"]["nccl_algorithm"], schedule.meta["nccl"]["nccl_forced"],
            schedule.meta["nccl"]["nccl_version"]) == ("Tree", "NCCL_ALGO=tree", "2.28")
    report = topoplan.simulate(cluster, schedule, "64MiB", nccl_algo="ring",
                               nccl_proto="simple")
    assert report.nccl.label().startswith("Ring/Simple")
    assert topoplan.simulate(cluster, schedule, "64MiB").nccl.forced == ""
    with pytest.raises(topoplan.PlannerError, match="NCCL_PROTO='LL9': unknown name"):
        topoplan.plan(cluster, "ring", nccl_proto="LL9")


# ---- the CLI -----------------------------------------------------------------------------
def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "topoplan", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=120)


def test_cli_plan_forced_row_says_so():
    result = run_cli("plan", DGX, "-a", "ring", "--nccl-algo", "tree", "--nccl-version", "2.28",
                     "--json")
    assert result.returncode == 0, result.stderr
    row = next(c for c in json.loads(result.stdout)["candidates"] if c["algorithm"] == "nccl")
    assert (row["nccl_algorithm"], row["nccl_forced"], row["nccl_version"]) == (
        "Tree", "NCCL_ALGO=tree", "2.28")
    text = run_cli("plan", DGX, "-a", "ring", "--nccl-algo", "tree")
    assert "NCCL 2.30 with NCCL_ALGO=tree runs here, Tree/" in " ".join(text.stdout.split())


@pytest.mark.parametrize("args, message", [
    (("--nccl-algo", "bogus"), "argument --nccl-algo: NCCL_ALGO='bogus': unknown name"),
    (("--nccl-proto", "ll;ring"), "argument --nccl-proto:"),
    (("--nccl-version", "1.0"), "argument --nccl-version: unknown NCCL version '1.0'"),
])
def test_cli_bad_settings_exit_2_naming_the_flag(args, message):
    result = run_cli("plan", DGX, *args)
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr


def test_cli_forcing_an_algorithm_nccl_cannot_run_is_one_error_line():
    result = run_cli("plan", DGX, "-a", "ring", "--nccl-algo", "nvls")
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "topoplan: error: the nccl row: NCCL has no algorithm for allreduce on 'dgx-a100-x4' "
        "with NCCL_ALGO=nvls; NCCL itself stops there ('No algorithm/protocol available ... "
        "NCCL_ALGO=nvls')"]


def test_cli_simulate_takes_them_too(tmp_path):
    plan = tmp_path / "ring.json"
    assert run_cli("plan", DGX, "-a", "ring", "-o", str(plan)).returncode == 0
    result = run_cli("simulate", DGX, str(plan), "--sizes", "64MiB", "--nccl-algo", "ring",
                     "--json")
    assert result.returncode == 0, result.stderr
    assert "NCCL_ALGO=ring" in result.stdout
    text = run_cli("simulate", DGX, str(plan), "--sizes", "64MiB", "--nccl-algo", "tree",
                   "--nccl-version", "2.27")
    assert "nccl: what NCCL 2.27 with NCCL_ALGO=tree runs here" in " ".join(text.stdout.split())
