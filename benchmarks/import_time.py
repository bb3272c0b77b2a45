"""Import time of ``airflow_provider_torchx.operators.torchx`` next to ``airflow.sdk``'s.

Each import runs in a fresh interpreter (so nothing is cached in ``sys.modules``), several
times, interleaved; the script prints the medians and the ratios of the operator to
``import airflow.sdk`` (lazy: loads little) and to ``from airflow.sdk import BaseOperator`` (what
any operator module pays). The difference to the latter is the provider's own cost (no boto3,
botocore or docker: those load only when a backend needs them).

Run: ``.venv/bin/python benchmarks/import_time.py [--repeat N]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

TARGETS = {
    "airflow.sdk": "import airflow.sdk",
    "sdk.BaseOperator": "from airflow.sdk import BaseOperator",
    "operators.torchx": "import airflow_provider_torchx.operators.torchx",
}
_TIMER = "import time; t = time.perf_counter(); {stmt}; print(time.perf_counter() - t)"


def time_import(stmt: str, env: dict[str, str]) -> float:
    """Seconds one fresh interpreter spends on ``stmt``."""
    out = subprocess.run(
        [sys.executable, "-c", _TIMER.format(stmt=stmt)], env=env, capture_output=True, text=True, check=True
    ).stdout
    return float(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="fresh interpreters per target (default 5)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="import-bench-") as home:
        env = {**os.environ, "AIRFLOW_HOME": home, "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
        time_import(TARGETS["operators.torchx"], env)  # warm the file-system and bytecode caches
        samples: dict[str, list[float]] = {name: [] for name in TARGETS}
        for _ in range(args.repeat):
            for name, stmt in TARGETS.items():
                samples[name].append(time_import(stmt, env))
    medians = {name: statistics.median(values) for name, values in samples.items()}
    for name, values in samples.items():
        print(
            f"{name:18s} median {medians[name]:.3f}s  (min {min(values):.3f}s, max {max(values):.3f}s, n={len(values)})"
        )
    for ref in ("airflow.sdk", "sdk.BaseOperator"):
        ratio = medians["operators.torchx"] / medians[ref]
        extra = medians["operators.torchx"] - medians[ref]
        print(f"ratio operators.torchx / {ref}: {ratio:.2f}  (difference {extra:+.3f}s)")


if __name__ == "__main__":
    main()
