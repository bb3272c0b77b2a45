"""The sections of docs/architecture.md that the code's docstrings and the other docs cite
exist: a citation of the page followed by a quoted name names a heading (or its part before a
colon) or a bold lead-in of that page."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CITATION = re.compile(r'docs/architecture\.md,\s+"([^"]+)"')


def cited_sections() -> dict[str, list[str]]:
    """Each section name cited from the package, the benchmarks, the tests and the docs, with
    where."""
    cited: dict[str, list[str]] = {}
    for folder, pattern in (
        ("airflow_provider_torchx", "*.py"),
        ("benchmarks", "*.py"),
        ("tests", "*.py"),
        ("docs", "*.md"),
    ):
        for path in sorted((ROOT / folder).rglob(pattern)):
            for name in CITATION.findall(path.read_text()):
                cited.setdefault(" ".join(name.split()), []).append(str(path.relative_to(ROOT)))
    return cited


def test_every_cited_architecture_section_exists() -> None:
    page = (ROOT / "docs" / "architecture.md").read_text()
    headings = [m.strip() for m in re.findall(r"^#+ (.+)$", page, re.M)]
    sections = set(headings) | {h.split(":")[0] for h in headings}
    sections |= {" ".join(m.split()).rstrip(".") for m in re.findall(r"\*\*([^*]+)\*\*", page)}
    cited = cited_sections()
    assert cited  # the pattern finds the citations
    missing = {name: where for name, where in cited.items() if name not in sections}
    assert missing == {}
