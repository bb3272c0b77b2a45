"""What the parse-time checks of ``TorchXRunOperator``'s literal arguments cost a DAG file.

In fresh interpreters (interleaved, several times) the script imports the operator module,
then times the first ``TorchXRunOperator(component=..., component_args={...}, scheduler="local_cwd",
cfg={...})``
(one-time costs: resolving components, reading entry points) and the mean of the next 100,
once with the checks and once with them switched off (the reference, same run). It prints the
medians, the differences and the ratios.

Run: ``.venv/bin/python benchmarks/parse_checks.py [--repeat N]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

_PROGRAM = """
import json, time
import airflow_provider_torchx.operators.torchx as mod
if {unchecked}:
    mod.check_literal_arguments = lambda **kwargs: None
def make(i):
    cfg = {{"log_dir": "/l"}}
    return mod.TorchXRunOperator(
        task_id=f"t{{i}}", component="utils.echo", component_args={{"msg": "hi"}}, scheduler="local_cwd", cfg=cfg
    )
t = time.perf_counter(); make(0); first = time.perf_counter() - t
t = time.perf_counter()
for i in range(1, 101):
    make(i)
print(json.dumps([first, (time.perf_counter() - t) / 100]))
"""


def sample(unchecked: bool, env: dict[str, str]) -> tuple[float, float]:
    """(first operator, mean of the next 100) in seconds, in one fresh interpreter."""
    program = _PROGRAM.format(unchecked=unchecked)
    out = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, check=True).stdout
    first, each = json.loads(out.strip().splitlines()[-1])
    return float(first), float(each)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="fresh interpreters per mode (default 5)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="parse-bench-") as home:
        env = {**os.environ, "AIRFLOW_HOME": home, "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
        sample(False, env)  # warm the file-system and bytecode caches
        runs: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
        for _ in range(args.repeat):
            for unchecked in (True, False):
                runs[unchecked].append(sample(unchecked, env))
    medians = {
        unchecked: (statistics.median(r[0] for r in rs), statistics.median(r[1] for r in rs))
        for unchecked, rs in runs.items()
    }
    for unchecked, label in ((True, "checks off"), (False, "checks on")):
        first, each = medians[unchecked]
        print(f"{label:10s} first operator {first * 1000:7.1f} ms, next ones {each * 1000:6.2f} ms each")
    (first_off, each_off), (first_on, each_on) = medians[True], medians[False]
    print(f"first operator: {(first_on - first_off) * 1000:+.1f} ms (ratio {first_on / first_off:.2f})")
    print(f"each further operator: {(each_on - each_off) * 1000:+.2f} ms (ratio {each_on / each_off:.2f})")


if __name__ == "__main__":
    main()
