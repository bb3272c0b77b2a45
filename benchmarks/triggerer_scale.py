"""N deferred jobs in one triggerer: ``TorchXJobTrigger`` side by side with the Amazon
provider's ``BatchJobTrigger`` on the same moto server, plus 200 deferred local jobs.

A triggerer runs every trigger's ``run()`` generator on one asyncio loop; so does each
contender here, in a process of its own (ours from the project's ``.venv``; the Amazon
provider from ``benchmarks/.amazon-venv``, created on first use with ``apache-airflow==3.3.2``
and ``apache-airflow-providers-amazon[aiobotocore]``, about 2.5 min; never the project's venv).

1. A moto server of its own on loopback (no containers); N Batch jobs per contender, rendered
   by our scheduler and kept PENDING by a dependency that never finishes.
2. Each contender runs N triggers (``poll_interval``/``waiter_delay`` = ``--poll``), a 50 ms
   sleeper measuring the loop's lag and a neighbour trigger timing ``asyncio.to_thread(noop)``
   every 0.5 s. After a warm-up (and, for ours, once every trigger looked its app id up:
   ``ListJobs`` by name, once per job in a fresh process; the time is printed as start-up) it
   measures a steady phase: CPU % of one core (process time / wall time), RSS, AWS calls/s
   (counted from the moto server's request log, by path).
3. Then every job is terminated (``TerminateJob``, one after the other); the time from each
   job's end (the call returned) to its trigger's event is measured; each trigger must fire
   exactly one event.
4. The same for ``--local`` deferred local jobs (``sleep``), ended by ``Runner.cancel``.

    .venv/bin/python benchmarks/triggerer_scale.py [--n 500] [--poll 10] [--local 200] [--quick]

``--n 2000`` is the big case; ``--quick`` shortens the phases; ``--no-amazon`` / ``--no-local``
/ ``--no-batch`` skip parts. Not run by CI. Prints a table and the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import logging
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
AMAZON_VENV = HERE / ".amazon-venv"
AMAZON_PACKAGES = ["apache-airflow==3.3.2", "apache-airflow-providers-amazon[aiobotocore]"]
REGION = "us-east-1"
FAKE_CREDS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_SESSION_TOKEN": "testing"}


# ---------------------------------------------------------------------- contender (one loop)


def rss_mb() -> float:
    """This process's resident set size in MB (``/proc/self/status``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


_PROTOCOL = sys.stdout


def say(**fields: Any) -> None:
    """One JSON line to the orchestrator."""
    _PROTOCOL.write("@@ " + json.dumps(fields) + "\n")
    _PROTOCOL.flush()


def make_triggers(kind: str, targets: list[str], poll: float) -> list[Any]:
    """The contender's triggers, one per job (``targets``: app handles or Batch job ids)."""
    if kind == "ours":
        from airflow_provider_torchx.triggers.torchx import TorchXJobTrigger

        return [TorchXJobTrigger(t, region_name=REGION, poll_interval=poll) for t in targets]
    from airflow.providers.amazon.aws.triggers.batch import BatchJobTrigger

    return [
        BatchJobTrigger(
            job_id=t, region_name=REGION, aws_conn_id=None, waiter_delay=int(poll), waiter_max_attempts=100000
        )
        for t in targets
    ]


