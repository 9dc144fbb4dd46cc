"""topoplan.runtime.calibrate.cache and ``topoplan calibrate`` on the cache: the key keeps
jobs apart, every rank gets the same profile (from rank 0's cache alone), the environment
variable and the cache folder are read as documented, a bad file never stops a job.

The collectives run on real threads (:class:`Local`); the command runs real MPI ranks.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import topoplan.runtime.calibrate.cache as cache
import topoplan.runtime.calibrate.profile as calibrate_profile
from tests.support.clusters import switch_cluster, topology_path
from topoplan.analysis.cost import CostProfile, get_profile, loads_profile
from topoplan.cli import main
from topoplan.cluster import load_cluster
from topoplan.errors import TopoplanError, TopoplanWarning
from topoplan.ir.fingerprint import cluster_fingerprint
from topoplan.runtime.calibrate import (CacheKey, cache_root, cached_profiles, calibration_mode,
                                        host_set, job_key, job_profile, lookup,
                                        runtime_of_profile, runtime_of_transport,
                                        shipped_profile_for, store, transport_family)
from topoplan.runtime.transports import Local

ROOT = Path(__file__).resolve().parents[1]

#: A calibrated profile's shape, without measuring anything (as YAML reads it back: costs
#: in microseconds, to 6 significant digits).
MEASURED = loads_profile(CostProfile("measured", alpha_box=5e-6, alpha_network=5e-6, op_overhead=1e-6,
                       step_overhead=2e-6, call_overhead=10e-6, reduce_bandwidth=3e10,
                       host_bandwidth=1e10, host_ranks=2,
                       calibration={"transport": "local",
                                    "date": "2026-01-02T03:04:05Z"}).dumps())


@pytest.fixture(autouse=True)
def xdg(tmp_path, monkeypatch) -> Path:
    """Every test's own cache, and no TOPOPLAN_CALIBRATE from outside."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("TOPOPLAN_CALIBRATE", raising=False)
    return tmp_path / "xdg" / "topoplan" / "profiles"


def _key(**changes) -> CacheKey:
    fields = {"transport": "mpi", "nranks": 2, "hosts": ("node01",),
              "cluster": switch_cluster(2)}
    fields.update(changes)
    transport = fields.pop("transport")
    return CacheKey.make(transport, **fields)


def _no_measuring(monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("measured although a profile is cached")
    monkeypatch.setattr(calibrate_profile, "measure_all", refuse)


def _fake_measuring(monkeypatch, profile: CostProfile = MEASURED) -> list[int]:
    """A calibration that measures nothing and fits ``profile``; counts the measurements."""
    calls: list[int] = []
    monkeypatch.setattr(calibrate_profile, "measure_all",
                        lambda transport, **kw: calls.append(transport.rank))
    monkeypatch.setattr(calibrate_profile, "fit_measured",
                        lambda transport, measured, *, name, progress=None:
                        profile.with_costs(name=name))
    return calls


# ---- names: the folder, the transports, the runtimes, the environment -------------------

def test_cache_root_follows_the_xdg_base_directory_spec(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "c"))
    assert cache_root() == tmp_path / "c" / "topoplan" / "profiles"
    home = tmp_path / "home" / ".cache" / "topoplan" / "profiles"
    for ignored in ("", "relative/cache"):  # the spec: empty or relative is ignored
        monkeypatch.setenv("XDG_CACHE_HOME", ignored)
        assert cache_root() == home
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_root() == home
    assert not home.exists()  # nothing made until a profile is stored


@pytest.mark.parametrize("name, family, shipped, runtime", [
    ("mpi", "mpi", "mpi", "mpi"),
    ("torch", "gloo", "gloo", "gloo"),
    ("gloo", "gloo", "gloo", "gloo"),
    ("torch/gloo", "gloo", "gloo", "gloo"),
    ("torch/nccl", "torch-nccl", "nccl", "nccl"),
    ("nccl", "nccl", "nccl", "nccl"),
    ("local", "local", "mpi", "local"),
])
def test_transport_names(name, family, shipped, runtime):
    assert transport_family(name) == family
    assert shipped_profile_for(name) == shipped and runtime_of_transport(name) == runtime


def test_a_transport_object_and_an_unknown_name():
    local = Local.launch(1, lambda t: (shipped_profile_for(t), transport_family(t)))[0]
    assert local == ("mpi", "local")
    with pytest.raises(TopoplanError, match="unknown transport 'ucx': expected one of"):
        shipped_profile_for("ucx")


