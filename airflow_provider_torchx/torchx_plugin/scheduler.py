"""``BatchPluginScheduler``: the core's AWS Batch scheduler as a TorchX ``Scheduler``, for
``torchx run -s aws_batch`` and TorchX's ``Runner`` (docs/torchx-plugin.md).

It holds one core ``AWSBatchScheduler`` and converts at its edges (``convert``): TorchX's app in,
the core renders and submits it, and descriptions, lists, log lines and run options go back as
TorchX's types. The request is the core's ``BatchJob``, so a TorchX dry run shows what
``airflow-torchx dryrun -s aws_batch`` shows. TorchX passes no job labels; the core's own
validation and statuses apply unchanged; its errors reach TorchX as TorchX's (``errors.py``).

Workspaces (TorchX's ``WorkspaceMixin``): with ``image_repo`` set, a role's workspace is built
into an image on the role's image with Docker (the core's build) and pushed there when the job
is scheduled, as TorchX 0.7.0's Batch scheduler did. TorchX's CLI hands every run the current
directory as a workspace, so without ``image_repo`` the workspace is left unbuilt (logged) and
the role's image runs as it is: ``torchx run -s aws_batch -cfg queue=q utils.echo`` needs no
Docker.
"""

from __future__ import annotations

import builtins
import logging
import tempfile
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from torchx import specs as tx
from torchx.schedulers import api as tx_api
from torchx.workspace.api import WorkspaceMixin

from airflow_provider_torchx.core.errors import SchedulerSetupError
from airflow_provider_torchx.core.schedulers.aws_batch.render import BatchJob
from airflow_provider_torchx.core.schedulers.aws_batch.scheduler import BACKEND, AWSBatchScheduler
from airflow_provider_torchx.core.schedulers.aws_batch.scheduler import create_scheduler as create_batch_scheduler
from airflow_provider_torchx.core.specs import AppDryRunInfo, Role
from airflow_provider_torchx.torchx_plugin import convert
from airflow_provider_torchx.torchx_plugin.errors import TORCHX_ENV_HINTS, torchx_terms, torchx_terms_iter

log = logging.getLogger(__name__)

#: The tag TorchX 0.7.0's ``aws_batch`` put on every job it submitted (``list`` shows them too).
TORCHX_070_TAG = "torchx.pytorch.org/version"

#: Who cancelled, as a cancel through TorchX (its CLI or its ``Runner``) records it:
#: ``describe``'s ``msg`` says "cancelled by TorchX".
CANCEL_REASON = "TorchX"


