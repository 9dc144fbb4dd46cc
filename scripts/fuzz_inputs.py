"""Mutate cluster YAML files, schedule JSON files and cost profiles; run the CLI on each.

    PYTHONPATH=. python scripts/fuzz_inputs.py [--cases 200] [--seed 0] [--timeout 10]
                                               [--memory 1024] [--show 5]

Each case is a valid input with a few edits: for a cluster (a shipped topology), numbers
set to extremes (0, -1, 1e308, 1e-310, nan, inf, 10**30, a string), keys deleted or
written twice, a value's type changed (list, mapping, scalar), units swapped, the text
cut short; for a schedule (planned here from the shipped topologies: IR v1, v2 with chunk
ranges, v3 with native steps), fields flipped, steps and ops deleted, ranks, peers and
chunk indexes out of range, wrong types, the text cut short. A cluster case runs
``topoplan topo lint``, ``topoplan plan --size 1MiB -a ring`` and ``topoplan topo show``;
a schedule case ``topoplan verify`` and ``topoplan simulate CLUSTER PLAN --sizes 1MiB``.
A profile case (a shipped cost profile, its calibration record left out, or the ``mpi``
one with measured native collectives, edited as a cluster is) runs ``topoplan plan
--size 1MiB -a ring --profile PROFILE`` and ``topoplan simulate`` of a ring plan under it.

The cases run in a child process (a batch at a time, restarted after a crash) whose
address space is capped (``--memory`` MiB, RLIMIT_AS) and whose every command has an
alarm (``--timeout`` s): the CLI is called in-process (``topoplan.cli.main``), its output
captured. Outcomes, the worst of a case's commands:

- ``ok``: exit 0;
- ``located error``: a non-zero exit with one line on stderr, ``topoplan: error: ...``
  (or argparse's ``topoplan CMD: error: ...``), and no traceback;
- ``traceback``: an exception out of ``main``, or an error of more than one line;
- ``hang``: the alarm went off;
- ``memory``: a MemoryError, or the child killed.

Prints a table of counts per outcome and kind, then the first ``--show`` failures with
their input; exits 1 when any case failed. ``tests/test_fuzz_inputs.py`` runs a fixed
seed in CI.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Iterator

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: Shipped topologies small enough to plan many times a second (ddl_three_racks, 192
#: ranks, takes 3 s for plan -a ring: over the alarm on a loaded machine).
BASES = ("ddl_two_switch", "dgx1_v100", "ndv2_x2", "aws_p2_8xlarge", "dgx_a100_x4")
OUTCOMES = ("ok", "located error", "traceback", "hang", "memory")
EXTREMES: tuple[Any, ...] = (0, -1, 1e308, 1e-310, float("nan"), float("inf"), -float("inf"),
                             10**30, -(10**30), "abc", "", True, None, 0.5, 2**63, "1e308 GB/s",
                             "1e-310 GB/s", "1e300 us", "-5 us", "100000")
UNITS = ("GB/s", "Gbit/s", "bit/s", "TB/s", "B/s", "MiB/s", "ns", "us", "ms", "s", "xB/s", "")
ONE_LINE = re.compile(r"^topoplan( [a-z-]+)*: error: [^\n]*\n?$")


class Hang(BaseException):
    """The alarm of one command (a BaseException: no ``except Exception`` swallows it)."""


# ---- mutations ---------------------------------------------------------------------------
def _paths(node: Any, path: tuple = ()) -> Iterator[tuple]:
    yield path
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _paths(value, path + (key,))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _paths(value, path + (i,))


def _get(node: Any, path: tuple) -> Any:
    for key in path:
        node = node[key]
    return node


def _mutate_tree(rng: random.Random, data: Any, numbers_only: bool = False) -> str:
    """One edit of the parsed document ``data`` (in place); returns what was done."""
    paths = [p for p in _paths(data) if p]
    leaves = [p for p in paths if not isinstance(_get(data, p), (dict, list))]
    numeric = [p for p in leaves if isinstance(_get(data, p), (int, float))
               or re.match(r"^[\d.]+ ?[A-Za-z/]+$", str(_get(data, p)))]
    kind = "number" if numbers_only else rng.choice(
        ["number", "number", "number", "delete", "type", "string", "copy"])
    pool = numeric if kind == "number" and numeric else paths
    path = rng.choice(pool)
    parent, key = _get(data, path[:-1]), path[-1]
    old = parent[key]
    if kind == "number":
        parent[key] = rng.choice(EXTREMES)
    elif kind == "delete":
        del parent[key]
    elif kind == "type":
        parent[key] = rng.choice([[old], {"x": old}, 1, "x", None, [], {}]
                                 if not isinstance(old, (dict, list)) else
                                 [1, "x", None, list(old.values()) if isinstance(old, dict)
                                  else {str(i): v for i, v in enumerate(old)}])
    elif kind == "string":
        parent[key] = str(old) + rng.choice(["{", "}", "{i//0}", "/x", "\u0085", " "])
    else:  # copy a sibling over
        siblings = list(parent) if isinstance(parent, dict) else list(range(len(parent)))
        parent[key] = json.loads(json.dumps(parent[rng.choice(siblings)], default=str))
    return f"{kind} at {'.'.join(map(str, path))}"


def _mutate_text(rng: random.Random, text: str) -> tuple[str, str]:
    """A text-level edit: cut short, a key line written twice, a unit swapped."""
    kind = rng.choice(["truncate", "duplicate", "unit"])
    lines = text.split("\n")
    if kind == "truncate":
        return text[:rng.randrange(max(1, len(text)))], "truncate"
    if kind == "duplicate":
        keyed = [i for i, line in enumerate(lines) if re.match(r"^\s*[\w-]+:", line)]
        if keyed:
            i = rng.choice(keyed)
            lines.insert(i + 1, lines[i])
            return "\n".join(lines), f"duplicate line {i + 1}"
    units = [m for m in re.finditer(r"\b(GB/s|Gbit/s|TB/s|us|ns|ms)\b", text)]
    if units:
        m = rng.choice(units)
        return text[:m.start()] + rng.choice(UNITS) + text[m.end():], "unit"
    return text[:len(text) // 2], "truncate"


def cluster_case(rng: random.Random, texts: dict[str, str]) -> dict[str, Any]:
    import yaml
    base = rng.choice(sorted(texts))
    what = []
    if rng.random() < 0.3:
        text, done = _mutate_text(rng, texts[base])
        what.append(done)
    else:
        data = yaml.safe_load(texts[base])
        for _ in range(rng.choice([1, 1, 2, 3])):
            if not isinstance(data, dict) or not data:
                break
            what.append(_mutate_tree(rng, data))
        text = yaml.safe_dump(data, sort_keys=False) if data is not None else ""
    return {"kind": "cluster", "base": base, "what": "; ".join(what), "text": text}


def profile_texts() -> dict[str, str]:
    """The shipped cost profiles without their calibration records (free-form, read as
    they are), and ``mpi`` with measured native collectives: the bases of profile cases."""
    import yaml
    folder = ROOT / "topoplan" / "analysis" / "cost" / "profiles"
    texts = {}
    for name in ("nccl", "mpi", "gloo"):
        data = yaml.safe_load((folder / f"{name}.yaml").read_text())
        data.pop("calibration", None)
        texts[name] = yaml.safe_dump(data, sort_keys=False)
        if name == "mpi":
            data["native"] = {"allreduce": {"alpha": "30 us", "alpha_per_rank": "4 us",
                                            "bandwidth": "2 GB/s"},
                              "allgather": {"alpha": "20 us", "bandwidth": "3 GB/s"}}
            texts["mpi-native"] = yaml.safe_dump(data, sort_keys=False)
    return texts


def profile_case(rng: random.Random, texts: dict[str, str]) -> dict[str, Any]:
    case = cluster_case(rng, texts)
    case["kind"] = "profile"
    return case


def schedule_case(rng: random.Random, plans: dict[str, tuple[str, str]]) -> dict[str, Any]:
    name = rng.choice(sorted(plans))
    cluster, text = plans[name]
    what = []
    if rng.random() < 0.2:
        text, done = _mutate_text(rng, text)
        what.append(done if done == "truncate" else "truncate")
        if done != "truncate":
            text = text[:rng.randrange(max(1, len(text)))]
    else:
        data = json.loads(text)
        for _ in range(rng.choice([1, 1, 2, 3])):
            what.append(_mutate_ops(rng, data) if rng.random() < 0.6 else _mutate_tree(rng, data))
        text = json.dumps(data)  # nan and inf as JSON's readers take them: NaN, Infinity
    return {"kind": "schedule", "base": name, "cluster": cluster, "what": "; ".join(what),
            "text": text}


def _mutate_ops(rng: random.Random, data: dict) -> str:
    """Flip a field of an op, drop a step or an op, send to a bad rank or chunk."""
    ranks = data.get("ranks")
    if not isinstance(ranks, list) or not ranks:
        return "none"
    program = rng.choice(ranks)
    steps = program.get("steps") if isinstance(program, dict) else None
    if not isinstance(steps, list) or not steps:
        return "none"
    s = rng.randrange(len(steps))
    step = steps[s]
    kind = rng.choice(["flip", "peer", "chunk", "drop-step", "drop-op", "copy-op", "nranks",
                       "rank"])
    if kind == "drop-step":
        del steps[s]
    elif kind == "nranks":
        data["nranks"] = rng.choice([0, -1, 1, 10**9, len(ranks) + 1, "4", None])
    elif kind == "rank":
        program["rank"] = rng.choice([-1, len(ranks), 0, "0", None])
    elif isinstance(step, list) and step:
        j = rng.randrange(len(step))
        op = step[j]
        if kind == "drop-op":
            del step[j]
        elif kind == "copy-op":
            step.append(json.loads(json.dumps(op)))
        elif isinstance(op, dict):
            field = {"flip": rng.choice(["op", "reduce"]), "peer": "peer",
                     "chunk": rng.choice(["chunk", "count", "chunks"])}[kind]
            op[field] = rng.choice({
                "op": ["send", "recv", "native", "x", 1, None],
                "reduce": [True, False, 1, "yes", None],
            }.get(field, [-1, 10**9, len(ranks), 2**63, 0.5, "1", None, [0, 1], float("nan")]))
    return kind


# ---- running a case ----------------------------------------------------------------------
def _run_cli(argv: list[str], timeout: float) -> tuple[str, str]:
    """(outcome, detail) of ``topoplan ARGV`` in this process."""
    import warnings

    from topoplan.cli import main
    out, err = io.StringIO(), io.StringIO()

    def alarm(signum: int, frame: Any) -> None:
        raise Hang()
    # another alarm (pytest-timeout's) is put back as it was, less the time spent
    before = signal.signal(signal.SIGALRM, alarm)
    left = signal.getitimer(signal.ITIMER_REAL)[0]
    began = time.monotonic()
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
                warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # numpy's; counted by outcome
            try:
                code = main(argv)
            except SystemExit as exc:  # argparse
                code = exc.code if isinstance(exc.code, int) else 1
    except Hang:
        return "hang", f"over {timeout} s: topoplan {' '.join(argv)}"
    except MemoryError:
        return "memory", f"MemoryError: topoplan {' '.join(argv)}"
    except BaseException:  # noqa: BLE001  -- what the fuzzer is looking for
        return "traceback", traceback.format_exc(limit=-6)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)
        if left:
            signal.setitimer(signal.ITIMER_REAL, max(1e-3, left - (time.monotonic() - began)))
    stderr = err.getvalue()
    if code == 0:
        return "ok", ""
    errors = [line for line in stderr.splitlines() if not line.startswith("topoplan: warning:")
              and not line.startswith("topoplan: note:")]
    if "Traceback" in stderr or len(errors) != 1 or not ONE_LINE.match(errors[0]):
        return "traceback", f"exit {code}, stderr: {stderr[-2000:]}"
    return "located error", errors[0]


def run_case(case: dict[str, Any], folder: Path, timeout: float) -> tuple[str, str]:
    """The worst outcome of the case's commands, and its detail."""
    if case["kind"] == "cluster":
        path = folder / "cluster.yaml"
        path.write_text(case["text"], encoding="utf-8", errors="surrogatepass")
        commands = [["topo", "lint", str(path)],
                    ["plan", str(path), "--size", "1MiB", "-a", "ring"],
                    ["topo", "show", str(path)]]
    elif case["kind"] == "profile":
        path = folder / "profile.yaml"
        path.write_text(case["text"], encoding="utf-8", errors="surrogatepass")
        plan = folder / "ring.json"
        plan.write_text(case["plan"], encoding="utf-8")
        commands = [["plan", case["cluster"], "--size", "1MiB", "-a", "ring", "--profile",
                     str(path)],
                    ["simulate", case["cluster"], str(plan), "--sizes", "1MiB", "--profile",
                     str(path)]]
    else:
        path = folder / "plan.json"
        path.write_text(case["text"], encoding="utf-8", errors="surrogatepass")
        commands = [["verify", str(path)],
                    ["simulate", case["cluster"], str(path), "--sizes", "1MiB"]]
    worst, detail = "ok", ""
    for argv in commands:
        outcome, text = _run_cli(argv, timeout)
        if OUTCOMES.index(outcome) > OUTCOMES.index(worst):
            worst, detail = outcome, text
    return worst, detail