async def contend(
    kind: str, targets: list[str], poll: float, warmup: float, steady: float, wait_end: float, go_file: str
) -> None:
    """Run the triggers as a triggerer does and report the figures (see the module docstring)."""
    loop = asyncio.get_running_loop()
    triggers = make_triggers(kind, targets, poll)
    events: dict[int, list[tuple[float, str]]] = {i: [] for i in range(len(triggers))}
    lags: list[float] = []
    neighbour: list[float] = []
    inflight: list[float] = []
    phase = {"measure": False}

    async def drive(i: int, trigger: Any) -> None:
        try:
            async for event in trigger.run():
                payload = getattr(event, "payload", event)
                status = payload.get("status") if isinstance(payload, dict) else str(payload)
                events[i].append((time.time(), str(status)))
        except Exception as err:  # a trigger that raises ends its task with an error event
            events[i].append((time.time(), f"raised {type(err).__name__}"))

    async def sleeper() -> None:
        while True:
            t0 = loop.time()
            await asyncio.sleep(0.05)
            if phase["measure"]:
                lags.append(loop.time() - t0 - 0.05)

    async def neighbour_trigger() -> None:
        while True:
            t0 = time.perf_counter()
            inflight.append(t0)
            await asyncio.to_thread(lambda: None)
            inflight.remove(t0)
            if phase["measure"]:
                neighbour.append(time.perf_counter() - t0)
            await asyncio.sleep(0.5)

    helpers = [asyncio.create_task(sleeper()), asyncio.create_task(neighbour_trigger())]
    tasks = [asyncio.create_task(drive(i, t)) for i, t in enumerate(triggers)]
    await asyncio.sleep(warmup)
    while not os.path.exists(go_file):  # the orchestrator says when every trigger is started
        await asyncio.sleep(0.5)
    phase["measure"] = True
    say(mark="steady-start", t=time.time())
    cpu0, wall0 = time.process_time(), time.monotonic()
    rss: list[float] = []
    while time.monotonic() - wall0 < steady:
        await asyncio.sleep(1.0)
        rss.append(rss_mb())
    cpu = (time.process_time() - cpu0) / (time.monotonic() - wall0) * 100
    steady_lags, steady_neighbour = list(lags), list(neighbour)
    say(mark="steady-end", t=time.time())
    # The orchestrator now ends every job; wait for the events.
    deadline = time.monotonic() + wait_end
    while time.monotonic() < deadline and not all(t.done() for t in tasks):
        await asyncio.sleep(0.2)
    stuck = [time.perf_counter() - t0 for t0 in inflight]
    for task in [*tasks, *helpers]:
        task.cancel()
    say(
        result={
            "cpu": cpu,
            "rss": max(rss) if rss else rss_mb(),
            "lags": steady_lags,
            "lags_all": lags,
            "neighbour": steady_neighbour,
            "neighbour_all": neighbour + stuck,
            "events": {targets[i]: ev for i, ev in events.items()},
        }
    )