def test_runtime_of_shipped_and_calibrated_profiles():
    assert [runtime_of_profile(n) for n in ("mpi", "gloo", "nccl", "ideal")] == \
        ["mpi", "gloo", "nccl", None]
    # The shipped mpi and gloo profiles are calibrated: their record says so too.
    assert get_profile("gloo").calibration["transport"].startswith("torch/gloo (")
    assert runtime_of_profile(get_profile("nccl").with_costs(alpha_box=1e-6)) == "nccl"
    for text, runtime in (("mpi (Open MPI v5.0.11)", "mpi"),
                          ("torch/gloo (torch 2.13.0+cpu)", "gloo"),
                          ("torch/nccl (torch 2.13.0)", "nccl"),
                          ("nccl (NCCL 2.21.5, CuPy)", "nccl"),
                          ("local", "local"), ("something else", None)):
        # named "nccl" on purpose: the record wins over the name
        profile = CostProfile("nccl", calibration={"transport": text})
        assert runtime_of_profile(profile) == runtime, text
    assert runtime_of_profile(CostProfile("mine")) is None


@pytest.mark.parametrize("value, mode", [
    (None, None), ("", None), ("0", "off"), ("off", "off"), (" OFF ", "off"), ("1", "auto"),
    ("auto", "auto"), ("refresh", "refresh"), ("Refresh", "refresh"),
])
def test_calibration_mode(value, mode, monkeypatch):
    if value is not None:
        monkeypatch.setenv("TOPOPLAN_CALIBRATE", value)
    assert calibration_mode() == mode
    assert calibration_mode(value if value is not None else "") == mode


@pytest.mark.parametrize("value", ["yes", "2", "true", "refresh!"])
def test_calibration_mode_refuses_other_values(value):
    with pytest.raises(TopoplanError) as info:
        calibration_mode(value)
    assert str(info.value) == (f"TOPOPLAN_CALIBRATE={value!r}: use 0 or off (never calibrate), "
                               "1 or auto (calibrate when no profile is cached) or refresh "
                               "(measure again), or leave it unset")


# ---- collectives on threads: every rank the same answer ----------------------------------

@pytest.mark.parametrize("text", ["", "a", "sixsix", "seven!!", "ünïcode ✓\n" * 50])
def test_rank_0s_text_reaches_every_rank(text):
    got = Local.launch(3, lambda t: cache._broadcast_text(t, text if t.rank == 0 else None))
    assert got == [text] * 3


def test_host_set_is_the_sorted_hosts_on_every_rank(monkeypatch):
    assert Local.launch(3, host_set) == [(socket.gethostname(),)] * 3
    names = ["node-b", "node-a", "node-b", "nœud-ç"]
    here = threading.local()
    monkeypatch.setattr(cache.socket, "gethostname", lambda: here.name)

    def run(t):
        here.name = names[t.rank]
        return host_set(t), job_key(t)

    results = Local.launch(4, run)
    assert [hosts for hosts, _ in results] == [("node-a", "node-b", "nœud-ç")] * 4
    keys = [key for _, key in results]
    assert len(set(keys)) == 1 and keys[0].host_names == ("node-a", "node-b", "nœud-ç")
    assert keys[0] == CacheKey.make("local", nranks=4, hosts=["node-b", "nœud-ç", "node-a"])


# ---- the key and the files --------------------------------------------------------------

def test_a_profile_is_found_by_its_own_key_only(xdg):
    key = _key()
    assert key.fingerprint == cluster_fingerprint(switch_cluster(2))
    assert key.path.parent == xdg
    assert key.path.name == (f"{key.fingerprint.removeprefix('sha256:')}-mpi-n2-"
                             f"{key.hosts[:12]}.yaml")
    assert lookup(key) is None
    path = store(key, MEASURED)
    assert path == key.path and path.exists()
    found = lookup(key)
    assert found == MEASURED and found.calibration["cache"]["hosts"] == ("node01",)
    others = [_key(cluster=switch_cluster(2, bandwidth="20 GB/s")), _key(cluster=None),
              _key(transport="torch"), _key(transport="local"), _key(nranks=4),
              _key(hosts=("node01", "node02")), _key(hosts=("node02",))]
    assert len({k.path for k in others} | {key.path}) == len(others) + 1
    assert all(lookup(other) is None for other in others)
    # The names of the files keep the same apart (those of the command's --show).
    assert _key(cluster=None).path.name.startswith("host-mpi-n2-")
    assert _key(transport="torch/nccl").path.name.split("-")[1:3] == ["torch", "nccl"]


