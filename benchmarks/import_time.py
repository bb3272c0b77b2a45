"""Import time of ``airflow_provider_torchx.operators.torchx`` over ``from airflow.sdk import BaseOperator``.

Each fresh interpreter first imports ``BaseOperator`` (what any operator module pays), then the
operator module, and reports the wall and CPU time of each step: the second step is the
provider's own cost. Timing both steps in one interpreter keeps the difference out of the
noise of Airflow's import (seconds on a loaded machine). The script prints the medians over
``--repeat`` interpreters, the difference and the ratio to ``BaseOperator``'s import, and the
Airflow modules the operator module loaded beyond ``BaseOperator``'s (none of
``airflow.triggers`` or ``airflow.listeners``: they load when a task defers or a plugin runs).

Bytecode caches are written first (``PYTHONDONTWRITEBYTECODE`` is dropped): a deployment
imports compiled modules, so compiling them is not part of the figure.

``--baseline DIR`` also times the operator module of another source tree (the package
directory's parent, e.g. ``git archive <commit> airflow_provider_torchx | tar -x -C DIR``),
interleaved with the rest: before and after a change in one run.

Run: ``.venv/bin/python benchmarks/import_time.py [--repeat N] [--baseline DIR]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

MODULE = "airflow_provider_torchx.operators.torchx"
_TIMER = f"""
import json, sys, time
w0, c0 = time.perf_counter(), time.process_time()
from airflow.sdk import BaseOperator
w1, c1 = time.perf_counter(), time.process_time()
before = set(sys.modules)
import {MODULE}
w2, c2 = time.perf_counter(), time.process_time()
added = sorted(m for m in set(sys.modules) - before if m.split(".")[0] == "airflow")
print(json.dumps({{"base": [w1 - w0, c1 - c0], "ours": [w2 - w1, c2 - c1], "airflow": added}}))
"""


def time_import(env: dict[str, str]) -> dict[str, list[float]]:
    """One fresh interpreter's wall and CPU seconds: ``base`` (``BaseOperator``), ``ours`` (the
    operator module after it), and ``airflow`` (the Airflow modules ``ours`` added)."""
    out = subprocess.run(
        [sys.executable, "-c", _TIMER],
        env=env,
        cwd=env["AIRFLOW_HOME"],  # not a source tree: ``-c`` puts the working directory first on the path
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    result: dict[str, list[float]] = json.loads(out.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=15, help="fresh interpreters per tree (default 15)")
    parser.add_argument("--baseline", help="a source tree whose operator module is timed too (see the docstring)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="import-bench-") as home:
        env = {**os.environ, "AIRFLOW_HOME": home, "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        trees = {"this tree": env}
        if args.baseline:
            trees["baseline"] = {**env, "PYTHONPATH": os.path.abspath(args.baseline)}
        for tree_env in trees.values():  # warm the file-system and bytecode caches
            time_import(tree_env)
        runs: dict[str, list[dict[str, list[float]]]] = {name: [] for name in trees}
        for _ in range(args.repeat):
            for name, tree_env in trees.items():
                runs[name].append(time_import(tree_env))
    for name, samples in runs.items():
        base_wall = statistics.median(s["base"][0] for s in samples)
        base_cpu = statistics.median(s["base"][1] for s in samples)
        ours_wall = statistics.median(s["ours"][0] for s in samples)
        ours_cpu = statistics.median(s["ours"][1] for s in samples)
        print(f"{name} (n={len(samples)}):")
        print(f"  from airflow.sdk import BaseOperator  wall {base_wall * 1000:7.1f} ms  CPU {base_cpu * 1000:7.1f} ms")
        print(
            f"  then import {MODULE}: wall {ours_wall * 1000:+7.1f} ms  CPU {ours_cpu * 1000:+7.1f} ms"
            f"  (ratio to BaseOperator's: wall {ours_wall / base_wall:.3f}, CPU {ours_cpu / base_cpu:.3f})"
        )
        print(f"  Airflow modules it added: {', '.join(samples[-1]['airflow']) or 'none'}")


if __name__ == "__main__":
    main()
