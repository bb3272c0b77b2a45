"""N deferred jobs in triggerers: ``TorchXJobTrigger`` side by side with the Amazon provider's
``BatchJobTrigger`` on the same moto server, plus deferred local jobs; or, with ``--scheduler
slurm``, side by side with a trigger describing each job through TorchX's ``slurm`` scheduler.

A triggerer runs every trigger's ``run()`` generator on one asyncio loop; so does each
contender here, in a process of its own (ours from the project's ``.venv``; the Amazon
provider from ``benchmarks/.amazon-venv``, created on first use with ``apache-airflow==3.3.2``
and ``apache-airflow-providers-amazon[aiobotocore]``, about 2.5 min; never the project's venv).

1. A moto server of its own on loopback (no containers); N Batch jobs per contender, rendered
   by our scheduler, kept PENDING by a dependency that never finishes, in a job queue per
   contender (``--shared-queue``: one for both), submitted just before the contender's run
   (eight at a time, on one job definition: moto runs a thread per job). The server is
   ``moto_quiet.py``: moto with its waiting jobs asleep until terminated (at 5,000 jobs
   moto's once-a-second checks took the machine to a load of 600).
2. Each contender runs N triggers (``poll_interval``/``waiter_delay`` = ``--poll``), a 50 ms
   sleeper measuring the loop's lag and a neighbour trigger timing ``asyncio.to_thread(noop)``
   every 0.5 s. Our triggers carry the job id (``native_id``, as ``TorchXJobTrigger.for_job``
   builds them); ``--old-kwargs`` builds them without it, as the previous release's stored
   kwargs do (each looks its job up by name: ``ListJobs``, once per job in a fresh process; the
   steady phase then waits for those look-ups, printed as start-up). After a warm-up it
   measures a steady phase: CPU % of one core (process time / wall time), RSS, AWS calls/s
   (counted from the moto server's request log, by path).
3. Then every job is terminated (``TerminateJob``, one after the other); the time from each
   job's end (the call returned) to its trigger's event is measured; each trigger must fire
   exactly one event.
4. The same for ``--local`` deferred local jobs (``sleep``), ended by ``Runner.cancel``.

``--scheduler slurm`` (on the test cluster, ``SLURM_CONF``) replaces 1-3: each contender gets N
held Slurm jobs of its own (``sbatch --hold``: PENDING, on no node; ``slurm_watch.submit_held``)
just before its run; after the steady phase they are cancelled, ``scancel`` 200 at a time, each
job's end being its batch's return. The reference is ``DescribeEach``, the trigger one would write
with TorchX's ``slurm`` scheduler (``torchx-nightly``, its venv from ``scripts/torchx-venv.sh``:
``$TORCHX_TEST_TORCHX_VENV`` or ``.venv-torchx``). Each contender counts the Slurm client
commands it runs (calls/s, and per poll interval), and its CPU includes theirs. Every job is
cancelled at the end, on failure too.

Modes besides that steady one (each keeps the Amazon side in the same run, on its own jobs):

- ``--fresh S``: a fresh triggerer: the jobs end S seconds after the contender started its
  triggers (no warm-up); it prints the Batch calls made from the process's start to the jobs'
  end (goal: at most N/100 + 20, no per-job look-up) and the events' delays.
- ``--two``: two triggerers split the N triggers; after a warm-up the second one is stopped
  (SIGTERM: its triggers are cancelled, as a triggerer's shutdown does) and a fresh one takes
  its triggers (the same kwargs); then every job ends. Every trigger must fire exactly one
  event over the three processes, and no job may be cancelled by a contender.
- ``--pricing``: the cost of pricing Batch attempts at AWS's prices. The jobs show RUNNING
  (``moto_quiet.py``'s ``MOTO_QUIET_RUNNING``), each with one attempt on one on-demand EC2
  instance registered as an ECS container instance on the moto server; ours runs twice, over
  N jobs carrying rates (pricing off) and then over N carrying none (each attempt priced at
  AWS's prices: ECS and EC2 calls to moto, the Price List's ``GetProducts`` answered by
  ``batch_pricing.py``'s canned client, moto having none); ``--pricing on-first``: the other
  way round (the second run's moto holds the first's jobs too). Each of our processes counts
  its own AWS calls by operation (botocore's, and the canned ``get_products``), printed per job.

    .venv/bin/python benchmarks/triggerer_scale.py [--n 500] [--poll 10] [--local 200] [--quick]
        [--scheduler batch|slurm] [--fresh 5] [--two] [--old-kwargs] [--shared-queue] [--guards]
        [--pricing [off-first|on-first]] [--reference-wait 60]

``TRIGGERER_SCALE_PROFILE=DIR`` writes a cProfile of each contender's loop thread to DIR.
``--guards``: our triggers carry ``start_timeout`` and ``max_gpu_hours`` (never reached), so
every look checks them. ``--n 2000`` is the big case (``--n 5000`` the capacity-raised one;
``--reference-wait``, or ``--amazon-wait``, caps how long the reference's events are waited
for); ``--quick`` shortens the phases; for local jobs it also prints where the delay goes (the
supervisors' record of the end, then the trigger); ``--no-reference`` (``--no-amazon``) /
``--no-local`` / ``--no-batch`` skip parts. Not run by CI. Prints a table and the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import inspect
import json
import logging
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
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


def cpu_seconds() -> float:
    """CPU seconds of this process and of the children it waited for (Slurm's client commands)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


_PROTOCOL = sys.stdout
#: ``--count-calls``: this process's Slurm client calls by program (``slurm_watch.count_calls``)
#: or AWS calls by operation (``count_aws_calls``).
_CALLS: collections.Counter[str] | None = None
#: Held to count an AWS call or to copy ``_CALLS`` (the poller's and pricing threads count).
_CALLS_LOCK = threading.Lock()


def say(**fields: Any) -> None:
    """One JSON line to the orchestrator (with the calls counted so far, if counted)."""
    if _CALLS is not None:
        with _CALLS_LOCK:
            fields["calls"] = dict(_CALLS)
    _PROTOCOL.write("@@ " + json.dumps(fields) + "\n")
    _PROTOCOL.flush()


#: ``--guards``: limits every look checks and no job reaches (seconds, GPU-hours).
NEVER = 1e9


class DescribeEach:
    """The reference for Slurm jobs: TorchX's ``slurm`` scheduler has no trigger, so this is the
    trigger one would write with it: ``describe`` its job on the loop's executor every ``poll``
    seconds until the state is terminal (or the job unknown), then one event."""

    def __init__(self, sched: Any, app_id: str, poll: float) -> None:
        self.sched, self.app_id, self.poll = sched, app_id, poll

    async def run(self) -> Any:
        from torchx.specs import is_terminal  # type: ignore[import-not-found]

        while True:
            desc = await asyncio.to_thread(self.sched.describe, self.app_id)
            if desc is None or is_terminal(desc.state):
                yield {"status": str(desc.state) if desc else "unknown job"}
                return
            await asyncio.sleep(self.poll)


def make_triggers(
    kind: str, targets: list[str], native_ids: list[str | None], poll: float, guards: bool = False
) -> list[Any]:
    """The contender's triggers, one per job (``targets``: app handles, or Batch or Slurm job
    ids; ours carry ``native_ids``, the Batch job ids, unless None: kwargs of the previous
    release, or Slurm's; with ``guards``, ``start_timeout`` and ``max_gpu_hours`` too, never
    reached)."""
    if kind == "torchx":
        from torchx.schedulers.slurm_scheduler import create_scheduler  # type: ignore[import-not-found]

        sched = create_scheduler("bench")
        return [DescribeEach(sched, t, poll) for t in targets]
    if kind == "ours":
        from airflow_provider_torchx.triggers.torchx import TorchXJobTrigger

        limits = {"start_timeout": NEVER, "max_gpu_hours": NEVER} if guards else {}
        return [
            TorchXJobTrigger(t, region_name=REGION, poll_interval=poll, native_id=job_id, **limits)
            for t, job_id in zip(targets, native_ids, strict=True)
        ]
    from airflow.providers.amazon.aws.triggers.batch import BatchJobTrigger

    return [
        BatchJobTrigger(
            job_id=t, region_name=REGION, aws_conn_id=None, waiter_delay=int(poll), waiter_max_attempts=100000
        )
        for t in targets
    ]


async def contend(kind: str, targets: list[str], native_ids: list[str | None], args: argparse.Namespace) -> None:
    """Run the triggers as a triggerer does and report the figures (see the module docstring).
    The steady phase lasts ``args.steady`` seconds, or until ``args.end_file`` exists; SIGTERM
    stops the process as a triggerer's shutdown does (every trigger's task cancelled)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    triggers = make_triggers(kind, targets, native_ids, args.poll, args.guards)
    events: dict[int, list[tuple[float, str]]] = {i: [] for i in range(len(triggers))}
    lags: list[float] = []
    neighbour: list[float] = []
    inflight: list[float] = []
    phase = {"measure": False, "steady": False}
    # The garbage collector's pauses in the steady phase, per generation: a full collection
    # stops the loop for as long as it scans the heap, which the lag figures include.
    gc_pauses: dict[int, list[float]] = {0: [], 1: [], 2: []}
    gc_started = [0.0]

    def on_gc(what: str, info: dict[str, int]) -> None:
        if what == "start":
            gc_started[0] = time.perf_counter()
        elif phase["steady"]:
            gc_pauses[info["generation"]].append(time.perf_counter() - gc_started[0])

    gc.callbacks.append(on_gc)

    async def drive(i: int, trigger: Any) -> None:
        try:
            async for event in trigger.run():
                payload = getattr(event, "payload", event)
                status = payload.get("status") if isinstance(payload, dict) else str(payload)
                events[i].append((time.time(), str(status)))
        except asyncio.CancelledError:
            raise
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

    async def until(seconds: float, done: Any) -> None:
        """Sleep ``seconds`` (or until ``done()``), waking early on SIGTERM."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not stop.is_set() and not done():
            await asyncio.sleep(0.2)

    helpers = [asyncio.create_task(sleeper()), asyncio.create_task(neighbour_trigger())]
    if os.environ.get("TRIGGERER_SCALE_CENSUS"):
        helpers.append(asyncio.create_task(census(phase)))
    tasks = [asyncio.create_task(drive(i, t)) for i, t in enumerate(triggers)]
    say(mark="started", t=time.time())
    await until(args.warmup, lambda: False)
    await until(float("inf"), lambda: os.path.exists(args.go_file))  # every trigger started
    phase["measure"] = phase["steady"] = True
    say(mark="steady-start", t=time.time())
    cpu0, wall0 = cpu_seconds(), time.monotonic()
    rss: list[float] = []
    while time.monotonic() - wall0 < args.steady and not stop.is_set():
        if args.end_file and os.path.exists(args.end_file):
            break
        await asyncio.sleep(1.0)
        rss.append(rss_mb())
    cpu = (cpu_seconds() - cpu0) / (time.monotonic() - wall0) * 100
    phase["steady"] = False
    steady_lags, steady_neighbour = list(lags), list(neighbour)
    if not stop.is_set():
        say(mark="steady-end", t=time.time())
        # The orchestrator now ends every job (one TerminateJob each: 5,000 take a minute or
        # more on a loaded machine); wait for the events, ``wait_end`` from the last end.
        await until(float("inf"), lambda: os.path.exists(args.ended_file) or all(t.done() for t in tasks))
        await until(args.wait_end, lambda: all(t.done() for t in tasks))
    stuck = [time.perf_counter() - t0 for t0 in inflight]
    for task in [*tasks, *helpers]:
        task.cancel()
    await asyncio.gather(*tasks, *helpers, return_exceptions=True)
    say(
        result={
            "cpu": cpu,
            "rss": max(rss) if rss else rss_mb(),
            "lags": steady_lags,
            "lags_all": lags,
            "neighbour": steady_neighbour,
            "neighbour_all": neighbour + stuck,
            "events": {targets[i]: ev for i, ev in events.items()},
            "stopped": stop.is_set(),
            "gc": gc_pauses,
        }
    )


def kind_of(obj: object) -> str:
    """A heap census's name for ``obj``: its type, and a function's or cell's owner."""
    if inspect.isfunction(obj):
        return f"function {obj.__module__}.{obj.__qualname__}"
    return type(obj).__qualname__


async def census(phase: dict[str, bool]) -> None:
    """Print (to stderr) what the collector tracks once the steady phase runs, and which
    tracked objects reached its oldest generation in the next 5 s and are still alive: the
    objects each full collection scans, and those that bring the next one on."""
    while not phase["measure"]:
        await asyncio.sleep(0.5)
    await asyncio.sleep(2)
    gc.collect()
    kept = gc.get_objects()  # held, so that no later object gets the id of one of them
    before = {id(o) for o in kept}
    await asyncio.sleep(5)
    tracked = [o for o in gc.get_objects() if o is not kept]
    new = collections.Counter(kind_of(o) for o in gc.get_objects(generation=2) if id(o) not in before)
    del kept
    print(f"census: {len(tracked)} tracked objects; by kind:", file=sys.stderr)
    for kind, count in collections.Counter(kind_of(o) for o in tracked).most_common(40):
        print(f"  {count:8d} {kind}", file=sys.stderr)
    print(f"census: {sum(new.values())} reached the oldest generation in 5 s and are alive:", file=sys.stderr)
    for kind, count in new.most_common(30):
        print(f"  {count:8d} {kind}", file=sys.stderr)


def count_aws_calls() -> collections.Counter[str]:
    """Count every botocore call of this process from here on, by ``service:Operation``, and
    give every ``AttemptPricer`` a Price List client answering ``batch_pricing.py``'s canned
    ``GetProducts`` (moto has no Price List), counted as ``get_products``; returns the live
    counter."""
    sys.path.insert(0, str(HERE))
    from batch_pricing import Canned
    from botocore.client import BaseClient

    from airflow_provider_torchx.core.schedulers.aws_batch.pricing import AttemptPricer

    calls: collections.Counter[str] = collections.Counter()
    call = BaseClient._make_api_call

    def counted(self: Any, operation: str, params: Any) -> Any:
        with _CALLS_LOCK:
            calls[f"{self.meta.service_model.service_name}:{operation}"] += 1
        return call(self, operation, params)

    make = AttemptPricer.__init__

    def pricer(self: AttemptPricer, clients: Any, *args: Any, **kw: Any) -> None:
        def made(service: str, region: str | None) -> Any:
            return Canned(calls) if service == "pricing" else clients(service, region)

        make(self, made, *args, **kw)

    BaseClient._make_api_call = counted
    AttemptPricer.__init__ = pricer  # type: ignore[method-assign]
    return calls


def contender_main(args: argparse.Namespace) -> None:
    global _PROTOCOL, _CALLS
    if args.count_calls == "slurm":
        sys.path.insert(0, str(HERE))
        from slurm_watch import count_calls

        _CALLS = count_calls()
    elif args.count_calls == "aws":
        _CALLS = count_aws_calls()
    # Like a triggerer's task log handler, every trigger's records go to a file: Airflow's
    # logging writes to stdout, so stdout becomes that file and the messages to the
    # orchestrator take a copy of the original stdout.
    _PROTOCOL = os.fdopen(os.dup(1), "w")
    log_fd = os.open(args.log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(log_fd, 1)
    logging.basicConfig(level=logging.INFO, stream=sys.stdout)
    spec = json.loads(Path(args.targets).read_text())
    main = contend(args.contender, spec["targets"], spec["native_ids"], args)
    profile_dir = os.environ.get("TRIGGERER_SCALE_PROFILE")  # where to write each loop's profile
    if not profile_dir:
        asyncio.run(main)
        return
    import cProfile

    with cProfile.Profile() as prof:  # the loop's thread only: the pools' threads are not in it
        asyncio.run(main)
    prof.dump_stats(os.path.join(profile_dir, Path(args.log_file).stem + ".prof"))


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


def start_moto(work: Path, running: bool = False) -> tuple[subprocess.Popen[bytes], str, MotoLog]:
    """A moto server on a free loopback port (jobs on the services' Docker engine), logging its
    requests to ``work/moto.log``; ``running``: its waiting jobs show RUNNING (``moto_quiet.py``)."""
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
    if running:
        env["MOTO_QUIET_RUNNING"] = "1"
    log_path = work / "moto.log"
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "moto_quiet.py"), "-H", "127.0.0.1", "-p", str(port)],
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


