"""Provider metadata for Airflow's ``apache_airflow_provider`` entry point.

Declares the ``torchx`` connection type with its form fields (the scheduler as a choice of the
installed ones, a placeholder in every field), so the connection shows in the UI and ``airflow
providers list``; imports nothing heavy (Airflow loads it in every process). The provider's UI
plugin is registered through the ``airflow.plugins`` entry point instead (``plugins/torchx.py``):
Airflow loads providers' ``plugins`` only with ``[core] lazy_discover_providers`` off.
"""

from __future__ import annotations

from importlib import metadata
from typing import Any

_INTEGRATION = "TorchX"
#: The entry-point group schedulers register in (``core.runner``'s, not imported: it is heavier).
_SCHEDULERS_GROUP = "airflow_provider_torchx.schedulers"


#: Each field's placeholder: Airflow 3.1 shows ``ui-field-behaviour``'s placeholders; later
#: versions show a text field's schema ``examples`` (as suggestions) instead.
_PLACEHOLDERS = {
    "scheduler": "local_cwd",
    "cfg": "queue=torchx-queue,retry_on=infra",
    "session_name": "torchx",
    "aws_conn_id": "aws_default",
    "region_name": "us-east-1",
    "checkpoint_root": "s3://my-bucket/checkpoints",
    "rates": '{"gpu_hour": 2.5, "vcpu_hour": 0.04, "memory_gb_hour": 0.005}',
}


def _field(name: str, label: str, description: str, choices: list[str] | None = None) -> dict[str, Any]:
    """A connection form field: free text with its placeholder as the example, or a choice."""
    schema: dict[str, Any] = {"type": ["string", "null"]}
    if choices:
        schema["enum"] = choices
    else:
        schema["examples"] = [_PLACEHOLDERS[name]]
    return {"label": label, "description": description, "schema": schema}


def installed_schedulers() -> list[str]:
    """Names of the schedulers registered through the entry points (builtin and third-party)."""
    return sorted({ep.name for ep in metadata.entry_points(group=_SCHEDULERS_GROUP)})


def _modules(kind: str) -> list[dict[str, Any]]:
    return [{"integration-name": _INTEGRATION, "python-modules": [f"airflow_provider_torchx.{kind}.torchx"]}]


