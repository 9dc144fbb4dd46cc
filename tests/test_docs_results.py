"""docs/RESULTS.md is a page of current tables, each with what made it, and the docs'
links to each other's sections lead somewhere."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "RESULTS.md"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
HEADING = re.compile(r"(#{1,6}) (.*)")


def _pieces(path: Path) -> list[tuple[str, str]]:
    """The page as ``(kind, text)`` pieces: ``heading``, ``table`` (a Markdown table or a
    fenced block without a language, the benchmarks' own printout), or ``text``."""
    pieces: list[tuple[str, str]] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            kind = "table" if line.strip() == "```" else "text"  # ```sh: a command
            pieces.append((kind, "\n".join(lines[i:end + 1])))
            i = end + 1
        elif line.startswith("|"):
            end = i
            while end + 1 < len(lines) and lines[end + 1].startswith("|"):
                end += 1
            pieces.append(("table", "\n".join(lines[i:end + 1])))
            i = end + 1
        elif HEADING.match(line):
            pieces.append(("heading", line))
            i += 1
        else:
            pieces.append(("text", line))
            i += 1
    return pieces


def test_every_result_says_what_made_it_when():
    """After each table, before the next table or heading: "Made by" the command (a script
    in scripts/ or a topoplan command), the commit and the date it was measured at."""
    pieces = _pieces(RESULTS)
    missing = []
    for n, (kind, text) in enumerate(pieces):
        if kind != "table" or text.startswith("| question |"):  # the page's contents
            continue
        after = []
        for later_kind, later in pieces[n + 1:]:
            if later_kind != "text":
                break
            after.append(later)
        note = " ".join(after)
        made = re.search(r"Made by (.*)", note, re.S)
        first = text.splitlines()[1 if text.startswith("```") else 0][:60]
        if not made:
            missing.append(f"{first!r}: no 'Made by' line after it")
            continue
        said = made.group(1)
        if not re.search(r"scripts/\w+\.py|topoplan[ .]\w+", said):
            missing.append(f"{first!r}: 'Made by' names no script or topoplan command")
        if not re.search(r"commit `[0-9a-f]{7,}`", said):
            missing.append(f"{first!r}: 'Made by' names no commit (commit `abc1234`)")
        if not re.search(r"\b20\d\d-\d\d-\d\d\b", said):
            missing.append(f"{first!r}: 'Made by' names no date (YYYY-MM-DD)")
    assert not missing, "docs/RESULTS.md:\n" + "\n".join(missing)


def test_the_scripts_and_commits_results_names_exist():
    text = RESULTS.read_text(encoding="utf-8")
    scripts = set(re.findall(r"\bscripts/(\w+\.py)", text))
    assert scripts and all((ROOT / "scripts" / s).is_file() for s in scripts), \
        sorted(s for s in scripts if not (ROOT / "scripts" / s).is_file())
    commits = set(re.findall(r"commit `([0-9a-f]{7,})`", text))
    try:
        shallow = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=ROOT,
                                 capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return  # not a git checkout: nothing to look the commits up in
    if shallow == "true":
        return
    unknown = [c for c in sorted(commits)
               if subprocess.run(["git", "cat-file", "-e", f"{c}^{{commit}}"], cwd=ROOT,
                                 capture_output=True).returncode != 0]
    assert not unknown, f"docs/RESULTS.md names commits this repository does not have: {unknown}"


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    for kind, text in _pieces(path):
        if kind == "heading":
            slug = _slug(HEADING.match(text).group(2))  # type: ignore[union-attr]
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            found.add(slug if n == 0 else f"{slug}-{n}")
    return found


def test_links_to_a_section_of_a_doc_find_it():
    broken = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for target, anchor in re.findall(r"\]\(([^)\s#]*)#([^)\s]+)\)", text):
            page = (doc.parent / target) if target else doc
            if not page.is_file():
                broken.append(f"{doc.relative_to(ROOT)}: {target} does not exist")
            elif anchor not in _anchors(page):
                broken.append(f"{doc.relative_to(ROOT)}: {target or doc.name}#{anchor} "
                              "names no heading there")
    assert not broken, "\n".join(broken)
