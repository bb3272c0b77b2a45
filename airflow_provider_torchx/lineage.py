"""OpenLineage facets of ``TorchXRunOperator`` (what ``apache-airflow-providers-openlineage``
gets from the operator's ``get_openlineage_facets_on_*`` methods).

- job facet ``torchx_job``: the app's name, the scheduler, each role's image, replica count and
  requested resources, and (once submitted) the app handle;
- run facet ``torchx_run``: the app handle, the job's final state and its usage summary
  (``core/usage.py``) once it ended;
- inputs and outputs: the task's ``inlets`` and ``outlets``, translated as the OpenLineage
  provider translates them (Airflow assets, ``File``, ``Table``, OpenLineage datasets); the
  task instance's checkpoint location (``TORCHX_CHECKPOINT_DIR``) is one more output.

Only the operator's lineage methods import this module, and only the OpenLineage provider
calls them, so the provider and the OpenLineage client are imported here at the top: without
them installed, nothing imports this module and the operator works as before.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

import attr
from airflow.providers.openlineage.extractors import OperatorLineage
from airflow.providers.openlineage.extractors.manager import ExtractorManager
from openlineage.client.event_v2 import Dataset
from openlineage.client.facet_v2 import JobFacet, RunFacet

from airflow_provider_torchx.core.specs import AppDef
from airflow_provider_torchx.core.usage import Usage

#: Where the facets' fields are described.
SCHEMA_URL = "https://airflow-provider-torchx/docs/cost-and-lineage.md"
JOB_FACET = "torchx_job"
RUN_FACET = "torchx_run"


@attr.define
class TorchXJobFacet(JobFacet):
    """The app a TorchX task runs: name, scheduler, images, roles (replicas and resources)."""

    app_name: str
    scheduler: str
    images: list[str] = attr.field(factory=list)
    roles: list[dict[str, Any]] = attr.field(factory=list)
    app_handle: str | None = None

    @staticmethod
    def _get_schema() -> str:
        return SCHEMA_URL + "#torchx_job"


@attr.define
class TorchXRunFacet(RunFacet):
    """One run of the app: its handle, final state and usage summary."""

    app_handle: str | None = None
    state: str | None = None
    usage: dict[str, Any] | None = None

    @staticmethod
    def _get_schema() -> str:
        return SCHEMA_URL + "#torchx_run"


def _datasets(objs: Iterable[Any]) -> list[Any]:
    return [d for d in (ExtractorManager.convert_to_ol_dataset(o) for o in objs) if d is not None]


def checkpoint_dataset(location: str) -> Dataset:
    """The checkpoint location as an OpenLineage dataset, named as OpenLineage names storage
    (``s3://bucket`` + key; ``file`` + an absolute path)."""
    parsed = urlsplit(location)
    if parsed.scheme and parsed.netloc:
        return Dataset(namespace=f"{parsed.scheme}://{parsed.netloc}", name=parsed.path.lstrip("/") or "/")
    return Dataset(namespace="file", name=location)


def job_facet(app: AppDef, scheduler: str, app_handle: str | None) -> TorchXJobFacet:
    """The ``torchx_job`` facet of ``app`` on ``scheduler``."""
    return TorchXJobFacet(
        app_name=app.name,
        scheduler=scheduler,
        images=sorted({r.image for r in app.roles if r.image}),
        roles=[
            {
                "name": r.name,
                "image": r.image,
                "num_replicas": r.num_replicas,
                "cpu": r.resource.cpu,
                "gpu": r.resource.gpu,
                "memMB": r.resource.memMB,
            }
            for r in app.roles
        ],
        app_handle=app_handle,
    )


def operator_lineage(
    app: AppDef,
    scheduler: str,
    inlets: Iterable[Any],
    outlets: Iterable[Any],
    app_handle: str | None = None,
    state: str | None = None,
    usage: Usage | None = None,
    *,
    checkpoint_dir: str | None = None,
) -> OperatorLineage:
    """The ``OperatorLineage`` of a TorchX task: the job facet, the run facet once there is a
    handle, the inlets as inputs, and the outlets and the checkpoint location (when the task
    has one) as outputs."""
    run_facets: dict[str, Any] = {}
    if app_handle is not None:
        run_facets[RUN_FACET] = TorchXRunFacet(
            app_handle=app_handle, state=state, usage=usage.to_dict() if usage is not None else None
        )
    return OperatorLineage(
        inputs=_datasets(inlets),
        outputs=_datasets(outlets) + ([checkpoint_dataset(checkpoint_dir)] if checkpoint_dir else []),
        run_facets=run_facets,
        job_facets={JOB_FACET: job_facet(app, scheduler, app_handle)},
    )
