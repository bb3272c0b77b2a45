"""Lines/s of the log path: ``Runner.log_lines`` over a finished local replica log of
realistic lines (about 45 bytes) against plain ``for line in open(path)`` of the same file, in
the same run, interleaved, best of ``--repeat``.

    .venv/bin/python benchmarks/log_throughput.py [--lines 2000000] [--repeat 5]

Not run by CI. The job goes to a temporary job store, removed at the end.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# ``n`` lines like a training loop's, 44 bytes each with the newline.
WRITER = (
    "import sys\n"
    "n = int(sys.argv[1])\n"
    "w = sys.stdout.write\n"
    "line = 'step {:07d} loss={:.4f} lr=3.0e-04 gn=1.25\\n'.format\n"
    "for i in range(0, n, 1000):\n"
    "    w(''.join(line(j, j % 997 / 997) for j in range(i, min(n, i + 1000))))\n"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lines", type=int, default=2_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="log-throughput-"))
    os.environ["AIRFLOW_TORCHX_STATE_DIR"] = str(work / "store")
    from airflow_provider_torchx.core.runner import get_runner
    from airflow_provider_torchx.core.specs import AppDef, Role

    try:
        runner = get_runner("bench")
        app = AppDef("log", roles=[Role("main", entrypoint=sys.executable, args=["-c", WRITER, str(args.lines)])])
        handle = runner.run(app, "local_cwd")
        runner.wait(handle, wait_interval=0.1)
        sched, app_id = runner._scheduler_app_id(handle)
        _, path, _ = sched._log_file(app_id, "main", 0, None)  # type: ignore[attr-defined]
        size = os.path.getsize(path)
        print(f"log: {args.lines:,} lines, {size / args.lines:.1f} bytes a line; load {os.getloadavg()}")
        ours: list[float] = []
        plain: list[float] = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            n = sum(1 for _ in runner.log_lines(handle, "main", 0))
            ours.append(n / (time.perf_counter() - t0))
            assert n == args.lines, n
            t0 = time.perf_counter()
            with open(path) as f:
                n = sum(1 for _ in f)
            plain.append(n / (time.perf_counter() - t0))
        best_ours, best_plain = max(ours), max(plain)
        print("| reader | best lines/s |")
        print("| --- | --- |")
        print(f"| `Runner.log_lines` | {best_ours / 1e6:.2f} M |")
        print(f"| `for line in open(path)` | {best_plain / 1e6:.2f} M |")
        print(f"ratio ours / plain: {best_ours / best_plain:.2f} (goal >= 1.0)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