def contender_main(args: argparse.Namespace) -> None:
    global _PROTOCOL
    # Like a triggerer's task log handler, every trigger's records go to a file: Airflow's
    # logging writes to stdout, so stdout becomes that file and the messages to the
    # orchestrator take a copy of the original stdout.
    _PROTOCOL = os.fdopen(os.dup(1), "w")
    log_fd = os.open(args.log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(log_fd, 1)
    logging.basicConfig(level=logging.INFO, stream=sys.stdout)
    targets = json.loads(Path(args.targets).read_text())
    asyncio.run(contend(args.contender, targets, args.poll, args.warmup, args.steady, args.wait_end, args.go_file))


# ---------------------------------------------------------------------- orchestrator


def amazon_python() -> str:
    """The Amazon provider venv's python (created and filled on first use)."""
    python = AMAZON_VENV / "bin" / "python"
    if not (AMAZON_VENV / ".installed").exists():
        subprocess.run(["python3", "-m", "venv", str(AMAZON_VENV)], check=True)
        (AMAZON_VENV / ".gitignore").write_text("*\n")
        subprocess.run([str(python), "-m", "pip", "install", "-q", *AMAZON_PACKAGES], check=True)
        (AMAZON_VENV / ".installed").write_text(" ".join(AMAZON_PACKAGES) + "\n")
    return str(python)


class MotoLog:
    """The moto server's request log (werkzeug's access lines on stderr): calls by path."""

    LINE = re.compile(r'"(?:GET|POST|PUT|DELETE|HEAD) (\S+)')

    def __init__(self, path: Path) -> None:
        self.path = path

    def calls(self) -> collections.Counter[str]:
        """Requests so far by path (Batch's REST paths; CloudWatch's JSON calls are all ``/``)."""
        with self.path.open(errors="replace") as f:
            return collections.Counter(m.group(1) for m in map(self.LINE.search, f) if m)


def start_moto(work: Path) -> tuple[subprocess.Popen[bytes], str, MotoLog]:
    """A moto server on a free loopback port (jobs on the services' Docker engine), logging its
    requests to ``work/moto.log``."""
    import socket
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sys.path.insert(0, str(REPO))
    from tests.fixtures.aws import services_env

    # Moto's Batch keeps a job PENDING while a dependency is unfinished only when it runs jobs
    # with Docker (without, it lets them succeed); no container starts for such a job.
    env = {**os.environ, **FAKE_CREDS, "AWS_DEFAULT_REGION": REGION, "MOTO_DOCKER_NETWORK_MODE": "none"}
    env.update(services_env())
    env.pop("AWS_ENDPOINT_URL", None)
    log_path = work / "moto.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log_path.open("wb"),
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(f"{url}/moto-api/data.json", timeout=2).read()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("moto_server did not start") from None
            time.sleep(0.1)
    return proc, url, MotoLog(log_path)


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def run_contender(
    python: str,
    kind: str,
    targets: list[str],
    args: argparse.Namespace,
    work: Path,
    env: dict[str, str],
    end_jobs: Any,
    moto: MotoLog | None,
    lookups: int = 0,
) -> dict[str, Any]:
    """Run one contender; its steady phase starts after the warm-up once the moto server saw
    ``lookups`` ListJobs calls; ``end_jobs()`` (called after the steady phase) ends every job
    and returns ``{target: end time}``. Returns the figures."""
    targets_file = work / f"{kind}-{len(targets)}-targets.json"
    go_file = work / f"{kind}-{len(targets)}-go"
    targets_file.write_text(json.dumps(targets))
    cmd = [
        python,
        str(Path(__file__).resolve()),
        "--contender",
        kind,
        "--targets",
        str(targets_file),
        "--poll",
        str(args.poll),
        "--warmup",
        str(args.warmup),
        "--steady",
        str(args.steady),
        "--wait-end",
        str(args.wait_end),
        "--log-file",
        str(work / f"{kind}-{len(targets)}.log"),
        "--go-file",
        str(go_file),
    ]
    started = time.monotonic()
    before = moto.calls() if moto else collections.Counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True, cwd=str(REPO))
    startup: list[float] = []

    def start_steady_phase() -> None:
        """The steady phase starts once every trigger had its first status: ours first looks
        each app id up (``ListJobs`` by name, once per job in a fresh process)."""
        while proc.poll() is None:
            looked_up = (moto.calls() - before)["/v1/listjobs"] if moto else 0
            if looked_up >= lookups:
                startup.append(time.monotonic() - started)
                go_file.touch()
                return
            time.sleep(1.0)

    watcher = threading.Thread(target=start_steady_phase, daemon=True)
    watcher.start()
    assert proc.stdout is not None
    marks: dict[str, tuple[float, collections.Counter[str]]] = {}
    ends: dict[str, float] = {}
    result: dict[str, Any] = {}
    for line in proc.stdout:
        if not line.startswith("@@ "):
            print(f"  [{kind}] {line.rstrip()}", flush=True)
            continue
        msg = json.loads(line[3:])
        if "mark" in msg:
            marks[msg["mark"]] = (time.monotonic(), moto.calls() if moto else collections.Counter())
            if msg["mark"] == "steady-end":
                ends = end_jobs()
        elif "result" in msg:
            result = msg["result"]
            if moto:
                ended = moto.calls() - marks["steady-end"][1]
                ended.subtract({"/v1/terminatejob": len(ends)})  # the orchestrator's own calls
                calls = ", ".join(f"{path} {n}" for path, n in ended.most_common() if n)
                print(f"  {kind}: AWS calls from the end of the jobs to the last event: {calls or 'none'}", flush=True)
    proc.wait()
    if not result:
        raise RuntimeError(f"{kind} contender failed (exit {proc.returncode}); see {work}")
    (t0, c0), (t1, c1) = marks["steady-start"], marks["steady-end"]
    steady_calls = c1 - c0
    if moto:
        rates = ", ".join(f"{path} {n / (t1 - t0):.1f}/s" for path, n in steady_calls.most_common())
        print(f"  {kind}: AWS calls in the steady phase: {rates or 'none'}", flush=True)
    delays, counts = [], []
    for target, evs in result["events"].items():
        counts.append(len(evs))
        if evs and target in ends:
            delays.append(evs[0][0] - ends[target])
    statuses = sorted({s for evs in result["events"].values() for _, s in evs})
    return {
        "cpu": result["cpu"],
        "rss": result["rss"],
        "lag_p99": pct(result["lags"], 99) * 1000,
        "lag_max": max(result["lags_all"], default=float("nan")) * 1000,
        "lag_p99_all": pct(result["lags_all"], 99) * 1000,
        "nb_p99": pct(result["neighbour"], 99) * 1000,
        "nb_p99_all": pct(result["neighbour_all"], 99) * 1000,
        "nb_calls": len(result["neighbour_all"]),
        "calls_s": sum(steady_calls.values()) / (t1 - t0) if moto else float("nan"),
        "ev_p50": pct(delays, 50),
        "ev_p95": pct(delays, 95),
        "ev_max": max(delays, default=float("nan")),
        "events": f"{sum(1 for c in counts if c == 1)}/{len(counts)} one event"
        + (f", {sum(1 for c in counts if c == 0)} none" if any(c == 0 for c in counts) else "")
        + (f", {sum(1 for c in counts if c > 1)} more" if any(c > 1 for c in counts) else ""),
        "statuses": ",".join(statuses),
        "startup": startup[0] if startup else float("nan"),
    }


