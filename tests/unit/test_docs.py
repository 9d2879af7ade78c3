"""The design lives in the repository (issue 33): no file cites a design kept outside it, every file and name that
docs/design.md cites exists, and BENCHMARKS.md stays a report (its summary first, under 800 lines)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCANNED: tuple[str, ...] = ("README.md", "ARCHITECTURE.md", "pyproject.toml", "Makefile", "docs", "controlplane")
SCANNED += ("agents", "pearl_cli", "pearl_site", "scripts", "benchmarks", "tests", "frontend", "examples")
TEXT = {".py", ".md", ".toml", ".sh", ".yaml", ".yml", ".html", ".js", ".css", ".cfg", ".txt", ""}
OUTSIDE = ("../" + "shared", "DESIGN" + " §", "DESIGN" + ".md")  # spelled apart so this file does not match itself
CODE_DIRS = ("controlplane", "agents", "pearl_cli", "pearl_site")


def _files() -> list[Path]:
    out: list[Path] = []
    for name in SCANNED:
        p = ROOT / name
        if p.is_file():
            out.append(p)
        elif p.is_dir():
            out += [f for f in p.rglob("*") if f.is_file() and f.suffix in TEXT and "__pycache__" not in f.parts]
    return out


def test_nothing_cites_a_design_outside_the_repository() -> None:
    found = []
    for f in _files():
        try:
            text = f.read_text()
        except UnicodeDecodeError:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            if any(s in line for s in OUTSIDE):
                found.append(f"{f.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not found, "cite docs/design.md (or another file in the repository) instead:\n" + "\n".join(found)


def test_every_path_and_name_the_design_cites_exists() -> None:
    design = (ROOT / "docs" / "design.md").read_text()
    source = "\n".join(f.read_text() for d in CODE_DIRS for f in (ROOT / d).rglob("*.py"))
    missing = []
    for token in sorted(set(re.findall(r"`([^`\n]+)`", design))):
        if " " in token or token.startswith("-") or "=" in token:
            continue  # a command, a flag or a setting, not a name
        if "/" in token:
            if not any(p.exists() for p in (ROOT / token, ROOT / "controlplane" / token, ROOT / "docs" / token)):
                missing.append(token)
        elif token.endswith((".py", ".md")):  # a module named in the sentence before, by its file name
            if not any(next((ROOT / d).rglob(token), None) for d in (*CODE_DIRS, "docs")):
                missing.append(token)
        elif not re.search(r"\b" + re.escape(token.split(".")[-1]) + r"\b", source):
            missing.append(token)
    assert not missing, f"docs/design.md cites what the code no longer has: {missing}"


def test_benchmarks_is_a_report() -> None:
    lines = (ROOT / "benchmarks" / "BENCHMARKS.md").read_text().splitlines()
    assert len(lines) < 800, "move dated follow-ups to benchmarks/history/ and keep only the current figure"
    headings = [line for line in lines if line.startswith("## ")]
    assert headings[0] == "## Summary"
