"""The run options that shape an AWS Batch job (job type, platform, retries, shared memory) and
the rules for combining them, checked at dry run, before any AWS call.

The AWS Batch API reference says which fields apply where (``ContainerProperties``,
``LinuxParameters``, ``RetryStrategy``, ``SubmitJob``); an option that cannot apply to the job
being rendered is rejected here with the reason, never dropped silently.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from airflow_provider_torchx.core.errors import InvalidRunConfigError, InvalidSpecError
from airflow_provider_torchx.core.schedulers.aws_batch.run_options import PLATFORMS, parse_consumables
from airflow_provider_torchx.core.specs import INSTANCE_TYPE, AppDef, BindMount, DeviceMount, VolumeMount

JOB_TYPES = ("auto", "container", "multinode")
#: An EFS file system id (a volume mount's ``src`` on ECS).
EFS_ID = re.compile(r"^fs-[0-9a-f]{8,40}$")
RETRY_ON = ("any", "infra")

#: Memory sizes (MiB) Fargate offers for each whole number of vCPUs (AWS Batch API reference,
#: ``ResourceRequirement``; 0.25 and 0.5 vCPU exist too, but ``Resource.cpu`` is an int).
FARGATE_MEMORY: dict[int, tuple[int, ...]] = {
    1: tuple(range(2048, 8192 + 1, 1024)),
    2: tuple(range(4096, 16384 + 1, 1024)),
    4: tuple(range(8192, 30720 + 1, 1024)),
    8: tuple(range(16384, 61440 + 1, 4096)),
    16: tuple(range(32768, 122880 + 1, 8192)),
}

#: The ``retryStrategy.evaluateOnExit`` of ``retry_on=infra``: retry an attempt whose status
#: reason says its host went away (a Spot reclaim: "Host EC2 (instance i-...) terminated."),
#: exit at once on anything else (AWS Batch user guide, "Automated job retries").
INFRA_RETRY_RULES: list[dict[str, str]] = [
    {"onStatusReason": "Host EC2*", "action": "RETRY"},
    {"onReason": "*", "action": "EXIT"},
]


@dataclass(frozen=True)
class BatchOptions:
    """The resolved shape of one job: ``job_type`` is ``container`` or ``multinode``
    (``auto`` already decided), ``shm_size`` None means "the role's memory";
    ``follows_queue``: no platform was asked for, so the queue's compute environments decide
    it at submit (``platform`` is then ``EC2`` until they say EKS); ``consumables``: the
    ``(name, quantity)`` pairs of ``consumable_resources``."""

    job_type: str
    platform: str
    retry_on: str
    shm_size: int | None
    assign_public_ip: bool
    follows_queue: bool = False
    consumables: tuple[tuple[str, int], ...] = ()

    @property
    def fargate(self) -> bool:
        """Whether the job runs on Fargate."""
        return self.platform == "FARGATE"

    @property
    def eks(self) -> bool:
        """Whether the job runs as pods on a queue of EKS compute environments."""
        return self.platform == "EKS"


def _choice(cfg: Mapping[str, Any], key: str, allowed: tuple[str, ...], default: str) -> str:
    raw = cfg.get(key)
    value = str(raw).strip() if raw not in (None, "") else default
    for choice in allowed:
        if value.lower() == choice.lower():
            return choice
    raise InvalidRunConfigError(f"cfg: {key}={raw!r} is not one of: {', '.join(allowed)}")


def nearest_fargate_sizes(cpu: int, mem: int, count: int = 3) -> list[tuple[int, int]]:
    """Valid Fargate ``(vCPU, MiB)`` pairs near ``(cpu, mem)``: for the ``count`` vCPU counts
    nearest to ``cpu``, the memory size nearest to ``mem`` (at least ``mem`` where possible)."""
    best = [
        (c, min(sizes, key=lambda m: (m < mem, abs(m - mem))))
        for c, sizes in sorted(FARGATE_MEMORY.items(), key=lambda item: abs(item[0] - cpu))
    ]
    return best[:count]


def _check_fargate(app: AppDef, cfg: Mapping[str, Any], shm_size: int | None) -> None:
    """What Fargate does not run: GPUs, host paths, devices, privileged containers, ulimits,
    shared-memory sizes, instance types, vCPU/memory pairs it does not offer."""
    if not cfg.get("execution_role_arn"):
        raise InvalidRunConfigError(
            "cfg: execution_role_arn is not set; platform=FARGATE needs an execution role "
            "(the role Fargate pulls the image and writes the logs with)"
        )
    for key, bad in (("privileged", bool(cfg.get("privileged"))), ("ulimits", bool(cfg.get("ulimits")))):
        if bad:
            raise InvalidRunConfigError(
                f"cfg: {key}={cfg.get(key)!r} does not apply with platform=FARGATE "
                f"(AWS Batch takes {key} for jobs on EC2 resources only); drop it or use platform=EC2"
            )
    if shm_size:
        raise InvalidRunConfigError(
            f"cfg: shm_size={shm_size} does not apply with platform=FARGATE (Fargate does not take "
            "linuxParameters.sharedMemorySize); drop it, set shm_size=0 or use platform=EC2"
        )
    for i, role in enumerate(app.roles):
        where = f"roles[{i}]"
        res = role.resource
        if res.gpu > 0:
            raise InvalidSpecError(
                f"{where}.resource.gpu: role {role.name!r} asks for {res.gpu} GPU{'' if res.gpu == 1 else 's'}; "
                "Fargate has no GPUs: use platform=EC2 with a GPU queue"
            )
        if res.capabilities.get(INSTANCE_TYPE):
            raise InvalidSpecError(
                f"{where}.resource: role {role.name!r} asks for instance type "
                f"{res.capabilities[INSTANCE_TYPE]!r}; Fargate picks no instance types: "
                "give Resource(cpu=..., gpu=0, memMB=...) instead of a named resource"
            )
        if res.devices:
            raise InvalidSpecError(f"{where}.resource.devices: {res.devices}; Fargate jobs cannot use host devices")
        for j, mount in enumerate(role.mounts):
            if isinstance(mount, BindMount | DeviceMount):
                kind = "bind mount" if isinstance(mount, BindMount) else "device mount"
                raise InvalidSpecError(
                    f"{where}.mounts[{j}]: a {kind} of {mount.src_path!r}; Fargate jobs have no host paths "
                    "(EFS volumes work)"
                )
        sizes = FARGATE_MEMORY.get(res.cpu, ())
        if res.memMB not in sizes:
            near = ", ".join(f"cpu={c} memMB={m}" for c, m in nearest_fargate_sizes(res.cpu, res.memMB))
            valid = f"memMB in {sizes[0]}..{sizes[-1]} step {sizes[1] - sizes[0]}" if sizes else "no such vCPU count"
            raise InvalidSpecError(
                f"{where}.resource: role {role.name!r} asks for cpu={res.cpu} memMB={res.memMB}, a size Fargate "
                f"does not offer (cpu={res.cpu}: {valid}; vCPUs: {', '.join(map(str, FARGATE_MEMORY))}); "
                f"nearest valid sizes: {near}"
            )


def _check_eks(app: AppDef, cfg: Mapping[str, Any]) -> None:
    """What a pod on EKS does not take: ECS roles (a service account is EKS's), ulimits, host
    devices (EFA included); a bind mount becomes a ``hostPath`` and a volume a PVC."""
    for key, instead in (
        ("job_role_arn", "service_account=<a service account bound to the role>"),
        ("execution_role_arn", "nothing (the node's role pulls images)"),
        ("ulimits", "nothing (pods take the node's limits)"),
    ):
        if cfg.get(key):
            raise InvalidRunConfigError(
                f"cfg: {key}={cfg.get(key)!r} does not apply with platform=EKS (AWS Batch takes it for ECS "
                f"containers only); use {instead}, or platform=EC2"
            )
    for i, role in enumerate(app.roles):
        if role.resource.devices:
            raise InvalidSpecError(
                f"roles[{i}].resource.devices: {role.resource.devices}; this scheduler renders no host devices "
                "for pods on EKS (use the cluster's device plugin and platform=EC2 for EFA)"
            )
        for j, mount in enumerate(role.mounts):
            if isinstance(mount, DeviceMount):
                raise InvalidSpecError(
                    f"roles[{i}].mounts[{j}]: a device mount of {mount.src_path!r}; pods on EKS take no device "
                    "mounts (use the cluster's device plugin, or platform=EC2)"
                )
            if isinstance(mount, VolumeMount) and EFS_ID.match(mount.src):
                raise InvalidSpecError(
                    f"roles[{i}].mounts[{j}]: volume src={mount.src!r} is an EFS file system id, but a pod's volume "
                    "mount names a persistent volume claim: bind the file system to a PVC (EFS CSI driver) and "
                    "give the claim's name"
                )


def resolve(app: AppDef, cfg: Mapping[str, Any]) -> BatchOptions:
    """The ``BatchOptions`` of ``app`` under ``cfg``; a bad value or combination raises
    (``InvalidRunConfigError`` for options, ``InvalidSpecError`` for the app), naming it."""
    job_type = _choice(cfg, "job_type", JOB_TYPES, "auto")
    pod_opts = [k for k in ("namespace", "service_account", "eks_log_group") if cfg.get(k)]
    follows_queue = cfg.get("platform") in (None, "") and not pod_opts
    platform = _choice(cfg, "platform", PLATFORMS, "EKS" if pod_opts else "EC2")
    if pod_opts and platform != "EKS":
        raise InvalidRunConfigError(
            f"cfg: {pod_opts[0]}={cfg.get(pod_opts[0])!r} applies only with platform=EKS (pods), but platform="
            f"{platform}; drop {pod_opts[0]} or set platform=EKS"
        )
    consumables = tuple(parse_consumables(cfg.get("consumable_resources")))
    retry_on = _choice(cfg, "retry_on", RETRY_ON, "any")
    raw_shm = cfg.get("shm_size")
    if raw_shm is not None and (not isinstance(raw_shm, int) or isinstance(raw_shm, bool) or raw_shm < 0):
        raise InvalidRunConfigError(
            f"cfg: shm_size={raw_shm!r} must be an int >= 0 (MiB of /dev/shm; 0: Docker's default)"
        )
    total = sum(r.num_replicas for r in app.roles)
    shape = f"{total} replicas in {len(app.roles)} roles"
    if job_type == "auto":
        job_type = "container" if len(app.roles) == 1 and total == 1 else "multinode"
    elif job_type == "container" and (len(app.roles) != 1 or total != 1):
        raise InvalidRunConfigError(
            f"cfg: job_type=container runs one container, but the app has {shape}; "
            "use job_type=multinode (or auto) for more than one replica"
        )
    if platform == "FARGATE":
        if job_type != "container":
            raise InvalidRunConfigError(
                f"cfg: platform=FARGATE runs single-node jobs only (AWS Batch runs multi-node parallel jobs on "
                f"EC2 only), but the job is multinode ({shape}{', job_type=multinode' if total == 1 else ''}); "
                "use platform=EC2 or one role with one replica"
            )
        _check_fargate(app, cfg, raw_shm)
    elif platform == "EKS":
        _check_eks(app, cfg)
    if platform != "FARGATE" and cfg.get("assign_public_ip"):
        raise InvalidRunConfigError(
            "cfg: assign_public_ip=True applies only with platform=FARGATE (jobs on EC2 use the network "
            "of their compute environment's instances); drop it or set platform=FARGATE"
        )
    priority = cfg.get("priority") or 0
    if priority and not cfg.get("share_id"):
        raise InvalidRunConfigError(
            f"cfg: priority={priority} needs share_id: AWS Batch takes a scheduling priority only for jobs "
            "of a fair-share queue (one with a scheduling policy), which must also name their share; "
            "set share_id=<share> or drop priority (a FIFO queue runs jobs in submission order)"
        )
    return BatchOptions(
        job_type=job_type,
        platform=platform,
        retry_on=retry_on,
        shm_size=raw_shm,
        assign_public_ip=bool(cfg.get("assign_public_ip")),
        follows_queue=follows_queue,
        consumables=consumables,
    )


def retry_strategy(attempts: int, retry_on: str) -> dict[str, Any]:
    """``retryStrategy``: ``attempts`` in all; with ``infra``, only host terminations retry."""
    strategy: dict[str, Any] = {"attempts": attempts}
    if retry_on == "infra":
        strategy["evaluateOnExit"] = [dict(rule) for rule in INFRA_RETRY_RULES]
    return strategy


def is_eks(env: Mapping[str, Any]) -> bool:
    """Whether a ``DescribeComputeEnvironments`` entry runs jobs as pods on an EKS cluster."""
    return env.get("containerOrchestrationType") == "EKS" or bool(env.get("eksConfiguration"))


def compute_kind(env: Mapping[str, Any]) -> str:
    """What a ``DescribeComputeEnvironments`` entry runs jobs on: ``EC2``, ``SPOT``,
    ``FARGATE``, ``FARGATE_SPOT`` (its ``computeResources.type``) or ``UNMANAGED``."""
    if env.get("type") == "UNMANAGED":
        return "UNMANAGED"
    return str((env.get("computeResources") or {}).get("type") or "EC2")


_FARGATE_KINDS = frozenset({"FARGATE", "FARGATE_SPOT"})


def refusal(kind: str, multinode: bool, platform: str, eks: bool = False) -> str | None:
    """Why a compute environment of ``kind`` (``compute_kind``; ``eks``: on an EKS cluster,
    ``is_eks``) runs no such job (multi-node parallel or not, on ``platform``); None if it
    runs it."""
    if eks != (platform == "EKS"):
        if eks:
            return f"it runs pods on EKS, and the job is platform={platform} (set platform=EKS or leave platform unset)"
        return "it runs ECS containers, and the job is platform=EKS (pods): use a queue of EKS compute environments"
    fargate = kind in _FARGATE_KINDS
    if platform == "FARGATE" and not fargate:
        return f"it runs {kind} jobs, not platform=FARGATE ones"
    if platform != "FARGATE" and fargate:
        return f"it runs {kind} jobs only, and the job is platform={platform}"
    if multinode and (fargate or kind == "SPOT"):
        return f"AWS Batch runs no multi-node parallel jobs on {kind}"
    return None


@dataclass(frozen=True)
class QueueInfo:
    """What a job queue runs: the ``kinds`` of its compute environments (``compute_kind``)
    and whether it has a (fair-share) scheduling policy."""

    kinds: frozenset[str]
    fair_share: bool = False


def check_queue(queue: str, info: QueueInfo, job_type: str, platform: str, share_id: str | None) -> None:
    """Reject a job its queue cannot run: a Fargate job on an EC2 queue and the reverse, a
    share identifier on a FIFO queue and none on a fair-share queue (AWS refuses these
    submits), and a multi-node job on a queue of Spot or Fargate environments only (AWS Batch
    runs none there). UNMANAGED environments are the owner's instances: nothing is assumed."""
    if info.fair_share and not share_id:
        raise InvalidRunConfigError(
            f"cfg: share_id is not set, but queue={queue!r} has a fair-share scheduling policy, whose jobs must "
            "name their share; set share_id=<share> (and optionally priority)"
        )
    if share_id and not info.fair_share:
        raise InvalidRunConfigError(
            f"cfg: share_id={share_id!r} applies only to a queue with a fair-share scheduling policy, and "
            f"queue={queue!r} has none (it runs jobs first in, first out); drop share_id and priority"
        )
    kinds = info.kinds
    if not kinds:
        return
    listed = ", ".join(sorted(kinds))
    if platform == "FARGATE" and not kinds & _FARGATE_KINDS:
        raise InvalidRunConfigError(
            f"cfg: platform=FARGATE, but queue={queue!r} runs on {listed} compute environments; "
            "submit to a Fargate queue or use platform=EC2"
        )
    if platform == "EC2" and kinds <= _FARGATE_KINDS:
        raise InvalidRunConfigError(
            f"cfg: queue={queue!r} runs on {listed} compute environments; set platform=FARGATE "
            "(and execution_role_arn) to run there"
        )
    if job_type == "multinode" and kinds <= {"SPOT"} | _FARGATE_KINDS:
        raise InvalidRunConfigError(
            f"cfg: queue={queue!r} runs on {listed} compute environments only, where AWS Batch runs no "
            "multi-node parallel jobs; use an EC2 on-demand queue, or one role with one replica "
            "(job_type=auto or container) to run a single-node job here"
        )