def test_a_bad_key_is_refused():
    with pytest.raises(TopoplanError, match="cache key: nranks 0: expected an integer >= 1"):
        CacheKey("host", "mpi", 0, "0123456789abcdef")
    with pytest.raises(TopoplanError, match="fingerprint 'x': expected 'host' or a cluster"):
        CacheKey("x", "mpi", 2, "0123456789abcdef")
    with pytest.raises(TopoplanError, match="transport 'torch/gloo': expected a family"):
        CacheKey("host", "torch/gloo", 2, "0123456789abcdef")


@pytest.mark.parametrize("content, why", [
    ("name: [unclosed\n", "is not a cost profile"),
    ("just text\n", "is not a cost profile"),
    (b"\xff\xfe\x00binary", "cannot be read"),
    ("name: mine\nalpha: 3 us\n", "records no cache key"),
    (None, "holds the profile of another key"),
])
def test_an_unusable_cached_file_is_ignored_with_a_warning(content, why):
    key = _key()
    key.path.parent.mkdir(parents=True)
    if content is None:  # another key's file under this key's name
        key.path.write_text(store(_key(nranks=4), MEASURED).read_text())
    elif isinstance(content, bytes):
        key.path.write_bytes(content)
    else:
        key.path.write_text(content)
    with pytest.warns(TopoplanWarning, match=rf"{key.path.name}: cached cost profile ignored: "
                                             rf"it {why}"):
        assert lookup(key) is None
    listed = {e.path: e for e in cached_profiles()}
    assert listed[key.path].profile is None and listed[key.path].problem.startswith(why)


def test_cached_profiles_filter_by_cluster_transport_and_ranks():
    a = store(_key(), MEASURED)
    b = store(_key(nranks=4), MEASURED)
    c = store(_key(transport="torch", cluster=None), MEASURED)
    (a.parent / "notes.yaml").write_text("not ours\n")  # other files are left alone

    def paths(**filters):
        return [e.path for e in cached_profiles(**filters)]

    assert sorted(paths()) == sorted([a, b, c])
    assert sorted(paths(cluster=switch_cluster(2))) == sorted([a, b])
    assert paths(cluster="host") == [c] and paths(transport="torch/gloo") == [c]
    assert paths(nranks=4) == [b] and paths(nranks=4, transport="gloo") == []


# ---- job_profile ----------------------------------------------------------------------

def test_job_profile_calibrates_once_and_every_rank_gets_the_same(monkeypatch):
    """A real calibration on two threads, cached; then the cache, measuring nothing."""
    cluster = switch_cluster(2)
    lines: list[str] = []
    first = Local.launch(2, lambda t: job_profile(t, cluster, calibrate_missing=True,
                                                  progress=lines.append))
    (p0, s0), (p1, s1) = first
    path = CacheKey.make("local", nranks=2, hosts=[socket.gethostname()], cluster=cluster).path
    assert s0 == s1 == f"calibrated now (cached in {path})"
    # Equal costs, and the same record: rank 1 got rank 0's text.
    assert p0 == p1 and dict(p0.calibration) == dict(p1.calibration)
    assert p0.name == "local-n2" and p0.calibration["cache"]["ranks"] == 2
    assert lookup(CacheKey.from_dict(p0.calibration["cache"])) == p0
    assert path.read_text().startswith("# Cost profile cached by topoplan for local, 2 ranks on")
    assert any(line.startswith("no cached profile for local, 2 ranks") for line in lines)
    assert runtime_of_profile(p0) == "local"

    _no_measuring(monkeypatch)
    again = Local.launch(2, lambda t: job_profile(t, cluster, calibrate_missing=True))
    assert again == [(p0, f"cache {path}")] * 2
    # Another cluster, or no cluster, is another key: not this profile.
    assert Local.launch(2, lambda t: job_profile(t))[1] == (get_profile("mpi"), "shipped mpi")
    other = switch_cluster(2, bandwidth="20 GB/s")
    assert Local.launch(2, lambda t: job_profile(t, other))[0][1] == "shipped mpi"


