"""The mutation fuzzer of ``scripts/fuzz_inputs.py`` at a fixed seed: every mutated
cluster file, schedule file and cost profile through the CLI ends in a result or a located
one-line error, never a traceback, a hang or memory without bound."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _fuzzer():
    spec = importlib.util.spec_from_file_location("fuzz_inputs",
                                                  ROOT / "scripts" / "fuzz_inputs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["fuzz_inputs"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_mutated_inputs_end_in_a_result_or_a_located_error():
    fuzz = _fuzzer()
    # 60 + 60 + 40 cases: about 25 s here (2 cores); scripts/fuzz_inputs.py --cases 200
    # runs more
    cases = fuzz.run_all(fuzz.make_cases(60, 60, seed=20261201, nprofile=40), timeout=20.0,
                         memory_mb=1024)
    failed = [c for c in cases if c.get("outcome") not in ("ok", "located error")]
    assert not failed, "\n".join(
        f"{c['kind']} from {c['base']} ({c['what']}): {c['outcome']}: {c['detail']}\n"
        f"{c['text'][:800]}" for c in failed[:3]) + "\n" + fuzz.table(cases)
    assert {c["outcome"] for c in cases} == {"ok", "located error"}


def test_the_fuzzer_tells_a_traceback_from_a_located_error(tmp_path, monkeypatch):
    fuzz = _fuzzer()
    assert fuzz._run_cli(["topo", "lint", str(ROOT / "topologies" / "ddl_two_switch.yaml")],
                         10.0)[0] == "ok"
    missing = str(tmp_path / "none.yaml")
    outcome, detail = fuzz._run_cli(["topo", "lint", missing], 10.0)
    assert outcome == "located error" and detail.startswith(f"topoplan: error: {missing}")

    import topoplan.cluster.spec as spec

    def broken(*args, **kwargs):
        raise ZeroDivisionError("a bug")
    monkeypatch.setattr(spec, "loads_cluster", broken)
    monkeypatch.setattr(spec, "load_cluster", lambda path: broken())
    import topoplan.commands.topo as topo
    monkeypatch.setattr(topo, "load_cluster", lambda path: broken())
    outcome, detail = fuzz._run_cli(["topo", "lint", missing], 10.0)
    assert outcome == "traceback" and "ZeroDivisionError" in detail

    def slow(path):
        import time
        time.sleep(5)
    monkeypatch.setattr(topo, "load_cluster", slow)
    assert fuzz._run_cli(["topo", "lint", missing], 0.2)[0] == "hang"
