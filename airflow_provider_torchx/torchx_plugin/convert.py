"""Conversions between TorchX's types (``torchx.specs``, ``torchx.schedulers.api``) and the
core's twins of them: what the ``aws_batch`` TorchX plugin hands the core scheduler and what it
hands back to TorchX (docs/torchx-plugin.md).

Pure functions over dataclasses; both sides name their fields alike, so most of this is copying.
What differs: TorchX names an AWS instance type with the capability ``K8S_ITYPE`` (its named
resources ``aws_*`` do), the core with ``INSTANCE_TYPE``; TorchX's ``Resource.tags`` are not
read by any scheduler and have no twin; TorchX marks an unset string with ``NONE``/``MISSING``
where the core leaves it empty; TorchX's replica status has no exit code or message (they stay
in the app's ``msg``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from torchx import specs as tx
from torchx.schedulers import api as tx_api
from torchx.specs.named_resources_aws import K8S_ITYPE
from torchx.util.types import to_dict

from airflow_provider_torchx.core import specs as ours
from airflow_provider_torchx.core.errors import InvalidRunConfigError, InvalidSpecError
from airflow_provider_torchx.core.runopts import runopts
from airflow_provider_torchx.core.schedulers import api as ours_api
from airflow_provider_torchx.core.schedulers.aws_batch.status import CANCEL_REASON

#: The core's option types as TorchX declares them.
_OPT_TYPES: dict[type, Any] = {list: list[str], dict: dict[str, str]}


# --------------------------------------------------------------------------- TorchX -> core


def resource_in(res: tx.Resource, where: str = "resource") -> ours.Resource:
    """The core's ``Resource`` for TorchX's: ``K8S_ITYPE`` becomes ``INSTANCE_TYPE``; ``tags``
    are dropped (no scheduler reads them)."""
    caps = dict(res.capabilities)
    itype = caps.pop(K8S_ITYPE, None)
    if itype is not None:
        given = caps.setdefault(ours.INSTANCE_TYPE, itype)
        if given != itype:
            raise InvalidSpecError(
                f"{where}.capabilities: {K8S_ITYPE}={itype!r} and {ours.INSTANCE_TYPE}={given!r} name two "
                "instance types; give one"
            )
    return ours.Resource(cpu=res.cpu, gpu=res.gpu, memMB=res.memMB, capabilities=caps, devices=dict(res.devices))


def mount_in(mount: tx.BindMount | tx.VolumeMount | tx.DeviceMount, where: str) -> ours.Mount:
    """The core's mount for one of TorchX's (same fields)."""
    if isinstance(mount, tx.BindMount):
        return ours.BindMount(src_path=mount.src_path, dst_path=mount.dst_path, read_only=mount.read_only)
    if isinstance(mount, tx.VolumeMount):
        return ours.VolumeMount(src=mount.src, dst_path=mount.dst_path, read_only=mount.read_only)
    if isinstance(mount, tx.DeviceMount):
        return ours.DeviceMount(src_path=mount.src_path, dst_path=mount.dst_path, permissions=mount.permissions)
    raise InvalidSpecError(f"{where}: {mount!r} is not a BindMount, VolumeMount or DeviceMount of torchx.specs")


def role_in(role: tx.Role, index: int) -> ours.Role:
    """The core's ``Role`` for TorchX's. Its ``workspace`` stays behind: TorchX builds it into
    ``role.image`` before the request is rendered (``BatchPluginScheduler``), and a role that
    went through a build cannot be told from one that did not."""
    where = f"roles[{index}]"
    return ours.Role(
        name=role.name,
        image=role.image,
        entrypoint="" if role.entrypoint == tx.MISSING else role.entrypoint,
        args=list(role.args),
        env=dict(role.env),
        num_replicas=role.num_replicas,
        min_replicas=role.min_replicas,
        max_retries=role.max_retries,
        retry_policy=ours.RetryPolicy(tx.RetryPolicy(role.retry_policy).value),
        resource=resource_in(role.resource, f"{where}.resource"),
        port_map=dict(role.port_map),
        metadata=dict(role.metadata),
        mounts=[mount_in(m, f"{where}.mounts[{j}]") for j, m in enumerate(role.mounts)],
    )


def app_in(app: tx.AppDef) -> ours.AppDef:
    """The core's ``AppDef`` for TorchX's (its macros are the same strings: ``${app_id}``...)."""
    return ours.AppDef(
        name=app.name, roles=[role_in(r, i) for i, r in enumerate(app.roles)], metadata=dict(app.metadata)
    )


def stream_in(streams: tx_api.Stream | None) -> ours_api.Stream | None:
    """The core's ``Stream`` for TorchX's."""
    return None if streams is None else ours_api.Stream(tx_api.Stream(streams).value)


# --------------------------------------------------------------------------- core -> TorchX


class RunOpts(tx.runopts):
    """TorchX's ``runopts`` for the core's ``core``, whose errors name the option a bad value
    was given to and what it takes (TorchX's own parse raises Python's ``invalid literal for
    int()``). A ``-cfg`` string with a value not of its option's type or an unknown key stays
    strings in ``cfg_from_str`` (whose errors ``torchx run`` prints with a traceback) for
    ``resolve`` to refuse with the core's message (``torchx run`` prints that as one line)."""

    def __init__(self, core: runopts) -> None:
        super().__init__()
        self.core = core

    def cfg_from_str(self, cfg_str: str) -> dict[str, tx.CfgVal]:
        try:
            return super().cfg_from_str(cfg_str)
        except (ValueError, tx.InvalidRunConfigException):  # a bad value or key: resolve says which
            return {self.canonical_key(key) or key: value for key, value in to_dict(cfg_str).items()}

    def resolve(self, cfg: Mapping[str, tx.CfgVal], *, ignore_unknown: bool = False) -> dict[str, tx.CfgVal]:
        try:
            return super().resolve(cfg, ignore_unknown=ignore_unknown)
        except tx.InvalidRunConfigException as err:
            try:
                self.core.check({self.canonical_key(key) or key: value for key, value in cfg.items()})
            except InvalidRunConfigError as named:
                raise tx.InvalidRunConfigException(str(named).rstrip("."), err.cfg_key, cfg) from None
            raise


