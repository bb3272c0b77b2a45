"""Benchmarks of the local scheduler (issue 3), each printed as ratios against references
measured in the same run: raw ``subprocess.Popen`` of the same processes (the limit) and
torchx 0.7.0's local scheduler (the peer), run from its own venv (``benchmarks/.torchx-venv``,
created on first use; never the project's ``.venv``).

1. submit-to-terminal wall time of an 8-replica job of ``true`` and of ``sleep 0.5``;
2. reading a finished 1,000,000-line replica log with ``log_iter``;
3. tail latency of a line written by a replica until a tailing ``log_iter`` yields it;
4. ``describe`` from a fresh process, and ``list`` of 1,000 jobs in the store.

Usage: ``.venv/bin/python benchmarks/local_bench.py [--quick] [--launch-only] [--reps N]
[--baseline DIR]`` (``--help``). Not run by CI. Jobs go to a temporary job store that is
removed at the end.

``--baseline DIR`` then compares the launch of 8 x ``sleep 0.5`` with another source tree's
(the package directory's parent, e.g. ``git archive <commit> airflow_provider_torchx | tar -x
-C DIR``): a fresh process per tree and round, alternating, several jobs each, so both see the
same load; it prints the overhead's quartiles per tree.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TORCHX_VENV = HERE / ".torchx-venv"
LOG_LINES = 1_000_000


def torchx_python() -> str:
    """The torchx 0.7.0 venv's python (created and filled on first use)."""
    python = TORCHX_VENV / "bin" / "python"
    if not python.exists():
        subprocess.run(["python3", "-m", "venv", str(TORCHX_VENV)], check=True)
        (TORCHX_VENV / ".gitignore").write_text("*\n")
        subprocess.run([str(python), "-m", "pip", "install", "-q", "torchx==0.7.0"], check=True)
    return str(python)


# Runs in the torchx venv: the same workloads through torchx 0.7.0's local scheduler.
TORCHX_CODE = textwrap.dedent(
    """
    import json, statistics, sys, time
    from torchx.schedulers.local_scheduler import create_scheduler
    from torchx.specs import AppDef, Role, is_terminal

    args = json.loads(sys.argv[1])
    sched = create_scheduler("bench")
    cfg = {"log_dir": args["log_dir"]}

    def run(cmd, n=1):
        app = AppDef("b", roles=[Role("r", image="", entrypoint=cmd[0], args=cmd[1:], num_replicas=n)])
        return sched.submit(app, cfg)

    def wait(app_id, interval):
        while not is_terminal(sched.describe(app_id).state):
            time.sleep(interval)

    out = {}
    for key, cmd, reps in (("true", ["true"], args["reps"]), ("sleep", ["sleep", "0.5"], args["sleep_reps"])):
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            wait(run(cmd, 8), 0.1)
            times.append(time.perf_counter() - t0)
        out[key] = statistics.median(times)
    if args["launch_only"]:
        print(json.dumps(out))
        sys.exit(0)
    app_id = run(["seq", "1", str(args["lines"])])
    wait(app_id, 0.05)
    rates = []
    for _ in range(3):
        t0 = time.perf_counter()
        n = sum(1 for _ in sched.log_iter(app_id, "r", 0))
        rates.append(n / (time.perf_counter() - t0))
        assert n >= args["lines"], n
    out["read_rate"] = max(rates)
    app_id = run([sys.executable, "-u", "-c", args["writer"]])
    lat = [time.time() - float(line) for line in sched.log_iter(app_id, "r", 0, should_tail=True) if line.strip()]
    out["tail"] = lat
    t0 = time.perf_counter()
    for _ in range(100):
        sched.describe(app_id)
    out["describe"] = (time.perf_counter() - t0) / 100
    sched.close()
    print(json.dumps(out))
    """
)

WRITER = "import time\nfor i in range(60):\n    print(repr(time.time()), flush=True)\n    time.sleep(0.05)\n"


