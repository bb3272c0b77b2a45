"""Slurm's client commands (``sbatch``, ``squeue``, ``scontrol``, ``scancel``, ``sacct``), as on a login
node: the cluster is found through ``SLURM_CONF`` (or the host's ``/etc/slurm/slurm.conf``) and
authenticated by munge (or JWT), both the host's business.

A command that is not installed, a controller that cannot be reached and an authentication
that fails are a ``SchedulerSetupError`` of one line (``setup_error``); any other refusal is
the caller's to explain (``SlurmCommandError``, with Slurm's own words).
"""

from __future__ import annotations

import collections
import json
import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any

from airflow_provider_torchx.core.errors import SchedulerSetupError

#: Seconds a command may take before the controller counts as unreachable.
COMMAND_TIMEOUT = 60.0
# What Slurm's clients print when the controller cannot be reached or authentication fails.
_UNREACHABLE = re.compile(
    r"Unable to contact slurm controller|Socket timed out|Connection refused|Communication connection failure"
    r"|Zero Bytes were transmitted|Unable to establish controller",
    re.IGNORECASE,
)
_AUTH = re.compile(r"munge|Invalid authentication credential|auth/|Protocol authentication error", re.IGNORECASE)
_NO_CONF = re.compile(r"Could not establish a configuration source|Unable to process configuration file", re.IGNORECASE)
# What ``sacct`` says on a cluster without accounting (no slurmdbd).
_NO_ACCOUNTING = re.compile(r"accounting storage is disabled", re.IGNORECASE)
# ``key=value`` tokens of ``scontrol show ... -o``; a value may hold spaces (``OS=Linux 6.1 #1``).
_KEY = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_:/.]*)=")


class SlurmCommandError(RuntimeError):
    """A Slurm command refused what it was asked (its stderr, one line, is the message)."""


def one_line(text: str) -> str:
    """Slurm's stderr as one line (its lines joined with ``; ``)."""
    return "; ".join(line.strip() for line in text.strip().splitlines() if line.strip())


def setup_error(command: str, stderr: str) -> SchedulerSetupError | None:
    """The setup error Slurm's ``stderr`` reports, or None when it reports another refusal."""
    said = one_line(stderr)
    if _UNREACHABLE.search(said):
        return SchedulerSetupError(
            f"slurm: {command}: the Slurm controller cannot be reached ({said}); check SLURM_CONF and that "
            "slurmctld runs",
            transient=True,
        )
    if _NO_CONF.search(said):
        return SchedulerSetupError(f"slurm: {command}: no Slurm configuration ({said}); set SLURM_CONF")
    if _AUTH.search(said):
        return SchedulerSetupError(f"slurm: {command}: authentication failed ({said}); check munged or the JWT")
    return None


def parse_key_values(line: str) -> dict[str, str]:
    """One record of ``scontrol show <entity> -o`` as ``{key: value}``."""
    keys = list(_KEY.finditer(line))
    out = {}
    for i, m in enumerate(keys):
        end = keys[i + 1].start() if i + 1 < len(keys) else len(line)
        out[m.group(1)] = line[m.end() : end].strip()
    return out