class Contender:
    """One contender process (``--contender``): started at once; its protocol lines are read
    on a thread of their own, each mark recorded with the time and the moto server's calls."""

    def __init__(
        self,
        python: str,
        kind: str,
        tag: str,
        targets: list[str],
        native_ids: list[str | None],
        args: argparse.Namespace,
        work: Path,
        env: dict[str, str],
        moto: MotoLog | None,
        *,
        warmup: float,
        steady: float,
        go: bool,
        wait_end: float | None = None,
        count_calls: str | None = None,
    ) -> None:
        """``moto``: the server whose log counts the calls; ``count_calls``: the process counts
        its own (``slurm``: Slurm's client commands; ``aws``: botocore's calls) and reports them
        with each mark."""
        self.kind, self.tag, self.moto, self.targets = kind, tag, moto, targets
        self.counted, self.poll = moto is not None or count_calls is not None, args.poll
        targets_file = work / f"{tag}-targets.json"
        targets_file.write_text(json.dumps({"targets": targets, "native_ids": native_ids}))
        self.go_file = work / f"{tag}-go"
        self.end_file = work / f"{tag}-end"
        self.ended_file = work / f"{tag}-ended"  # the orchestrator ended every job
        if go:
            self.go_file.touch()
        cmd = [python, str(Path(__file__).resolve()), "--contender", kind, "--targets", str(targets_file)]
        cmd += ["--poll", str(args.poll), "--warmup", str(warmup), "--steady", str(steady)]
        cmd += ["--wait-end", str(wait_end or args.wait_end), "--log-file", str(work / f"{tag}.log")]
        cmd += ["--go-file", str(self.go_file), "--end-file", str(self.end_file), "--ended-file", str(self.ended_file)]
        cmd += ["--guards"] if args.guards else []
        cmd += ["--count-calls", count_calls] if count_calls else []
        self.before = moto.calls() if moto else collections.Counter()
        self.started = time.monotonic()
        self.startup = float("nan")
        self.marks: dict[str, tuple[float, collections.Counter[str]]] = {}
        self.result: dict[str, Any] = {}
        self._cond = threading.Condition()
        self._done = False
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True, cwd=str(REPO))
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if not line.startswith("@@ "):
                print(f"  [{self.tag}] {line.rstrip()}", flush=True)
                continue
            msg = json.loads(line[3:])
            with self._cond:
                if "calls" in msg:
                    calls = collections.Counter(msg["calls"])
                else:
                    calls = self.moto.calls() if self.moto else collections.Counter()
                if "mark" in msg:
                    self.marks[msg["mark"]] = (time.monotonic(), calls)
                elif "result" in msg:
                    self.result = {**msg["result"], "calls_at_end": calls}
                self._cond.notify_all()
        self.proc.wait()
        with self._cond:
            self._done = True
            self._cond.notify_all()

    def wait_mark(self, name: str) -> None:
        """Block until the contender reported mark ``name`` (raises if it exited first)."""
        with self._cond:
            while name not in self.marks and not self._done:
                self._cond.wait(1.0)
            if name not in self.marks:
                raise RuntimeError(f"{self.tag} exited (exit {self.proc.returncode}) before {name!r}")

    def go_after_lookups(self, lookups: int) -> None:
        """Start the steady phase once the moto server saw ``lookups`` ListJobs calls (our
        triggers without a job id look each one up, once per job in a fresh process)."""
        while self.proc.poll() is None:
            looked_up = (self.moto.calls() - self.before)["/v1/listjobs"] if self.moto else 0
            if looked_up >= lookups:
                self.startup = time.monotonic() - self.started
                self.go_file.touch()
                return
            time.sleep(1.0)

    def finish(self) -> dict[str, Any]:
        """Wait for the process; its result."""
        self._reader.join()
        if not self.result:
            raise RuntimeError(f"{self.tag} contender failed (exit {self.proc.returncode})")
        return self.result