class BatchPluginScheduler(WorkspaceMixin[None], tx_api.Scheduler[Mapping[str, tx.CfgVal]]):
    """TorchX's ``aws_batch``: app ids are the core's (``queue:job_name``)."""

    def __init__(self, session_name: str, batch: AWSBatchScheduler) -> None:
        super().__init__(BACKEND, session_name)
        self.batch = batch

    def caching_build_workspace_and_update_role(
        self, role: tx.Role, cfg: Mapping[str, tx.CfgVal], build_cache: dict[object, object]
    ) -> None:
        """Build ``role.workspace`` on ``role.image`` and point ``role.image`` at the local
        build (pushed to ``image_repo`` by ``schedule``); roles sharing an image and a
        workspace share one build. Without ``image_repo``, nothing is built."""
        workspace = role.workspace
        if not workspace:
            return
        if not cfg.get("image_repo"):
            log.info(
                "aws_batch: role %s runs %s as it is: its workspace %s is built only with the run option image_repo",
                role.name,
                role.image,
                workspace,
            )
            return
        key = (role.image, str(workspace))
        with torchx_terms(cfg):
            if key not in build_cache:
                build_cache[key] = self._build(role, workspace, cfg)
        role.image = str(build_cache[key])

    def _build(self, role: tx.Role, workspace: tx.Workspace, cfg: Mapping[str, tx.CfgVal]) -> str:
        """The core's build of ``workspace`` (one directory, or several merged into one): the
        local image id. No Docker engine is an error naming ``image_repo``, which asked for
        the build."""
        try:
            return self._build_image(role, workspace, cfg)
        except SchedulerSetupError as err:
            raise SchedulerSetupError(
                f"image_repo={cfg.get('image_repo')!r} builds role {role.name}'s workspace into an image: {err}; "
                "without image_repo the role's image runs as it is"
            ) from err

    def _build_image(self, role: tx.Role, workspace: tx.Workspace, cfg: Mapping[str, tx.CfgVal]) -> str:
        if workspace.is_unmapped_single_project():
            built = self.batch.build_workspace_image(Role(role.name, image=role.image, workspace=str(workspace)), cfg)
        else:
            with tempfile.TemporaryDirectory(suffix="-torchx-workspace") as merged:
                workspace.merge_into(merged)
                built = self.batch.build_workspace_image(Role(role.name, image=role.image, workspace=merged), cfg)
        return built or role.image

    def _run_opts(self) -> tx.runopts:
        return convert.runopts_out(self.batch.run_opts())

    def _pre_build_validate(self, app: tx.AppDef, scheduler: str, cfg: Mapping[str, tx.CfgVal]) -> None:
        """The core's checks of the app and the cfg (a render: no AWS call), before TorchX
        builds any workspace, so that bad input fails before a Docker build."""
        with torchx_terms(cfg):
            self.batch.submit_dryrun(convert.app_in(app), convert.cfg_in(cfg))

    def _validate(self, app: tx.AppDef, scheduler: str, cfg: Mapping[str, tx.CfgVal]) -> None:
        """Nothing more here: the core checks again when it renders the request, naming the
        field (TorchX's own check of a missing resource says less)."""

    def _submit_dryrun(
        self, app: tx.AppDef, cfg: Mapping[str, tx.CfgVal]
    ) -> tx.AppDryRunInfo[BatchJob, Mapping[str, tx.CfgVal]]:
        with torchx_terms(cfg):
            info = self.batch.submit_dryrun(convert.app_in(app), convert.cfg_in(cfg))
        return tx.AppDryRunInfo(info.request, BatchJob.format)

    def schedule(self, dryrun_info: tx.AppDryRunInfo[BatchJob, Mapping[str, tx.CfgVal]]) -> str:
        """Submit the rendered ``BatchJob`` with the cfg it was rendered with; the app id."""
        info: AppDryRunInfo[BatchJob] = AppDryRunInfo(dryrun_info.request, BatchJob.format)
        with torchx_terms(dryrun_info.cfg):
            info._cfg = self.batch.run_opts().resolve(convert.cfg_in(dryrun_info.cfg))
            info._scheduler = BACKEND
            return self.batch.schedule(info)

    def describe(self, app_id: str) -> tx_api.DescribeAppResponse | None:
        with torchx_terms(hints=TORCHX_ENV_HINTS):
            desc = self.batch.describe(app_id)
        return None if desc is None else convert.describe_out(desc)

    def describe_native(self, app_id: str) -> tx.AppDryRunInfo[BatchJob, Mapping[str, tx.CfgVal]] | None:
        with torchx_terms(hints=TORCHX_ENV_HINTS):
            info = self.batch.describe_native(app_id)
        return None if info is None else tx.AppDryRunInfo(info.request, BatchJob.format)

    def list(self, cfg: Mapping[str, tx.CfgVal] | None = None) -> builtins.list[tx_api.ListAppResponse]:
        """This package's jobs and those TorchX 0.7.0's ``aws_batch`` submitted, in the cfg's
        ``queue``, else in every queue, oldest first."""
        with torchx_terms():
            apps = self.batch.list(convert.cfg_in(cfg) or None, also_tagged=(TORCHX_070_TAG,))
            return [convert.list_out(app) for app in apps]

    def log_iter(
        self,
        app_id: str,
        role_name: str,
        k: int = 0,
        regex: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        should_tail: bool = False,
        streams: tx_api.Stream | None = None,
    ) -> Iterable[str]:
        """The core's lines (CloudWatch, every attempt's stream in order; stdout and stderr
        together: only ``Stream.COMBINED`` or None)."""
        with torchx_terms(hints=TORCHX_ENV_HINTS):
            lines = self.batch.log_iter(
                app_id, role_name, k, regex, since, until, should_tail, streams=convert.stream_in(streams)
            )
        return torchx_terms_iter(lines, TORCHX_ENV_HINTS)

    def _cancel_existing(self, app_id: str) -> None:
        with torchx_terms(hints=TORCHX_ENV_HINTS):
            self.batch.cancel(app_id, reason=CANCEL_REASON)

    def _delete_existing(self, app_id: str) -> None:
        with torchx_terms(hints=TORCHX_ENV_HINTS):
            self.batch.delete(app_id)

    def close(self) -> None:
        self.batch.close()


def create_scheduler(session_name: str, **kwargs: Any) -> BatchPluginScheduler:
    """The plugin's factory: the core's ``create_scheduler`` keyword arguments (``client``,
    ``log_client``, ``docker_client``, ``session``, ``region``, ``profile``...); others, such
    as TorchX's scheduler params, are ignored."""
    return BatchPluginScheduler(session_name, create_batch_scheduler(session_name, **kwargs))