def test_only_rank_0s_cache_counts(monkeypatch, tmp_path):
    """Ranks on other hosts may not see rank 0's files: rank 0 decides for all, and hands
    them the profile; a file only another rank sees is not used by anyone."""
    roots = [tmp_path / "rank0", tmp_path / "rank1"]
    here = threading.local()
    monkeypatch.setattr(cache, "cache_root", lambda: here.root)
    _no_measuring(monkeypatch)
    key = CacheKey.make("local", nranks=2, hosts=[socket.gethostname()])

    def run(t):
        here.root = roots[t.rank]
        return job_profile(t, calibrate_missing=False)

    for owner, expected in ((0, "cache"), (1, "shipped")):
        here.root = roots[owner]
        path = store(key, MEASURED)
        results = Local.launch(2, run)
        assert results[0] == results[1], owner
        profile, source = results[0]
        if expected == "cache":
            assert source == f"cache {path}" and profile == MEASURED
            assert not (roots[1] / path.name).exists()
        else:
            assert (profile, source) == (get_profile("mpi"), "shipped mpi")
        path.unlink()


def test_calibrate_missing_off_gives_the_shipped_profile_and_stores_nothing(xdg):
    results = Local.launch(2, lambda t: job_profile(t))
    assert results == [(get_profile("mpi"), "shipped mpi")] * 2
    assert not xdg.exists()
    # One rank: nothing to measure, even when asked.
    assert Local.launch(1, lambda t: job_profile(t, calibrate_missing=True))[0][1] == "shipped mpi"


def test_the_environment_decides_over_the_arguments(monkeypatch, xdg):
    calls = _fake_measuring(monkeypatch)
    monkeypatch.setenv("TOPOPLAN_CALIBRATE", "off")
    assert Local.launch(2, lambda t: job_profile(t, calibrate_missing=True, refresh=True))[0] \
        == (get_profile("mpi"), "shipped mpi")
    assert calls == [] and not xdg.exists()
    monkeypatch.setenv("TOPOPLAN_CALIBRATE", "auto")
    sources = [s for _, s in Local.launch(2, lambda t: job_profile(t))]
    assert sorted(calls) == [0, 1] and sources[0] == sources[1]
    assert sources[0].startswith("calibrated now (cached in ")
    assert [s for _, s in Local.launch(2, lambda t: job_profile(t))][0].startswith("cache ")
    monkeypatch.setenv("TOPOPLAN_CALIBRATE", "refresh")
    assert Local.launch(2, lambda t: job_profile(t))[0][1].startswith("calibrated now")
    assert sorted(calls) == [0, 0, 1, 1]
    # topoplan calibrate's own options are not overridden.
    monkeypatch.setenv("TOPOPLAN_CALIBRATE", "off")
    assert Local.launch(2, lambda t: job_profile(t, refresh=True, environment=False))[0][1] \
        .startswith("calibrated now")


def _caught(fn):
    """``fn(t)``'s error as the rank's result: a thread rank that raises leaves its world
    and breaks the barrier that its peers may still be waking from (Local's harness), so
    that an error agreed right after a collective would reach them as a broken barrier."""
    def run(t):
        try:
            return fn(t)
        except TopoplanError as exc:
            return exc
    return run


def test_a_bad_environment_is_every_ranks_error(monkeypatch):
    monkeypatch.setenv("TOPOPLAN_CALIBRATE", "sometimes")
    errors = Local.launch(3, _caught(lambda t: job_profile(t, calibrate_missing=True)))
    assert all(isinstance(e, TopoplanError) for e in errors), errors
    assert {str(e) for e in errors} == {str(errors[0])}
    assert str(errors[0]).startswith("TOPOPLAN_CALIBRATE='sometimes': use 0 or off")


def test_a_fit_that_fails_on_rank_0_fails_every_rank(monkeypatch):
    _fake_measuring(monkeypatch)

    def broken(transport, measured, **kw):
        raise ZeroDivisionError("no samples")
    monkeypatch.setattr(calibrate_profile, "fit_measured", broken)
    errors = Local.launch(2, _caught(lambda t: job_profile(t, calibrate_missing=True)),
                          timeout=10)
    assert [str(e) for e in errors] == ["rank 0: ZeroDivisionError: no samples"] * 2
    assert all(isinstance(e, TopoplanError) for e in errors)


def test_a_cache_that_cannot_be_written_still_gives_the_profile(monkeypatch, tmp_path):
    _fake_measuring(monkeypatch)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))  # the folder cannot be made
    with pytest.warns(TopoplanWarning, match="the profile measured now is not cached: "):
        results = Local.launch(2, lambda t: job_profile(t, calibrate_missing=True))
    assert results[0] == results[1]
    profile, source = results[0]
    assert source.startswith("calibrated now (not cached: ") and profile.name == "local-n2"