def child(cases_file: str, start: int, timeout: float, memory_mb: int) -> None:
    """Run the cases from ``start`` on, one JSON line per case on stdout."""
    import resource
    limit = memory_mb << 20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    cases = json.loads(Path(cases_file).read_text())
    import topoplan.cli  # noqa: F401  -- loaded before the first case's alarm
    with tempfile.TemporaryDirectory() as folder:
        for index in range(start, len(cases)):
            print(json.dumps({"index": index, "start": True}), flush=True)
            outcome, detail = run_case(cases[index], Path(folder), timeout)
            print(json.dumps({"index": index, "outcome": outcome, "detail": detail}),
                  flush=True)


# ---- the parent --------------------------------------------------------------------------
def make_cases(ncluster: int, nschedule: int, seed: int,
               nprofile: int = 0) -> list[dict[str, Any]]:
    import warnings

    import topoplan
    rng = random.Random(seed)
    texts = {name: (ROOT / "topologies" / f"{name}.yaml").read_text() for name in BASES}
    plans: dict[str, tuple[str, str]] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, base, algorithm in (("ring", "ddl_two_switch", "ring"),
                                      ("hierarchical", "dgx1_v100", "hierarchical"),
                                      ("composed", "ndv2_x2", "composed"),
                                      ("tree", "ddl_three_racks", "tree")):
            path = ROOT / "topologies" / f"{base}.yaml"
            schedule = topoplan.plan(topoplan.load_cluster(path), algorithm, size=1 << 20)
            plans[name] = (str(path), schedule.to_json())
    cases = [cluster_case(rng, texts) for _ in range(ncluster)]
    cases += [schedule_case(rng, plans) for _ in range(nschedule)]
    profiles = profile_texts()
    cluster, ring = plans["ring"]
    for _ in range(nprofile):
        case = profile_case(rng, profiles)
        cases.append(dict(case, cluster=cluster, plan=ring))
    return cases