def median_time(fn: Callable[[], object], reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def p(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else values[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (5 and 3)")
    parser.add_argument("--reps", type=int, help="repetitions of each submit-to-terminal job (default 15, sleep 7)")
    parser.add_argument(
        "--launch-only", action="store_true", help="only benchmark 1 (submit to terminal), ours and torchx's"
    )
    parser.add_argument("--baseline", help="a source tree to compare the launch with (see the docstring)")
    args = parser.parse_args()
    reps, sleep_reps = (5, 3) if args.quick else (15, 7)
    if args.reps:
        reps = sleep_reps = args.reps
    state = Path(tempfile.mkdtemp(prefix="local-bench-"))
    try:
        run(state, reps, sleep_reps, args.launch_only)
        if args.baseline:
            compare_launch(state / "compare", args.baseline, rounds=max(reps, 5))
    finally:
        shutil.rmtree(state, ignore_errors=True)


# Runs in a fresh process per tree: one job to warm up, then JOBS jobs of 8 x ``sleep 0.5``.
LAUNCH_CODE = textwrap.dedent(
    """
    import json, os, sys, time
    from airflow_provider_torchx.core.schedulers.local import create_cwd_scheduler
    from airflow_provider_torchx.core.specs import AppDef, Role

    sched = create_cwd_scheduler("compare")
    app = AppDef("b", roles=[Role("r", entrypoint="sleep", args=["0.5"], num_replicas=8)])

    def one():
        t0 = time.perf_counter()
        app_id = sched.submit(app)
        while not sched.describe(app_id).state.is_terminal():
            sched.wait_for_change(app_id, 0.1)
        return time.perf_counter() - t0 - 0.5

    one()
    print(json.dumps([one() for _ in range(int(sys.argv[1]))]))
    """
)


def compare_launch(state: Path, baseline: str, rounds: int, jobs: int = 3) -> None:
    """The overhead of 8 x ``sleep 0.5`` with this tree and with ``baseline``, alternating."""
    trees = {"this tree": str(HERE.parent), "baseline": os.path.abspath(baseline)}
    samples: dict[str, list[float]] = {name: [] for name in trees}
    for _ in range(rounds):
        for name, tree in trees.items():
            env = {**os.environ, "PYTHONPATH": tree, "AIRFLOW_TORCHX_STATE_DIR": str(state / name.replace(" ", "-"))}
            command = [sys.executable, "-c", LAUNCH_CODE, str(jobs)]
            out = subprocess.run(command, env=env, cwd=state.parent, capture_output=True, text=True)
            if out.returncode != 0:
                raise SystemExit(f"{name}: {out.stderr}")
            samples[name] += json.loads(out.stdout.strip().splitlines()[-1])
    print(f"\n8 x sleep 0.5 overhead, {rounds} rounds x {jobs} jobs per tree, alternating:")
    for name, values in samples.items():
        q1, q2, q3 = statistics.quantiles(values, n=4)
        print(f"  {name:10s} p25 {q1 * 1000:6.1f} ms  median {q2 * 1000:6.1f} ms  p75 {q3 * 1000:6.1f} ms")


def run(state: Path, reps: int, sleep_reps: int, launch_only: bool) -> None:
    """The benchmarks (only the first with ``launch_only``), with the job store (and torchx's
    logs) under ``state``."""
    os.environ["AIRFLOW_TORCHX_STATE_DIR"] = str(state / "store")

    from airflow_provider_torchx.core.schedulers.local import create_cwd_scheduler
    from airflow_provider_torchx.core.specs import AppDef, Role

    sched = create_cwd_scheduler("bench")

    def submit(cmd: list[str], n: int = 1) -> str:
        return sched.submit(AppDef("b", roles=[Role("r", entrypoint=cmd[0], args=cmd[1:], num_replicas=n)]))

    def wait(app_id: str) -> None:
        while not sched.describe(app_id).state.is_terminal():  # type: ignore[union-attr]
            sched.wait_for_change(app_id, 0.1)

    def raw(cmd: list[str]) -> None:
        for proc in [subprocess.Popen(cmd) for _ in range(8)]:
            proc.wait()

    print("torchx 0.7.0 reference (own venv) ...", flush=True)
    tx_args = {
        "reps": reps,
        "sleep_reps": sleep_reps,
        "lines": LOG_LINES,
        "writer": WRITER,
        "log_dir": str(state / "tx"),
        "launch_only": launch_only,
    }
    tx_proc = subprocess.run(
        [torchx_python(), "-c", TORCHX_CODE, json.dumps(tx_args)], capture_output=True, text=True, check=False
    )
    if tx_proc.returncode != 0:
        raise SystemExit(f"torchx reference failed:\n{tx_proc.stderr}")
    tx: dict[str, Any] = json.loads(tx_proc.stdout.strip().splitlines()[-1])

    rows: list[tuple[str, str, str, str, str]] = []

    def row(name: str, ours: float, ref: float | None, peer: float | None, unit: str, goal: str) -> None:
        scale = 1000.0 if unit == "ms" else 1.0

        def versus(other: float | None) -> str:
            return f"{other * scale:9.1f} ({ours / other:5.2f}x)" if other else "n/a"

        rows.append((name, f"{ours * scale:9.1f} {unit}", versus(ref), versus(peer), goal))

    # 1. submit to terminal
    for key, cmd, n in (("true", ["true"], reps), ("sleep", ["sleep", "0.5"], sleep_reps)):
        ours = median_time(lambda cmd=cmd: wait(submit(cmd, 8)), n)  # type: ignore[misc]
        ref = median_time(lambda cmd=cmd: raw(cmd), n)  # type: ignore[misc]
        if key == "sleep":
            row("8 x sleep 0.5: overhead", ours - 0.5, ref - 0.5, tx["sleep"] - 0.5, "ms", "< 100 ms")
        else:
            row("8 x true: submit->terminal", ours, ref, tx["true"], "ms", "< 100 ms")
    if launch_only:
        show(rows)
        return

    # 2. reading a finished 1M-line log
    app_id = submit(["seq", "1", str(LOG_LINES)])
    wait(app_id)
    path = str(sched.describe_native(app_id).request.role_params["r"][0].combined)  # type: ignore[union-attr]

    def plain_read() -> None:
        with open(path) as f:
            assert sum(1 for _ in f) == LOG_LINES

    def ours_read() -> None:
        assert sum(1 for _ in sched.log_iter(app_id, "r", 0)) == LOG_LINES

    # best of 3 each, interleaved (the first pass over a fresh file is the slowest for both)
    ours_times, plain_times = [], []
    for _ in range(3):
        ours_times.append(median_time(ours_read, 1))
        plain_times.append(median_time(plain_read, 1))
    ours_rate, plain_rate = LOG_LINES / min(ours_times), LOG_LINES / min(plain_times)
    rows.append(
        (
            "read 1M-line log",
            f"{ours_rate / 1e6:9.2f} M/s",
            f"{plain_rate / 1e6:9.2f} ({ours_rate / plain_rate:5.2f}x)",
            f"{tx['read_rate'] / 1e6:9.2f} ({ours_rate / tx['read_rate']:5.2f}x)",
            ">= 5 M lines/s",
        )
    )

    # 3. tail latency
    app_id = submit([sys.executable, "-u", "-c", WRITER])
    lat = [time.time() - float(line) for line in sched.log_iter(app_id, "r", 0, should_tail=True) if line.strip()]
    proc = subprocess.Popen([sys.executable, "-u", "-c", WRITER], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    raw_lat = [time.time() - float(line) for line in proc.stdout if line.strip()]
    proc.wait()
    for q in (50, 95):
        row(f"tail latency p{q}", p(lat, q), p(raw_lat, q), p(tx["tail"], q), "ms", "p95 < 50 ms" if q == 95 else "")

    # 4. describe from a fresh process; list of 1,000 jobs
    running = submit(["sleep", "30"])
    code = textwrap.dedent(
        f"""
        import json, time
        t0 = time.perf_counter()
        from airflow_provider_torchx.core.schedulers.local import create_cwd_scheduler
        sched = create_cwd_scheduler("fresh")
        t1 = time.perf_counter()
        sched.describe({running!r})
        t2 = time.perf_counter()
        for _ in range(100):
            sched.describe({running!r})
        t3 = time.perf_counter()
        print(json.dumps({{"import": t1 - t0, "first": t2 - t1, "each": (t3 - t2) / 100}}))
        """
    )
    fresh = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout)
    sched.cancel(running)
    wait(running)
    row("describe, fresh process: 1st", fresh["first"], None, None, "ms", "< 5 ms")
    row("describe, running job: each", fresh["each"], None, tx["describe"], "ms", "< 5 ms")

    done = sched.store.job_dir(app_id)
    for i in range(1000):
        new_id = f"copy-{i:04d}"
        shutil.copytree(done, sched.store.job_dir(new_id))
    code = textwrap.dedent(
        """
        import json, time
        from airflow_provider_torchx.core.schedulers.local import create_cwd_scheduler
        sched = create_cwd_scheduler("fresh")
        t0 = time.perf_counter()
        n = len(sched.list())
        t1 = time.perf_counter()
        print(json.dumps({"n": n, "list": t1 - t0}))
        """
    )
    listed = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout)

    def raw_list() -> None:
        for name in os.listdir(sched.store.root):
            if name.startswith("."):  # the index of ended jobs (.finished.json)
                continue
            with open(os.path.join(sched.store.root, name, "request.json"), "rb") as f:
                json.loads(f.read())

    row(f"list of {listed['n']} jobs, fresh process", listed["list"], median_time(raw_list, 3), None, "ms", "< 1 s")

    show(rows)
    print(f"\n(python import of the local scheduler in a fresh process: {fresh['import'] * 1000:.0f} ms)")


def show(rows: list[tuple[str, str, str, str, str]]) -> None:
    print(f"\n{'benchmark':34} {'ours':>12} {'raw/plain (ours/ref)':>22} {'torchx 0.7.0 (ours/tx)':>24}  goal")
    for r in rows:
        print(f"{r[0]:34} {r[1]:>12} {r[2]:>22} {r[3]:>24}  {r[4]}")


if __name__ == "__main__":
    main()
