"""The project's own specification: docs/ describes the formats, and its examples load."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from topoplan.cluster import loads_cluster
from topoplan.ir.parse import loads_schedule
from topoplan.ir.verify import verify

ROOT = Path(__file__).resolve().parents[1]
# Built from pieces so that this file does not name them itself.
OUTSIDE = ("DESIGN" + ".md", "../" + "shared")


def tracked_files() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                             check=True).stdout
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: walk the tree
        skip = {".git", ".venv", "__pycache__", ".pytest_cache", ".mypy_cache"}
        return [p for p in ROOT.rglob("*") if p.is_file() and not skip & set(p.parts)]
    return [ROOT / name for name in out.decode().split("\0") if name]


def test_no_file_points_to_a_specification_outside_the_repository():
    offenders = []
    for path in tracked_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # images and other binaries
        offenders += [f"{path.relative_to(ROOT)}: {word}" for word in OUTSIDE if word in text]
    assert not offenders


def test_every_doc_the_code_cites_exists():
    cited = set()
    for path in (ROOT / "topoplan").rglob("*.py"):
        cited |= set(re.findall(r"docs/[A-Z_]+\.md", path.read_text(encoding="utf-8")))
    assert cited >= {"docs/CLUSTER.md", "docs/SCHEDULE.md"}
    assert all((ROOT / doc).is_file() for doc in cited), cited


def blocks(doc: str, language: str) -> list[str]:
    text = (ROOT / "docs" / doc).read_text(encoding="utf-8")
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)


def test_the_cluster_example_loads():
    cluster = loads_cluster(blocks("CLUSTER.md", "yaml")[0], "docs/CLUSTER.md")
    assert (cluster.name, cluster.nranks, len(cluster.boxes)) == ("two-leaves", 32, 4)
    assert [nic.switch for box in cluster.boxes for nic in box.nics[:1]] == \
        ["leaf0", "leaf0", "leaf1", "leaf1"]
    # The double NVLink is one link of twice the bandwidth.
    assert cluster.boxes[0].gpu_links[0].bandwidth == pytest.approx(50e9)


@pytest.mark.parametrize("version", [1, 2, 3])
def test_the_schedule_examples_load_and_verify(version):
    text = blocks("SCHEDULE.md", "json")[version - 1]
    schedule = loads_schedule(text, f"docs/SCHEDULE.md (version {version})")
    assert schedule.version == version
    assert verify(schedule).nranks == (2 if version < 3 else 4)


def test_the_code_speaks_of_the_code_not_of_the_work_behind_it():
    """No references to the tracker entries the work came from (a number, or the entry
    itself as an authority): a reader of the repository cannot look them up. Upstream
    bug reports cited as sources (nccl-tests' numbered reports) are fine."""
    # No open-ended prefix in the pattern: on a notebook's embedded pictures (long runs
    # without spaces) "\S*\s+" backtracks for minutes. The word before comes after.
    process = re.compile(r"\b(?:issues?\s+\d+|issue's)|\bthe issue\b", re.I)
    offenders = []
    for path in tracked_files():
        if path.suffix not in {".py", ".md", ".yaml", ".ipynb", ".toml", ""}:
            continue
        if path.resolve() == Path(__file__).resolve():
            continue  # the pattern itself
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        for match in process.finditer(text):
            before = text[max(0, match.start() - 80):match.start()].split()
            if before and "nccl" in before[-1].lower():
                continue
            offenders.append(f"{path.relative_to(ROOT)}: {match.group(0)!r}")
    assert not offenders


def test_no_doc_holds_a_test_runners_progress_lines():
    """A log pasted from a run beside pytest once left its dots in a results table."""
    progress = re.compile(r"^\.{20,}(\s*\[\s*\d+%\])?$|^\.{20,}```")
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    found = [f"{p.name}:{i}" for p in docs
             for i, line in enumerate(p.read_text().splitlines(), 1) if progress.match(line)]
    assert not found, found