def run_all(cases: list[dict[str, Any]], timeout: float = 10.0,
            memory_mb: int = 1024) -> list[dict[str, Any]]:
    """Each case's outcome (``cases[i]`` updated with ``outcome`` and ``detail``), run in
    child processes, a new one after a crash."""
    with tempfile.TemporaryDirectory() as folder:
        cases_file = Path(folder) / "cases.json"
        cases_file.write_text(json.dumps(cases))
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1",
                   PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
                   COLUMNS="100")
        start = 0
        while start < len(cases):
            proc = subprocess.Popen(
                [sys.executable, __file__, "--child", str(cases_file), str(start),
                 str(timeout), str(memory_mb)],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
            current = None
            assert proc.stdout is not None
            for line in proc.stdout:
                record = json.loads(line)
                if record.get("start"):
                    current = record["index"]
                    continue
                cases[record["index"]].update(outcome=record["outcome"],
                                              detail=record["detail"])
                current = None
            stderr = proc.stderr.read() if proc.stderr is not None else ""
            proc.wait()
            if current is None:
                if proc.returncode != 0 and start == 0 and "outcome" not in cases[0]:
                    raise RuntimeError(f"the fuzzing child failed: {stderr[-2000:]}")
                break
            # the child died in a case: out of memory (or a crash), counted as memory
            cases[current].update(outcome="memory",
                                  detail=f"the child died (exit {proc.returncode}): "
                                         f"{stderr[-500:]}")
            start = current + 1
    return cases


def table(cases: list[dict[str, Any]]) -> str:
    kinds = ("cluster", "schedule", "profile")
    rows = [f"{'outcome':<15}" + "".join(f"{k:>10}" for k in kinds) + f"{'all':>8}"]
    for outcome in OUTCOMES:
        counts = [sum(c["kind"] == k and c.get("outcome") == outcome for c in cases)
                  for k in kinds]
        rows.append(f"{outcome:<15}" + "".join(f"{n:>10}" for n in counts) + f"{sum(counts):>8}")
    totals = [sum(c["kind"] == k for c in cases) for k in kinds]
    rows.append(f"{'cases':<15}" + "".join(f"{n:>10}" for n in totals) + f"{sum(totals):>8}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=200,
                        help="cluster cases, and as many schedule and profile cases (200)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (0)")
    parser.add_argument("--timeout", type=float, default=10.0,
                        help="seconds one command may take (10)")
    parser.add_argument("--memory", type=int, default=1024,
                        help="the child's address space in MiB (1024)")
    parser.add_argument("--show", type=int, default=5, help="failures to print (5)")
    args = parser.parse_args(argv)
    cases = run_all(make_cases(args.cases, args.cases, args.seed, args.cases), args.timeout,
                    args.memory)
    print(table(cases))
    failed = [c for c in cases if c.get("outcome") not in ("ok", "located error")]
    for case in failed[:args.show]:
        print(f"\n--- {case['kind']} from {case['base']} ({case['what']}): {case['outcome']}")
        print(case["detail"])
        print("input:", case["text"][:1500])
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]))
    else:
        sys.exit(main())
