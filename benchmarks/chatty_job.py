"""A chatty local job in a shared triggerer: one replica writes 200,000 lines/s for 15 s while
100 other deferred local jobs are watched, every ``TorchXJobTrigger.run()`` on one asyncio loop.

Measures, in this process (the "triggerer"): the loop's lag (a 50 ms sleeper: max and p99),
whether every line reached the captured task log exactly once and in order, RSS growth over
the run, the delay from the job's end to the trigger's event (the delay from the last line
written to it being logged is the logger's speed), and the logging rate (the chatty replica's
lines over the time from the first to the last one logged) as a ratio to a bare
``logger.info`` loop in the same run, through the same logging set-up (Airflow's, writing to
stdout, which this script captures into a file). As in a deferred task, the trigger leaves an
ended job's last lines to the resumed task's ``flush_logs``, run here on the chatty job's
event (docs/architecture.md, "In the triggerer").

    .venv/bin/python benchmarks/chatty_job.py [--rate 200000] [--seconds 15] [--others 100] [--poll 2]

Not run by CI. Jobs go to a temporary job store, removed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
import statistics
import sys
import tempfile
import textwrap
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# Writes ``rate`` numbered lines a second (about 45 bytes each) for ``seconds``, in 10 ms
# blocks, then a last line carrying the time it was written.
WRITER = textwrap.dedent(
    """
    import sys, time
    rate, seconds = int(sys.argv[1]), float(sys.argv[2])
    block = rate // 100
    out = sys.stdout
    n = 0
    start = time.time()
    for tick in range(int(seconds * 100)):
        out.write("".join(f"{i:09d} step loss=0.1234 lr=0.0003 ok\\n" for i in range(n, n + block)))
        n += block
        out.flush()
        pause = start + (tick + 1) / 100 - time.time()
        if pause > 0:
            time.sleep(pause)
    out.write(f"{n:09d} END {time.time():.6f}\\n")
    out.flush()
    """
)


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def bare_rate(n: int) -> float:
    """Lines/s of ``logger.info("%s", line)`` in a loop, through Airflow's logging set-up."""
    log = logging.getLogger("bench.bare")
    line = "[bare/0] 000000001 step loss=0.1234 lr=0.0003 ok"
    t0 = time.perf_counter()
    for _ in range(n):
        log.info("%s", line)
    return n / (time.perf_counter() - t0)


def check_log(path: Path, expected: int) -> tuple[int, int, int, float, float, float]:
    """(lines seen once, missing, repeated or out of order, first and last logging times, the
    END line's write time) of the chatty replica in the captured log (lines of Airflow's
    console format: an ISO time first, then the level and the message)."""
    nxt = 0
    bad = 0
    first = last = end_written = 0.0
    with path.open(errors="replace") as f:
        for raw in f:
            at = raw.find("[main/0] ")
            if at < 0:
                continue
            body = raw[at + len("[main/0] ") :]
            seq = int(body[:9])
            if seq != nxt:
                bad += 1
            nxt = seq + 1
            t = datetime.fromisoformat(raw.split(" ", 1)[0]).timestamp()
            first = first or t
            last = t
            if " END " in body:
                end_written = float(body.split(" END ")[1].split()[0])
    return nxt, max(0, expected + 1 - nxt), bad, first, last, end_written