def runopts_out(opts: runopts) -> RunOpts:
    """TorchX's ``runopts`` for the core's (a minimum stays in the help text and is checked
    by the core when the job is rendered)."""
    out = RunOpts(opts)
    for key, opt in opts:
        out.add(
            key,
            type_=_OPT_TYPES.get(opt.opt_type, opt.opt_type),
            help=opt.help,
            default=opt.default,
            required=opt.is_required,
        )
    return out


def resource_out(res: ours.Resource) -> tx.Resource:
    """TorchX's ``Resource`` for the core's: ``INSTANCE_TYPE`` becomes ``K8S_ITYPE``."""
    caps = dict(res.capabilities)
    if ours.INSTANCE_TYPE in caps:
        caps[K8S_ITYPE] = caps.pop(ours.INSTANCE_TYPE)
    return tx.Resource(cpu=res.cpu, gpu=res.gpu, memMB=res.memMB, capabilities=caps, devices=dict(res.devices))


def mount_out(mount: ours.Mount) -> tx.BindMount | tx.VolumeMount | tx.DeviceMount:
    """TorchX's mount for one of the core's."""
    if isinstance(mount, ours.BindMount):
        return tx.BindMount(src_path=mount.src_path, dst_path=mount.dst_path, read_only=mount.read_only)
    if isinstance(mount, ours.VolumeMount):
        return tx.VolumeMount(src=mount.src, dst_path=mount.dst_path, read_only=mount.read_only)
    return tx.DeviceMount(src_path=mount.src_path, dst_path=mount.dst_path, permissions=mount.permissions)


def role_out(role: ours.Role) -> tx.Role:
    """TorchX's ``Role`` for the core's (an empty entrypoint is TorchX's ``MISSING``)."""
    return tx.Role(
        name=role.name,
        image=role.image,
        entrypoint=role.entrypoint or tx.MISSING,
        args=list(role.args),
        env=dict(role.env),
        num_replicas=role.num_replicas,
        min_replicas=role.min_replicas,
        max_retries=role.max_retries,
        retry_policy=tx.RetryPolicy(ours.RetryPolicy(role.retry_policy).value),
        resource=resource_out(role.resource),
        port_map=dict(role.port_map),
        metadata=dict(role.metadata),
        mounts=[mount_out(m) for m in role.mounts],
        workspace=tx.Workspace.from_str(role.workspace) if role.workspace else None,
    )


def state_out(state: ours.AppState) -> tx.AppState:
    """TorchX's ``AppState`` (the same names and numbers)."""
    return tx.AppState[ours.AppState(state).name]


def _or_none(text: str) -> str:
    return text or tx.NONE


def role_status_out(status: ours.RoleStatus) -> tx.RoleStatus:
    """TorchX's ``RoleStatus`` (its replicas carry no exit code or message)."""
    return tx.RoleStatus(
        role=status.role,
        replicas=[
            tx.ReplicaStatus(
                id=r.id,
                state=state_out(r.state),
                role=r.role,
                hostname=r.hostname,
                structured_error_msg=_or_none(r.structured_error_msg),
            )
            for r in status.replicas
        ],
    )


#: The reason the core gives Batch for a cancel (``status.cancel_reason_text``), then who asked.
_OUR_CANCEL = re.compile(re.escape(CANCEL_REASON) + r"(?: by \S+)? through [\w-]+(: )?")


def msg_out(msg: str) -> str:
    """The core's ``msg`` as TorchX shows it: a cancel says "cancelled by WHO" (``TorchX`` for
    its CLI and ``Runner``), not the reason the core gives Batch."""
    return _OUR_CANCEL.sub(lambda m: "cancelled by " if m.group(1) else "cancelled", msg)


def describe_out(desc: ours_api.DescribeAppResponse) -> tx_api.DescribeAppResponse:
    """TorchX's ``DescribeAppResponse``; the job's labels are its ``metadata``."""
    return tx_api.DescribeAppResponse(
        app_id=desc.app_id,
        state=state_out(desc.state),
        num_restarts=desc.num_restarts,
        msg=_or_none(msg_out(desc.msg)),
        structured_error_msg=_or_none(desc.structured_error_msg),
        ui_url=desc.ui_url,
        metadata=dict(desc.labels),
        roles_statuses=[role_status_out(s) for s in desc.roles_statuses],
        roles=[role_out(r) for r in desc.roles],
    )


def list_out(app: ours_api.ListAppResponse) -> tx_api.ListAppResponse:
    """TorchX's ``ListAppResponse`` (TorchX's runner fills in the handle)."""
    return tx_api.ListAppResponse(app_id=app.app_id, state=state_out(app.state), name=app.name)


def cfg_in(cfg: Mapping[str, Any] | None) -> dict[str, Any]:
    """The core's cfg for TorchX's resolved one (a plain dict of the same values)."""
    return dict(cfg or {})
