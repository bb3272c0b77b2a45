"""Where a test run's time went: each pass's wall time and the slowest tests of the whole run.

``scripts/test.sh`` runs every pass with ``--junitxml=.ci/state/junit-PASS.xml`` and appends
``PASS SECONDS EXIT`` to ``.ci/state/passes.txt``; this prints both, so a CI log shows which
tests cost the time and the numbers stay on disk after the run.

    python scripts/test_times.py [STATE_DIR] [--slowest N]
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def slowest(state: Path, n: int) -> list[tuple[float, str, str]]:
    """The ``n`` slowest test cases (seconds, pass, test id) over every pass's JUnit XML."""
    cases = []
    for xml in sorted(state.glob("junit-*.xml")):
        pass_name = xml.stem.removeprefix("junit-")
        for case in ET.parse(xml).getroot().iter("testcase"):
            test_id = f"{case.get('classname', '')}::{case.get('name', '')}"
            cases.append((float(case.get("time") or 0), pass_name, test_id))
    return sorted(cases, reverse=True)[:n]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("state", nargs="?", default=Path(__file__).resolve().parents[1] / ".ci" / "state", type=Path)
    parser.add_argument("--slowest", type=int, default=25)
    args = parser.parse_args(argv)
    passes = args.state / "passes.txt"
    total = 0
    print("pass times (wall clock, set-up excluded):")
    for line in passes.read_text().splitlines() if passes.exists() else []:
        name, seconds, rc = line.split()
        total += int(seconds)
        print(f"  {name:<12} {int(seconds) // 60:3d}:{int(seconds) % 60:02d}  exit {rc}")
    print(f"  {'sum':<12} {total // 60:3d}:{total % 60:02d}  (passes run in two lanes at once)")
    print(f"the {args.slowest} slowest tests of the run (setup and teardown included):")
    for seconds, pass_name, test_id in slowest(args.state, args.slowest):
        print(f"  {seconds:7.1f}s  {pass_name:<6} {test_id}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