def own_calls(calls: collections.Counter[str], ended: int) -> collections.Counter[str]:
    """The moto server's calls less the orchestrator's ``ended`` TerminateJob calls."""
    out = collections.Counter(calls)
    out.subtract({"/v1/terminatejob": ended})
    return +out


def figures(
    c: Contender, ends: dict[str, float], events: dict[str, list[tuple[float, str]]] | None = None
) -> dict[str, Any]:
    """The table row of contender ``c`` (``events``: its triggers' events, when they span
    several processes: a restarted triggerer's)."""
    result = c.result
    events = result["events"] if events is None else events
    (t0, c0), (t1, c1) = c.marks["steady-start"], c.marks["steady-end"]
    steady_calls = c1 - c0
    if c.counted:
        rates = ", ".join(
            f"{path} {n / (t1 - t0):.2f}/s ({n / (t1 - t0) * c.poll:.1f} per poll)"
            for path, n in steady_calls.most_common()
        )
        print(f"  {c.tag}: calls in the steady phase: {rates or 'none'}", flush=True)
        per = len(c.targets)
        to_end = ", ".join(f"{path} {n} ({n / per:.2f}/job)" for path, n in (c1 - c.before).most_common())
        print(f"  {c.tag}: calls from its start to the end of the jobs: {to_end or 'none'}", flush=True)
    delays, counts = [], []
    for target, evs in events.items():
        counts.append(len(evs))
        if evs and target in ends:
            delays.append(evs[0][0] - ends[target])
    statuses = sorted({s for evs in events.values() for _, s in evs})
    return {
        "cpu": result["cpu"],
        "rss": result["rss"],
        "lag_p99": pct(result["lags"], 99) * 1000,
        "lag_max": max(result["lags_all"], default=float("nan")) * 1000,
        "lag_p99_all": pct(result["lags_all"], 99) * 1000,
        "gc": {int(g): p for g, p in result["gc"].items()},
        "nb_p99": pct(result["neighbour"], 99) * 1000,
        "nb_p99_all": pct(result["neighbour_all"], 99) * 1000,
        "nb_calls": len(result["neighbour_all"]),
        "calls_s": sum(steady_calls.values()) / (t1 - t0) if c.counted else float("nan"),
        "calls_to_end": sum((c1 - c.before).values()) if c.counted else float("nan"),
        "ev_p50": pct(delays, 50),
        "ev_p95": pct(delays, 95),
        "ev_max": max(delays, default=float("nan")),
        "events": f"{sum(1 for n in counts if n == 1)}/{len(counts)} one event"
        + (f", {sum(1 for n in counts if n == 0)} none" if any(n == 0 for n in counts) else "")
        + (f", {sum(1 for n in counts if n > 1)} more" if any(n > 1 for n in counts) else ""),
        "statuses": ",".join(statuses),
        "startup": c.startup,
    }