class SlurmCommands:
    """Runs Slurm's client commands with ``env`` (None: this process's environment)."""

    def __init__(self, env: Mapping[str, str] | None = None, timeout: float = COMMAND_TIMEOUT) -> None:
        self.env = dict(env) if env is not None else None
        self.timeout = timeout
        #: How many commands ran, all and by command (the status poller's economy is counted in tests).
        self.calls = 0
        self.by_command: collections.Counter[str] = collections.Counter()
        #: False once ``sacct`` said the cluster keeps no accounting (not asked again).
        self.accounting = True

    def run(self, argv: Sequence[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        """``argv`` run to its end; ``SchedulerSetupError`` (``setup_error``, a missing command, a
        timeout) or ``SlurmCommandError`` when it fails."""
        self.calls += 1
        self.by_command[argv[0]] += 1
        conf = (self.env if self.env is not None else os.environ).get("SLURM_CONF")
        if conf and not os.path.isfile(conf):
            # Slurm's clients would retry reading it for a minute
            raise SchedulerSetupError(f"slurm: SLURM_CONF={conf!r} is not a file; point it at the cluster's slurm.conf")
        try:
            done = subprocess.run(
                list(argv),
                input=stdin,
                capture_output=True,
                text=True,
                env=self.env,
                timeout=self.timeout,
                check=False,
            )
        except FileNotFoundError:
            raise SchedulerSetupError(
                f"slurm: {argv[0]} is not installed on this host; install Slurm's client commands "
                "(sbatch, squeue, scontrol, scancel: Debian's slurm-client) and set SLURM_CONF"
            ) from None
        except subprocess.TimeoutExpired:
            raise SchedulerSetupError(
                f"slurm: {argv[0]} did not answer within {self.timeout:g} s; the Slurm controller may be unreachable",
                transient=True,
            ) from None
        if done.returncode != 0:
            raise setup_error(argv[0], done.stderr) or SlurmCommandError(
                one_line(done.stderr) or f"{argv[0]} exited with {done.returncode}"
            )
        return done

    def squeue(self) -> list[dict[str, Any]]:
        """Every job the controller knows (``squeue --json``; 22.05 ignores ``--jobs`` there).
        ``squeue --json`` exits 0 when it could not load the jobs and says so in ``errors``:
        that is a ``SchedulerSetupError`` too."""
        out = self.run(["squeue", "--json"]).stdout
        try:
            doc = json.loads(out)
        except ValueError:
            raise SchedulerSetupError(f"slurm: squeue --json printed no JSON: {one_line(out)[:200]!r}") from None
        errors = doc.get("errors") if isinstance(doc, dict) else None
        if errors:
            said = "; ".join(
                f"{e.get('description') or e.get('error')} ({e.get('source')}: {e.get('error')})"
                for e in errors
                if isinstance(e, dict)
            )
            raise SchedulerSetupError(
                f"slurm: squeue could not load the jobs: {said}; check SLURM_CONF and that slurmctld runs",
                transient=True,
            )
        jobs = doc.get("jobs") if isinstance(doc, dict) else None
        return [j for j in jobs or [] if isinstance(j, dict)]

    def sacct(self, job_ids: Sequence[str]) -> list[dict[str, Any]] | None:
        """What accounting (``slurmdbd``) keeps of ``job_ids``: one ``sacct --json`` call for
        all (each component of a heterogeneous job is one entry); None where the cluster keeps
        no accounting, known from then on without a call. A job it does not know is left out."""
        if not self.accounting or not job_ids:
            return None if not self.accounting else []
        try:
            out = self.run(["sacct", "--json", "--jobs", ",".join(job_ids)]).stdout
        except SlurmCommandError as err:
            if _NO_ACCOUNTING.search(str(err)):
                self.accounting = False
                return None
            raise
        try:
            doc = json.loads(out)
        except ValueError:
            raise SchedulerSetupError(f"slurm: sacct --json printed no JSON: {one_line(out)[:200]!r}") from None
        jobs = doc.get("jobs") if isinstance(doc, dict) else None
        return [j for j in jobs or [] if isinstance(j, dict)]

    def sbatch(self, args: Sequence[str], script: str, test_only: bool = False) -> str:
        """Submit ``script`` with ``args``: the job id; with ``test_only``, nothing is submitted
        and Slurm's answer is returned (when and where the job would start)."""
        if test_only:
            return one_line(self.run(["sbatch", "--test-only", *args], stdin=script).stderr)
        out = self.run(["sbatch", "--parsable", *args], stdin=script).stdout
        return out.strip().split(";", 1)[0]

    def scancel(self, job_id: str) -> None:
        self.run(["scancel", job_id])

    def show(self, entity: str) -> list[dict[str, str]]:
        """``scontrol show <entity> -o`` (``partition``, ``node``) as records."""
        return [
            parse_key_values(line) for line in self.run(["scontrol", "show", entity, "-o"]).stdout.splitlines() if line
        ]