def get_provider_info() -> dict[str, Any]:
    """What Airflow's providers manager reads about this provider."""
    return {
        "package-name": "airflow-provider-torchx",
        "name": "TorchX",
        "description": "Run TorchX-style distributed jobs (local processes, AWS Batch) from Apache Airflow.",
        "integrations": [{"integration-name": _INTEGRATION, "tags": ["software"]}],
        "operators": [
            {"integration-name": _INTEGRATION, "python-modules": ["airflow_provider_torchx.operators.torchx"]}
        ],
        "sensors": [{"integration-name": _INTEGRATION, "python-modules": ["airflow_provider_torchx.sensors.torchx"]}],
        "hooks": [{"integration-name": _INTEGRATION, "python-modules": ["airflow_provider_torchx.hooks.torchx"]}],
        "triggers": [{"integration-name": _INTEGRATION, "python-modules": ["airflow_provider_torchx.triggers.torchx"]}],
        "extra-links": [
            "airflow_provider_torchx.links.torchx.TorchXJobLink",
            "airflow_provider_torchx.links.torchx.TorchXConsoleLink",
        ],
        "config": {
            "torchx": {
                "description": "Options of the TorchX provider's watching path and of its orphaned-jobs reaper "
                "(see docs/architecture.md).",
                "options": {
                    "watch_threads": {
                        "description": "Size of the thread pool, one per process, that runs the watchers' "
                        "blocking calls (log reads, CloudWatch calls, cursor-file writes): never the event "
                        "loop's default executor, which every trigger of a triggerer shares.",
                        "version_added": None,
                        "type": "integer",
                        "example": "16",
                        "default": "8",
                    },
                    "cancel_orphaned_jobs": {
                        "description": "Cancel a job once its task instance is in a state from which no try "
                        "will adopt it (failed, success, skipped, removed, upstream_failed, its DAG run ended or "
                        "deleted, its new try submitted another job): the listeners and the scheduler's "
                        "reconciling loop (docs/architecture.md, Orphaned jobs).",
                        "version_added": None,
                        "type": "boolean",
                        "example": "False",
                        "default": "True",
                    },
                    "orphan_grace": {
                        "description": "Seconds the reconciling loop waits after a task instance (or its DAG "
                        "run) ended before it cancels the task's job (a task cleared at once keeps it).",
                        "version_added": None,
                        "type": "float",
                        "example": "60",
                        "default": "30",
                    },
                    "checkpoint_root": {
                        "description": "Where tasks' jobs checkpoint when neither the operator's "
                        "checkpoint_root nor the torchx connection's names one: an absolute path or a URI "
                        "(s3://bucket/prefix). Each task instance gets its own TORCHX_CHECKPOINT_DIR under it; "
                        "empty: local jobs use checkpoints/ beside the job store, AWS Batch jobs get none "
                        "(docs/checkpoints.md).",
                        "version_added": None,
                        "type": "string",
                        "example": "s3://my-bucket/checkpoints",
                        "default": "",
                    },
                    "rates": {
                        "description": "What hardware costs when a torchx connection names no rates of its "
                        "own: a JSON object of US dollars per gpu_hour, vcpu_hour, memory_gb_hour (a key left "
                        "out costs nothing); empty: jobs are not priced (docs/cost-and-lineage.md).",
                        "version_added": None,
                        "type": "string",
                        "example": '{"gpu_hour": 2.5}',
                        "default": "",
                    },
                    "retain_finished": {
                        "description": "Remove local jobs (their records and logs in the job store) that "
                        "ended longer ago than this duration (s, m, h, d or w: 30d), checked at most hourly "
                        "when a task submits a local job; empty keeps every job (docs/operators.md).",
                        "version_added": None,
                        "type": "string",
                        "example": "30d",
                        "default": "",
                    },
                },
            }
        },
        "connection-types": [
            {
                "hook-class-name": "airflow_provider_torchx.hooks.torchx.TorchXHook",
                "hook-name": "TorchX",
                "connection-type": "torchx",
                "conn-fields": {
                    "scheduler": _field(
                        "scheduler",
                        "Scheduler",
                        "Where jobs run: one of the installed schedulers.",
                        installed_schedulers(),
                    ),
                    "cfg": _field(
                        "cfg",
                        "Scheduler config",
                        "Run options as k=v pairs, e.g. queue=my-queue,image_repo=123.dkr.ecr.eu-west-1"
                        ".amazonaws.com/torchx (a JSON object in the extra also works).",
                    ),
                    "session_name": _field(
                        "session_name", "Session name", "Session part of app handles (default: torchx)."
                    ),
                    "aws_conn_id": _field(
                        "aws_conn_id",
                        "AWS connection id",
                        "Amazon provider connection for AWS Batch credentials; empty: boto3's default chain.",
                    ),
                    "region_name": _field("region_name", "AWS region", "Region for AWS Batch and CloudWatch Logs."),
                    "checkpoint_root": _field(
                        "checkpoint_root",
                        "Checkpoint root",
                        "Where tasks' jobs checkpoint (an absolute path or s3://bucket/prefix); each task instance "
                        "gets its own TORCHX_CHECKPOINT_DIR under it (docs/checkpoints.md).",
                    ),
                    "rates": _field(
                        "rates",
                        "Rates (US$)",
                        "What this connection's hardware costs: a JSON object of US dollars per gpu_hour, "
                        "vcpu_hour, memory_gb_hour; a job's usage then says its cost (docs/cost-and-lineage.md).",
                    ),
                },
                "ui-field-behaviour": {
                    "hidden-fields": ["host", "schema", "login", "password", "port"],
                    "relabeling": {},
                    "placeholders": dict(_PLACEHOLDERS),
                },
            }
        ],
    }