def end_and_collect(contenders: list[Contender], end_jobs: Any) -> dict[str, float]:
    """Once every contender reported the end of its steady phase, end every job
    (``end_jobs``); wait for the contenders' results; return each target's end time."""
    for c in contenders:
        c.wait_mark("steady-end")
    before = contenders[0].moto.calls() if contenders[0].moto else None
    t0 = time.monotonic()
    ends: dict[str, float] = end_jobs()
    print(f"  ended {len(ends)} jobs in {time.monotonic() - t0:.0f}s", flush=True)
    for c in contenders:
        c.ended_file.touch()
    for c in contenders:
        c.finish()
    if before is not None and contenders[0].moto:
        ended = own_calls(contenders[0].moto.calls() - before, len(ends))
        calls = ", ".join(f"{path} {n}" for path, n in ended.most_common())
        names = "+".join(c.tag for c in contenders)
        print(f"  {names}: AWS calls from the end of the jobs to the last event: {calls or 'none'}", flush=True)
    for c in contenders:
        if not c.moto and c.counted:
            after = c.result["calls_at_end"] - c.marks["steady-end"][1]
            calls = ", ".join(f"{program} {n}" for program, n in after.most_common())
            print(f"  {c.tag}: calls from the end of the steady phase to its last event: {calls or 'none'}", flush=True)
    return ends