def batch_phase(args: argparse.Namespace, work: Path, contenders: list[str]) -> dict[str, dict[str, Any]]:
    """Both contenders over ``args.n`` PENDING Batch jobs each on one moto server."""
    sys.path.insert(0, str(REPO))
    sys.path.insert(0, str(HERE))
    import boto3
    from batch_poller import setup_queue, submit_pending_jobs

    os.environ.update(FAKE_CREDS, AWS_DEFAULT_REGION=REGION)
    os.environ.pop("AWS_ENDPOINT_URL", None)
    moto_proc, url, moto = start_moto(work)
    out: dict[str, dict[str, Any]] = {}
    try:
        queue = setup_queue(url)
        t0 = time.monotonic()
        jobs = {kind: submit_pending_jobs(url, queue, args.n) for kind in contenders}
        print(f"submitted {args.n} PENDING jobs per contender in {time.monotonic() - t0:.0f}s", flush=True)
        batch = boto3.client("batch", endpoint_url=url)
        env = {**os.environ, "AWS_ENDPOINT_URL": url, "AIRFLOW_HOME": str(work / "airflow-home")}
        env["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
        env["PYTHONPATH"] = str(REPO)
        for kind in contenders:
            pairs = jobs[kind]
            ids = [job_id for _, job_id in pairs]
            targets = [f"aws_batch://bench/{app_id}" for app_id, _ in pairs] if kind == "ours" else ids
            by_id = dict(zip(ids, targets, strict=True))

            def end_jobs(by_id: dict[str, str] = by_id) -> dict[str, float]:
                ends = {}
                for job_id, target in by_id.items():
                    batch.terminate_job(jobId=job_id, reason="benchmark: end of the steady phase")
                    ends[target] = time.time()
                return ends

            python = sys.executable if kind == "ours" else amazon_python()
            print(f"running {kind} over {args.n} Batch jobs ...", flush=True)
            lookups = args.n if kind == "ours" else 0
            out[kind] = run_contender(python, kind, targets, args, work, env, end_jobs, moto, lookups)
    finally:
        moto_proc.terminate()
        moto_proc.wait(timeout=30)
    return out


def local_phase(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Our trigger over ``args.local`` deferred local jobs (``sleep``), ended by cancel."""
    os.environ["AIRFLOW_TORCHX_STATE_DIR"] = str(work / "store")
    sys.path.insert(0, str(REPO))
    from airflow_provider_torchx.core.runner import get_runner
    from airflow_provider_torchx.core.specs import AppDef, Role

    runner = get_runner("bench")
    app = AppDef("sleeper", roles=[Role("main", entrypoint="sleep", args=["3600"])])
    handles = [runner.run(app, "local_cwd") for _ in range(args.local)]
    print(f"submitted {len(handles)} local jobs", flush=True)

    def end_jobs() -> dict[str, float]:
        ends = {}
        for handle in handles:
            runner.cancel(handle)
            ends[handle] = time.time()
        return ends

    env = {**os.environ, "AIRFLOW_HOME": str(work / "airflow-home"), "PYTHONPATH": str(REPO)}
    env["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
    try:
        return run_contender(sys.executable, "ours", handles, args, work, env, end_jobs, None)
    finally:
        for handle in handles:
            runner.cancel(handle)


def table(rows: list[tuple[str, dict[str, Any]]], poll: float) -> None:
    head = (
        "| contender | CPU % of a core | RSS MB | loop lag p99 ms | neighbour to_thread p99 ms "
        "| AWS calls/s | event after end p50 / p95 / max s | events | start-up s |"
    )
    print(head)
    print("|" + " --- |" * 9)
    for name, r in rows:
        print(
            f"| {name} | {r['cpu']:.1f} | {r['rss']:.0f} | "
            f"{r['lag_p99']:.1f} (whole run: {r['lag_p99_all']:.0f}, max {r['lag_max']:.0f}) | "
            f"{r['nb_p99']:.1f} (whole run: {r['nb_p99_all']:.0f}; {r['nb_calls']} calls) | {r['calls_s']:.1f} | "
            f"{r['ev_p50']:.1f} / {r['ev_p95']:.1f} / {r['ev_max']:.1f} | {r['events']} ({r['statuses']}) | "
            f"{r['startup']:.0f} |"
        )
    print(f"goals (poll {poll:g} s): event p95 <= {poll + 5:g} s, loop lag p99 < 50 ms, neighbour p99 < 50 ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=500)
    parser.add_argument("--poll", type=float, default=10.0)
    parser.add_argument("--local", type=int, default=200)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-amazon", action="store_true")
    parser.add_argument("--no-batch", action="store_true")
    parser.add_argument("--no-local", action="store_true")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs of each contender)")
    # contender mode (internal)
    parser.add_argument("--contender", choices=["ours", "amazon"])
    parser.add_argument("--targets")
    parser.add_argument("--warmup", type=float)
    parser.add_argument("--steady", type=float)
    parser.add_argument("--wait-end", type=float)
    parser.add_argument("--log-file")
    parser.add_argument("--go-file")
    args = parser.parse_args()
    if args.contender:
        contender_main(args)
        return
    args.warmup = args.warmup or max(20.0, 2 * args.poll)
    args.steady = args.steady or (2 * args.poll if args.quick else 3 * args.poll)
    args.wait_end = args.wait_end or (4 * args.poll + 30 if args.quick else 6 * args.poll + 60)
    work = Path(tempfile.mkdtemp(prefix="triggerer-scale-"))
    rows: list[tuple[str, dict[str, Any]]] = []
    print(f"load before: {os.getloadavg()}", flush=True)
    try:
        if not args.no_batch:
            contenders = ["ours"] + ([] if args.no_amazon else ["amazon"])
            got = batch_phase(args, work, contenders)
            names = {"ours": "TorchXJobTrigger", "amazon": "Amazon BatchJobTrigger"}
            rows += [(f"{names[k]}, {args.n} Batch", got[k]) for k in contenders]
        if not args.no_local and args.local:
            rows.append((f"TorchXJobTrigger, {args.local} local", local_phase(args, work)))
    finally:
        print(f"load after: {os.getloadavg()}", flush=True)
        if rows:
            table(rows, args.poll)
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
