"""What describing N live Slurm jobs costs: our scheduler's one call per round for every watched
job vs TorchX's own ``slurm`` scheduler describing them one by one.

Runs on the test cluster (``scripts/slurm.sh``, ``SLURM_CONF``). N jobs are submitted held
(``sbatch --hold``: PENDING, using no node) from our dry run (our comment and labels), then:

1. ours: every job is looked at through ``SlurmScheduler.describe_future_as`` (what each
   deferred task's trigger does) and the round's answers awaited, ``--rounds`` times (the
   poller's pacing between rounds off: a round's own cost);
2. TorchX: ``SlurmScheduler.describe`` of ``torchx-nightly`` (in its own venv,
   ``scripts/torchx-venv.sh``: ``$TORCHX_TEST_TORCHX_VENV`` or ``.venv-torchx``) for every job,
   one after the other, ``--rounds`` times, in a child process of that venv.

For each: Slurm client calls per round (every ``subprocess`` call counted), wall time per round,
calls per second, and CPU per round (the process and the Slurm clients it ran). All jobs are
cancelled at the end.

    .venv/bin/python benchmarks/slurm_watch.py [--jobs 100] [--rounds 5]
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def cpu_now() -> float:
    """CPU seconds of this process and of the children it waited for (the Slurm clients)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def count_calls() -> collections.Counter[str]:
    """Count every ``subprocess.run``/``Popen`` from here on (asyncio's subprocesses too), by
    program name; returns the live counter."""
    calls: collections.Counter[str] = collections.Counter()
    original = subprocess.Popen.__init__

    def counted(self: Any, args: Any, *rest: Any, **kw: Any) -> None:
        program = args if isinstance(args, str | bytes | os.PathLike) else args[0]
        calls[os.path.basename(os.fsdecode(program))] += 1
        original(self, args, *rest, **kw)

    subprocess.Popen.__init__ = counted  # type: ignore[method-assign]
    return calls


def submit_held(sched: Any, n: int, job_dir: str, ids: list[str], workers: int = 4) -> None:
    """Submit ``n`` held jobs (``sbatch --hold``: PENDING, using no node) from our scheduler's
    dry run (our comment and labels), ``workers`` ``sbatch`` calls at a time; each id is
    appended to ``ids`` as it comes (what to cancel should a later one fail)."""
    from airflow_provider_torchx.core.specs import AppDef, Resource, Role

    app = AppDef(name="held", roles=[Role(name="r", entrypoint="true", resource=Resource(1, 0, 10))])
    info = sched.submit_dryrun(app, {"job_dir": job_dir}, labels={"airflow.dag_id": "bench"})
    args = ["--hold", *info.request.args]

    def one(_: int) -> None:
        ids.append(sched.commands.sbatch(args, info.request.script))

    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        list(pool.map(one, range(n)))


def cancel_jobs(ids: Sequence[str], batch: int = 200) -> dict[str, float]:
    """``scancel`` the jobs ``batch`` at a time; when each job's call returned (``time.time()``)."""
    ends = {}
    for start in range(0, len(ids), batch):
        chunk = ids[start : start + batch]
        subprocess.run(["scancel", *chunk], check=False)
        ends.update(dict.fromkeys(chunk, time.time()))
    return ends


def measure(rounds: int, one_round: Callable[[], None], calls: collections.Counter[str]) -> dict[str, float]:
    """Per round: Slurm calls, wall seconds, CPU seconds; and calls per second over all."""
    walls, cpus, before_calls = [], [], calls.total()
    for _ in range(rounds):
        wall, cpu = time.perf_counter(), cpu_now()
        one_round()
        walls.append(time.perf_counter() - wall)
        cpus.append(cpu_now() - cpu)
    total = calls.total() - before_calls
    walls.sort()
    return {
        "calls_per_round": total / rounds,
        "round_s_median": walls[len(walls) // 2],
        "calls_per_s": total / sum(walls),
        "cpu_s_per_round": sum(cpus) / rounds,
    }


def torchx_child(ids: Sequence[str], rounds: int) -> None:
    """In TorchX's venv: describe every job one by one, ``rounds`` times; print the figures."""
    from torchx.schedulers.slurm_scheduler import create_scheduler  # type: ignore[import-not-found]

    calls = count_calls()
    sched = create_scheduler("bench")
    states: list[str] = []

    def one_round() -> None:
        states[:] = [str(d.state) if (d := sched.describe(app_id)) else "None" for app_id in ids]

    figures = measure(rounds, one_round, calls)
    print(json.dumps({**figures, "states": sorted(set(states))}))


def ours(ids: Sequence[str], rounds: int, sched: Any, calls: collections.Counter[str]) -> dict[str, Any]:
    states: list[str] = []

    def one_round() -> None:
        futures = [sched.describe_future_as(app_id, lambda d: d.state.name if d else "None") for app_id in ids]
        states[:] = [f.result(timeout=120) for f in futures]

    return {**measure(rounds, one_round, calls), "states": sorted(set(states))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--torchx-child", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.torchx_child is not None:
        torchx_child(args.torchx_child, args.rounds)
        return

    from airflow_provider_torchx.core.schedulers.slurm.record import JobIndex
    from airflow_provider_torchx.core.schedulers.slurm.scheduler import SlurmScheduler

    venv = Path(os.environ.get("TORCHX_TEST_TORCHX_VENV", REPO / ".venv-torchx"))
    if not (venv / "bin" / "python").is_file():
        sys.exit(f"no TorchX venv at {venv}: run scripts/torchx-venv.sh")
    calls = count_calls()
    with tempfile.TemporaryDirectory(prefix="slurm-watch-") as tmp:
        sched = SlurmScheduler("bench", index=JobIndex(Path(tmp) / "index"))
        sched.poller.min_interval = 0.0  # rounds back to back: the round's own cost, not the poll pacing
        t0 = time.perf_counter()
        ids: list[str] = []
        try:
            submit_held(sched, args.jobs, tmp, ids)
            submit_s = time.perf_counter() - t0
            mine = ours(ids, args.rounds, sched, calls)
            child = subprocess.run(
                [str(venv / "bin" / "python"), __file__, "--rounds", str(args.rounds), "--torchx-child", *ids],
                capture_output=True,
                text=True,
                check=True,
            )
            theirs = json.loads(child.stdout.strip().splitlines()[-1])
        finally:
            cancel_jobs(ids)
            sched.close()
    load = os.getloadavg()[0]
    print(f"{args.jobs} held jobs (submitted in {submit_s:.1f} s), {args.rounds} rounds, load {load:.2f}")
    print(f"{'':8} {'calls/round':>12} {'round (median)':>15} {'calls/s':>8} {'CPU/round':>10}  states")
    for name, fig in (("ours", mine), ("TorchX", theirs)):
        print(
            f"{name:8} {fig['calls_per_round']:12.1f} {fig['round_s_median']:14.3f}s {fig['calls_per_s']:8.1f} "
            f"{fig['cpu_s_per_round']:9.3f}s  {','.join(fig['states'])}"
        )
    print(
        f"TorchX / ours: {theirs['calls_per_round'] / mine['calls_per_round']:.0f}x the calls, "
        f"{theirs['round_s_median'] / mine['round_s_median']:.0f}x the round time, "
        f"{theirs['cpu_s_per_round'] / mine['cpu_s_per_round']:.0f}x the CPU"
    )


if __name__ == "__main__":
    main()