def one_triggerer(
    spawn: Any, targets: list[str], native_ids: list[str | None], args: argparse.Namespace, end_jobs: Any
) -> list[tuple[str, dict[str, Any]]]:
    """The steady mode (warm-up, steady phase, then the jobs end) or, with ``--fresh S``, a
    fresh triggerer whose jobs end S seconds after its triggers started."""
    if args.fresh is not None:
        c = spawn("fresh", targets, native_ids, warmup=0.0, steady=args.fresh, go=True)
    else:
        c = spawn("steady", targets, native_ids, warmup=args.warmup, steady=args.steady, go=False)
        lookups = sum(1 for i in native_ids if i is None) if c.moto else 0  # Batch triggers without a job id
        if lookups:
            threading.Thread(target=c.go_after_lookups, args=(lookups,), daemon=True).start()
        else:
            c.go_file.touch()
    ends = end_and_collect([c], end_jobs)
    return [("", figures(c, ends))]


def two_triggerers(
    spawn: Any, targets: list[str], native_ids: list[str | None], args: argparse.Namespace, end_jobs: Any
) -> list[tuple[str, dict[str, Any]]]:
    """Two triggerers split the triggers; the second is stopped in the middle of the steady
    phase and a fresh one takes its triggers; then every job ends (see the module docstring)."""
    half = len(targets) // 2
    forever = 1e9  # the steady phases end when the orchestrator says (their end files)
    a = spawn("A", targets[:half], native_ids[:half], warmup=args.warmup, steady=forever, go=True)
    b = spawn("B", targets[half:], native_ids[half:], warmup=args.warmup, steady=forever, go=True)
    a.wait_mark("steady-start")
    b.wait_mark("steady-start")
    time.sleep(1.5 * args.poll)
    restarted_at = time.monotonic()
    b.proc.send_signal(signal.SIGTERM)
    b.finish()
    b2 = spawn("B2", targets[half:], native_ids[half:], warmup=0.0, steady=forever, go=True)
    b2.wait_mark("steady-start")
    time.sleep(max(2 * args.poll, 20.0))  # the fresh one is up to speed: its first looks are done
    print(f"  B stopped, B2 watching for {time.monotonic() - restarted_at:.0f}s before the jobs end", flush=True)
    a.end_file.touch()
    b2.end_file.touch()
    ends = end_and_collect([a, b2], end_jobs)
    if a.moto:
        whole = own_calls(a.moto.calls() - a.before, len(ends))
        cancels = whole["/v1/canceljob"] + whole["/v1/terminatejob"]
        print(f"  CancelJob/TerminateJob calls by the contenders over the whole run: {cancels}", flush=True)
    b_events = {t: b.result["events"][t] + b2.result["events"][t] for t in targets[half:]}
    return [
        (" A (its neighbour restarted)", figures(a, ends)),
        (" B2 (fresh, took B's triggers)", figures(b2, ends, b_events)),
    ]