# ---- the command ------------------------------------------------------------------------

@pytest.mark.parametrize("argv, message", [
    (["--show", "-o", "x.yaml"], "argument -o/--output: not allowed with argument --show"),
    (["--clear", "--show"], "argument --show: not allowed with argument --clear"),
    (["--refresh", "-o", "x.yaml", "-n", "2"], "argument -o/--output: not allowed with "
                                               "argument --refresh"),
    (["-n", "2", "-o", "x.yaml", "--cluster", "c.yaml"],
     "argument --cluster: not allowed with argument -o/--output"),
    (["--show", "--quick"], "argument --quick: not allowed with argument --show"),
    (["--clear", "--name", "x"], "argument --name: not allowed with argument --clear"),
])
def test_bad_combinations_are_argparse_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        main(["calibrate", *argv])
    err = capsys.readouterr().err
    assert info.value.code == 2 and f"topoplan calibrate: error: {message}" in err, err


def test_show_and_clear_an_empty_or_filtered_cache(capsys, xdg):
    assert main(["calibrate", "--show"]) == 0
    assert capsys.readouterr().out == (f"no cached profile yet in {xdg}; make one with: "
                                       "topoplan calibrate --transport mpi -n N --quick\n")
    assert main(["calibrate", "--show", "-n", "3", "--transport", "torch"]) == 0
    assert "make one with: topoplan calibrate --transport torch -n 3 --quick" in \
        capsys.readouterr().out
    kept, gone = store(_key(), MEASURED), store(_key(nranks=4), MEASURED)
    assert main(["calibrate", "--clear", "-n", "4"]) == 0
    assert capsys.readouterr().out == f"removed {gone}\n"
    assert kept.exists() and not gone.exists()
    assert main(["calibrate", "--show", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [p["file"] for p in shown["profiles"]] == [str(kept)]
    assert shown["profiles"][0]["hosts"] == ["node01"] and "profile" not in shown
    assert main(["calibrate", "--clear"]) == 0 and not kept.exists()
    assert main(["calibrate", "--clear"]) == 0
    assert capsys.readouterr().out.endswith(f"no cached profile to remove in {xdg}\n")


def _run(*argv: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "topoplan", *argv], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=240)


@pytest.mark.mpi
def test_cli_calibrates_into_the_cache_then_shows_and_reuses_it(tmp_path):
    pytest.importorskip("mpi4py")
    cluster = str(topology_path("dgx1_v100"))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XDG_CACHE_HOME": str(tmp_path / "xdg"),
           "TOPOPLAN_CALIBRATE": "off"}  # the command's own options decide, not this
    first = _run("calibrate", "--quick", "--cluster", cluster, "-n", "2", env=env)
    assert first.returncode == 0, first.stderr
    files = list((tmp_path / "xdg" / "topoplan" / "profiles").iterdir())
    assert len(files) == 1 and files[0].name.endswith(".yaml")
    path = files[0]
    assert f"cached in {path}" in first.stdout and "calibrate: repeat 5/5 done" in first.stderr
    assert "per-step cost" in first.stdout  # the fit's tables, as with -o
    record = cache._read(path, None)[0].calibration["cache"]
    assert record["ranks"] == 2 and record["transport"] == "mpi"
    assert record["fingerprint"] == cluster_fingerprint(load_cluster(cluster))

    shown = _run("calibrate", "--show", env=env)
    assert shown.returncode == 0, shown.stderr
    line = shown.stdout.splitlines()[1]
    assert line.startswith(f"{path.name}  mpi  2 ranks  {socket.gethostname()}  20")
    assert "mpi-n2: alpha" in line
    full = _run("calibrate", "--show", "--cluster", cluster, "-n", "2", env=env)
    assert full.stdout.startswith(f"{path}: mpi, 2 ranks on {socket.gethostname()}, cluster sha256:")
    assert "per-step cost" in full.stdout

    before = path.read_text()
    again = _run("calibrate", "--quick", "--cluster", cluster, "-n", "2", "--json", env=env)
    assert again.returncode == 0, again.stderr
    data = json.loads(again.stdout)
    assert data["reused"] is True and data["source"] == f"cache {path}"
    assert data["file"] == str(path) and data["profile"]["name"] == "mpi-n2"
    assert "repeat" not in again.stderr and path.read_text() == before  # nothing measured