async def watch(handles: list[str], poll: float, samples: dict[str, list[float]]) -> dict[str, float]:
    """Run a trigger per handle on this loop with a 50 ms sleeper; the time of each event."""
    from airflow_provider_torchx.core.runner import get_runner
    from airflow_provider_torchx.outcome import Outcome
    from airflow_provider_torchx.triggers.torchx import TorchXJobTrigger
    from airflow_provider_torchx.watch import flush_logs

    loop = asyncio.get_running_loop()
    events: dict[str, float] = {}
    counts: dict[str, int] = dict.fromkeys(handles, 0)

    async def drive(handle: str) -> None:
        trigger = TorchXJobTrigger(handle, poll_interval=poll)
        async for event in trigger.run():
            counts[handle] += 1
            events.setdefault(handle, time.time())
            if handle == handles[0]:  # the chatty job: the resumed task logs the rest
                await asyncio.to_thread(flush_logs, get_runner("bench"), Outcome.from_event(event.payload), trigger.log)

    async def sleeper() -> None:
        while True:
            t0 = loop.time()
            await asyncio.sleep(0.05)
            samples["lag"].append(loop.time() - t0 - 0.05)
            samples["rss"].append(rss_mb())

    helper = asyncio.create_task(sleeper())
    await asyncio.gather(*(drive(h) for h in handles))
    helper.cancel()
    assert all(c == 1 for c in counts.values()), counts
    return events


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=int, default=200_000)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--others", type=int, default=100)
    parser.add_argument("--poll", type=float, default=2.0)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="chatty-job-"))
    os.environ["AIRFLOW_TORCHX_STATE_DIR"] = str(work / "store")
    os.environ.setdefault("AIRFLOW_HOME", str(work / "airflow-home"))
    # The task log: Airflow's logging writes to stdout, so stdout becomes a file; the figures
    # go to a copy of the original stdout.
    out = os.fdopen(os.dup(1), "w")
    captured = work / "task.log"
    os.dup2(os.open(captured, os.O_WRONLY | os.O_CREAT | os.O_APPEND), 1)
    import airflow_provider_torchx.triggers.torchx  # noqa: F401 - sets up Airflow's logging
    from airflow_provider_torchx.core.runner import get_runner
    from airflow_provider_torchx.core.specs import AppDef, Role

    runner = get_runner("bench")
    others = [
        runner.run(AppDef("idle", roles=[Role("main", entrypoint="sleep", args=["3600"])]), "local_cwd")
        for _ in range(args.others)
    ]
    try:
        bare = bare_rate(300_000)
        writer = Role("main", entrypoint=sys.executable, args=["-c", WRITER, str(args.rate), str(args.seconds)])
        expected = int(args.rate // 100 * 100 * args.seconds)
        samples: dict[str, list[float]] = {"lag": [], "rss": []}
        rss0 = rss_mb()
        print(f"load before: {os.getloadavg()}", file=out, flush=True)
        chatty = runner.run(AppDef("chatty", roles=[writer]), "local_cwd")

        async def scenario() -> dict[str, float]:
            task = asyncio.create_task(watch([chatty, *others], args.poll, samples))
            while not runner.status(chatty).is_terminal():  # type: ignore[union-attr]
                await asyncio.sleep(0.5)
            await asyncio.sleep(args.poll + 5)
            for h in others:
                await asyncio.to_thread(runner.cancel, h)
            return await task

        events = asyncio.run(scenario())
        print(f"load after: {os.getloadavg()}", file=out, flush=True)
        sys.stdout.flush()
        seen, missing, bad, first, last, end_written = check_log(captured, expected)
        ended = runner.describe_app(chatty).ended or float("nan")  # type: ignore[union-attr]
        lag = samples["lag"]
        ours = seen / (last - first) if last > first else float("nan")
        p99 = statistics.quantiles(lag, n=100)[98]
        rows = [
            ("figure", "measured", "goal"),
            ("---", "---", "---"),
            (
                "lines written / in the task log",
                f"{expected + 1} / {seen} (missing {missing}, repeated or out of order {bad})",
                "every line once",
            ),
            ("loop lag max; p99", f"{max(lag) * 1000:.0f} ms; {p99 * 1000:.0f} ms", "< 100 ms; < 50 ms"),
            ("RSS growth", f"{max(samples['rss']) - rss0:.0f} MB (from {rss0:.0f} MB)", "< 50 MB"),
            ("event after the job's end", f"{events[chatty] - ended:.1f} s", "<= poll + 5 s"),
            ("last line logged after it was written", f"{last - end_written:.1f} s", "(the logger's speed)"),
            ("logging rate: ours / bare logger", f"{ours:,.0f} / {bare:,.0f} lines/s = {ours / bare:.2f}", ">= 0.8"),
        ]
        for row in rows:
            print("| " + " | ".join(row) + " |", file=out)
    finally:
        for h in others:
            runner.cancel(h)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