def spawner(
    python: str,
    kind: str,
    args: argparse.Namespace,
    work: Path,
    env: dict[str, str],
    moto: MotoLog | None = None,
    count_calls: str | None = None,
    name: str | None = None,
) -> Callable[..., Contender]:
    """``spawn(tag, targets, native_ids, **kw)``: a ``Contender`` of ``kind`` run by ``python``,
    tagged ``name-tag`` (``name``: the kind unless given); a reference's events are waited for
    at most ``--reference-wait`` seconds when given."""
    wait_end = args.reference_wait if kind != "ours" and args.reference_wait else args.wait_end

    def spawn(tag: str, targets: list[str], native_ids: list[str | None], **kw: Any) -> Contender:
        return Contender(
            python,
            kind,
            f"{name or kind}-{tag}",
            targets,
            native_ids,
            args,
            work,
            env,
            moto,
            wait_end=wait_end,
            count_calls=count_calls,
            **kw,
        )

    return spawn


def register_instance(url: str) -> str:
    """An on-demand EC2 instance registered as an ECS container instance on the moto server:
    its container instance ARN (every RUNNING job's attempt runs there with ``--pricing``)."""
    import boto3

    ec2, ecs = boto3.client("ec2", endpoint_url=url), boto3.client("ecs", endpoint_url=url)
    image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    instance = ec2.run_instances(ImageId=image, InstanceType="g4dn.xlarge", MinCount=1, MaxCount=1)["Instances"][0]
    ecs.create_cluster(clusterName="bench-ce")
    document = json.dumps({"instanceId": instance["InstanceId"]})
    found = ecs.register_container_instance(cluster="bench-ce", instanceIdentityDocument=document)
    return str(found["containerInstance"]["containerInstanceArn"])


def batch_phase(args: argparse.Namespace, work: Path, contenders: list[str]) -> list[tuple[str, dict[str, Any]]]:
    """Each contender over ``args.n`` PENDING Batch jobs of its own on one moto server
    (``--pricing``: RUNNING jobs, ours over jobs with rates and over jobs without)."""
    sys.path.insert(0, str(REPO))
    sys.path.insert(0, str(HERE))
    import boto3
    from batch_poller import setup_queue, submit_pending_jobs

    from airflow_provider_torchx.core.rates import Rates

    os.environ.update(FAKE_CREDS, AWS_DEFAULT_REGION=REGION)
    os.environ.pop("AWS_ENDPOINT_URL", None)
    moto_proc, url, moto = start_moto(work, running=bool(args.pricing))
    rows: list[tuple[str, dict[str, Any]]] = []
    names = {"ours": "TorchXJobTrigger", "amazon": "Amazon BatchJobTrigger"}
    # (name, kind, the jobs' labels, words for the label): --pricing runs ours with rates and
    # without (in --pricing's order), each with a queue of its own.
    runs: list[tuple[str, str, dict[str, str] | None, str]] = [
        (kind, kind, None, "") for kind in contenders if not (args.pricing and kind == "ours")
    ]
    if args.pricing and "ours" in contenders:
        rates = Rates(vcpu_hour=0.05).labels()
        pair = [
            ("ours-rates", "ours", rates, " (rates: pricing off)"),
            ("ours-aws", "ours", None, " (AWS's prices: pricing on)"),
        ]
        runs[:0] = pair[::-1] if args.pricing == "on-first" else pair
    try:
        queues = {name: setup_queue(url, "bench-q" if args.shared_queue else f"bench-{name}") for name, *_ in runs}
        if args.pricing:
            print(f"RUNNING jobs on container instance {register_instance(url)}", flush=True)
        batch = boto3.client("batch", endpoint_url=url)
        env = {**os.environ, "AWS_ENDPOINT_URL": url, "AIRFLOW_HOME": str(work / "airflow-home")}
        env["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
        env["AIRFLOW_TORCHX_STATE_DIR"] = str(work / "store")  # the Price List's cache too
        env["PYTHONPATH"] = str(REPO)
        for name, kind, labels, words in runs:
            # Each contender's jobs are submitted just before its run: moto runs a thread per job.
            t0 = time.monotonic()
            pairs = submit_pending_jobs(url, queues[name], args.n, labels=labels)
            where = "in the one queue" if args.shared_queue else "in a queue of its own"
            state, took = "RUNNING" if args.pricing else "PENDING", time.monotonic() - t0
            print(f"submitted {args.n} {state} jobs for {kind}{words} ({where}) in {took:.0f}s", flush=True)
            ids = [job_id for _, job_id in pairs]
            targets = [f"aws_batch://bench/{app_id}" for app_id, _ in pairs] if kind == "ours" else ids
            native_ids: list[str | None] = [None if args.old_kwargs else i for i in ids]
            by_id = dict(zip(ids, targets, strict=True))

            def end_jobs(by_id: dict[str, str] = by_id) -> dict[str, float]:
                ends = {}
                for job_id, target in by_id.items():
                    batch.terminate_job(jobId=job_id, reason="benchmark: end of the steady phase")
                    ends[target] = time.time()
                return ends

            python = sys.executable if kind == "ours" else amazon_python()
            if args.pricing and kind == "ours":  # its own AWS calls, pricing's included
                spawn = spawner(python, kind, args, work, env, count_calls="aws", name=name)
            else:
                spawn = spawner(python, kind, args, work, env, moto, name=name)

            mode = "two triggerers" if args.two else f"fresh, jobs end {args.fresh:g}s in" if args.fresh else "steady"
            print(f"running {kind} over {args.n} Batch jobs ({mode}) ...", flush=True)
            run = two_triggerers if args.two else one_triggerer
            ours = kind == "ours"
            flags = " (old kwargs)" if ours and args.old_kwargs else ""
            flags += " (guards)" if ours and args.guards else ""
            label = f"{names[kind]}{flags}{words}, {args.n} Batch"
            rows += [(label + suffix, row) for suffix, row in run(spawn, targets, native_ids, args, end_jobs)]
    finally:
        moto_proc.terminate()
        moto_proc.wait(timeout=30)
    return rows


def slurm_phase(args: argparse.Namespace, work: Path, contenders: list[str]) -> list[tuple[str, dict[str, Any]]]:
    """Each contender over ``args.n`` held Slurm jobs of its own (``sbatch --hold``), submitted
    just before its run and cancelled in batches (``scancel``) after its steady phase: ours,
    and ``DescribeEach`` on TorchX's ``slurm`` scheduler in its venv (``scripts/torchx-venv.sh``:
    ``$TORCHX_TEST_TORCHX_VENV`` or ``.venv-torchx``). Each process counts its Slurm calls."""
    sys.path.insert(0, str(REPO))
    sys.path.insert(0, str(HERE))
    from slurm_watch import cancel_jobs, submit_held

    from airflow_provider_torchx.core.schedulers.slurm.record import JobIndex
    from airflow_provider_torchx.core.schedulers.slurm.scheduler import SlurmScheduler

    venv = Path(os.environ.get("TORCHX_TEST_TORCHX_VENV", REPO / ".venv-torchx"))
    if "torchx" in contenders and not (venv / "bin" / "python").is_file():
        sys.exit(f"no TorchX venv at {venv}: run scripts/torchx-venv.sh")
    store = work / "store"
    env = {**os.environ, "AIRFLOW_HOME": str(work / "airflow-home"), "PYTHONPATH": str(REPO)}
    env.update(AIRFLOW__CORE__LOAD_EXAMPLES="False", AIRFLOW_TORCHX_STATE_DIR=str(store))
    sched = SlurmScheduler("bench", index=JobIndex(store / "slurm-index"))
    names = {"ours": "TorchXJobTrigger", "torchx": "TorchX `slurm` describe per job"}
    rows: list[tuple[str, dict[str, Any]]] = []
    for kind in contenders:
        ids: list[str] = []
        try:
            t0 = time.monotonic()
            submit_held(sched, args.n, str(work / "jobs"), ids)
            print(f"submitted {args.n} held Slurm jobs for {kind} in {time.monotonic() - t0:.0f}s", flush=True)
            targets = [f"slurm://bench/{i}" for i in ids] if kind == "ours" else ids
            by_id = dict(zip(ids, targets, strict=True))

            def end_jobs(by_id: dict[str, str] = by_id) -> dict[str, float]:
                return {by_id[i]: t for i, t in cancel_jobs(list(by_id)).items()}

            python = sys.executable if kind == "ours" else str(venv / "bin" / "python")
            spawn = spawner(python, kind, args, work, env, count_calls="slurm")

            print(f"running {kind} over {args.n} Slurm jobs ...", flush=True)
            run = two_triggerers if args.two else one_triggerer
            label = f"{names[kind]}, {args.n} Slurm"
            rows += [(label + suffix, row) for suffix, row in run(spawn, targets, [None] * len(ids), args, end_jobs)]
        finally:
            cancel_jobs(ids)
    sched.close()
    return rows


def local_phase(args: argparse.Namespace, work: Path) -> list[tuple[str, dict[str, Any]]]:
    """Our trigger over ``args.local`` deferred local jobs (``sleep``), ended by cancel."""
    os.environ["AIRFLOW_TORCHX_STATE_DIR"] = str(work / "store")
    sys.path.insert(0, str(REPO))
    from airflow_provider_torchx.core.runner import get_runner
    from airflow_provider_torchx.core.specs import AppDef, Role

    runner = get_runner("bench")
    app = AppDef("sleeper", roles=[Role("main", entrypoint="sleep", args=["3600"])])
    handles = [runner.run(app, "local_cwd") for _ in range(args.local)]
    print(f"submitted {len(handles)} local jobs", flush=True)

    end_times: dict[str, float] = {}

    def end_jobs() -> dict[str, float]:
        for handle in handles:
            runner.cancel(handle)
            end_times[handle] = time.time()
        return end_times

    env = {**os.environ, "AIRFLOW_HOME": str(work / "airflow-home"), "PYTHONPATH": str(REPO)}
    env["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"

    spawned: list[Contender] = []

    def spawn(tag: str, targets: list[str], native_ids: list[str | None], **kw: Any) -> Contender:
        c = Contender(sys.executable, "ours", f"local-{tag}", targets, native_ids, args, work, env, None, **kw)
        spawned.append(c)
        return c

    try:
        print(f"running ours over {len(handles)} local jobs ...", flush=True)
        run = two_triggerers if args.two else one_triggerer
        rows = run(spawn, handles, [None] * len(handles), args, end_jobs)
        split_local_delays(runner, spawned, handles, end_times)
        return [(f"TorchXJobTrigger, {args.local} local{suffix}", row) for suffix, row in rows]
    finally:
        for handle in handles:
            runner.cancel(handle)


def split_local_delays(runner: Any, contenders: list[Contender], handles: list[str], cancels: dict[str, float]) -> None:
    """Print where a local job's event delay goes: from the cancel to the supervisor's record
    of the end (``ended`` in its state; the supervisors' own work), and from that record to the
    trigger's event (the trigger's)."""
    first_event: dict[str, float] = {}
    for c in contenders:
        for handle, evs in c.result.get("events", {}).items():
            if evs:
                first_event[handle] = min(first_event.get(handle, math.inf), evs[0][0])
    recorded, after = [], []
    for handle in handles:
        desc = runner.describe_app(handle)
        if desc is None or desc.ended is None or handle not in cancels:
            continue
        recorded.append(desc.ended - cancels[handle])
        if handle in first_event:
            after.append(first_event[handle] - desc.ended)

    def spread(values: list[float]) -> str:
        return f"p50 {pct(values, 50):.2f} / p95 {pct(values, 95):.2f} / max {max(values, default=math.nan):.2f} s"

    print(f"  local: the supervisor recorded the end after the cancel: {spread(recorded)}", flush=True)
    print(f"  local: the event after the recorded end: {spread(after)}", flush=True)


def table(rows: list[tuple[str, dict[str, Any]]], poll: float) -> None:
    head = (
        "| contender | CPU % of a core | RSS MB | loop lag p99 ms | neighbour to_thread p99 ms "
        "| calls/s (AWS or Slurm) | calls to the jobs' end | event after end p50 / p95 / max s | events | start-up s |"
    )
    print(head)
    print("|" + " --- |" * 10)
    for name, r in rows:
        print(
            f"| {name} | {r['cpu']:.1f} | {r['rss']:.0f} | "
            f"{r['lag_p99']:.1f} (whole run: {r['lag_p99_all']:.0f}, max {r['lag_max']:.0f}) | "
            f"{r['nb_p99']:.1f} (whole run: {r['nb_p99_all']:.0f}; {r['nb_calls']} calls) | "
            f"{r['calls_s']:.1f} | {r['calls_to_end']:.0f} | "
            f"{r['ev_p50']:.1f} / {r['ev_p95']:.1f} / {r['ev_max']:.1f} | {r['events']} ({r['statuses']}) | "
            f"{r['startup']:.0f} |"
        )
    for name, r in rows:
        pauses = "; ".join(
            f"gen {g}: {len(p)} x, max {max(p, default=0) * 1000:.0f} ms, total {sum(p) * 1000:.0f} ms"
            for g, p in sorted(r["gc"].items())
        )
        print(f"  {name}: garbage collector pauses in the steady phase: {pauses}")
    print(
        f"goals (poll {poll:g} s): steady event p95 <= {0.6 * poll + 1:g} s; fresh: p95 <= {poll + 5:g} s and "
        "<= N/100 + 20 calls to the end; loop lag p99 < 50 ms, neighbour p99 < 50 ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=500)
    parser.add_argument("--poll", type=float, default=10.0)
    parser.add_argument("--local", type=int, default=200)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--scheduler", choices=["batch", "slurm"], default="batch", help="the deferred jobs' kind")
    parser.add_argument("--no-reference", "--no-amazon", action="store_true", help="ours alone")
    parser.add_argument("--no-batch", action="store_true")
    parser.add_argument("--no-local", action="store_true")
    parser.add_argument("--fresh", type=float, help="a fresh triggerer: the jobs end this many seconds after it starts")
    parser.add_argument("--two", action="store_true", help="two triggerers, the second restarted in the middle")
    parser.add_argument("--old-kwargs", action="store_true", help="our triggers without the job id (look-ups)")
    parser.add_argument("--shared-queue", action="store_true", help="both contenders' jobs in one job queue")
    parser.add_argument("--guards", action="store_true", help="our triggers check start_timeout and max_gpu_hours")
    parser.add_argument(
        "--pricing",
        nargs="?",
        const="off-first",
        choices=["off-first", "on-first"],
        help="RUNNING jobs, ours with rates and at AWS's prices (in this order)",
    )
    parser.add_argument(
        "--reference-wait", "--amazon-wait", type=float, help="cap the wait for the reference's events (seconds)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs of each contender)")
    # contender mode (internal)
    parser.add_argument("--contender", choices=["ours", "amazon", "torchx"])
    parser.add_argument("--count-calls", choices=["slurm", "aws"])
    parser.add_argument("--targets")
    parser.add_argument("--warmup", type=float)
    parser.add_argument("--steady", type=float)
    parser.add_argument("--wait-end", type=float)
    parser.add_argument("--log-file")
    parser.add_argument("--go-file")
    parser.add_argument("--end-file")
    parser.add_argument("--ended-file")
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
        if args.scheduler == "slurm":
            rows += slurm_phase(args, work, ["ours"] + ([] if args.no_reference else ["torchx"]))
        elif not args.no_batch:
            rows += batch_phase(args, work, ["ours"] + ([] if args.no_reference else ["amazon"]))
        if not args.no_local and args.local:
            rows += local_phase(args, work)
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
