"""Rendering an ``AppDef`` into one AWS Batch job, and reading one back.

Pure functions (no AWS calls), so every field of the request can be unit-tested; moto drops
several of them (``describe_job_definitions`` omits ``nodeProperties``, submit ignores shares).
A single-node job (``type: container``) runs the one replica of the one role; a multi-node
parallel job makes each role one node range, node 0 (the first replica of the first role) the
main node. ``options`` decides which, and checks the options that only apply to one of them.
A job for EKS compute environments gets pods instead of ECS containers (``eks``), with the
same command and environment (``command``, ``role_env``).
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_torchx.core.errors import InvalidRunConfigError, InvalidSpecError
from airflow_provider_torchx.core.guards import MAX_GPU_HOURS, START_TIMEOUT, budget_seconds, positive_number
from airflow_provider_torchx.core.schedulers.aws_batch import eks, options
from airflow_provider_torchx.core.schedulers.aws_batch.options import BatchOptions
from airflow_provider_torchx.core.schedulers.aws_batch.run_options import MIN_ATTEMPT_TIMEOUT
from airflow_provider_torchx.core.specs import (
    INSTANCE_TYPE,
    AppDef,
    BindMount,
    DeviceMount,
    Resource,
    Role,
    VolumeMount,
    macros,
    make_app_handle,
)

#: Batch limits (AWS Batch user guide, "Node groups" and the API reference).
MAX_NODE_RANGES = 5
MAX_NODES = 1000
MAX_ATTEMPTS = 10
MAX_TAGS = 50
MIN_MEMORY_MB = 4
MAX_PRIORITY = 9999
JOB_NAME_MAX = 128

#: Where Batch sends container output (the awslogs driver's default group).
LOG_GROUP = "/aws/batch/job"

# Tags this scheduler writes; ``TAG_VERSION`` marks a job as ours.
TAG_PREFIX = "airflow-torchx/"
TAG_VERSION = TAG_PREFIX + "version"
TAG_APP_NAME = TAG_PREFIX + "app-name"
TAG_USER = TAG_PREFIX + "user"
TAG_LABEL = TAG_PREFIX + "label/"
TAG_CANCEL = TAG_PREFIX + "cancel-requested"
#: The run option ``eks_log_group`` of an EKS job, read back by its log reads (``eks_logs``).
TAG_EKS_LOG_GROUP = TAG_PREFIX + "eks-log-group"
#: The run option ``start_timeout`` (seconds), read back by the listing: Batch cannot hold it
#: itself, the reaper does (``ListAppResponse.start_timeout``).
TAG_START_TIMEOUT = TAG_PREFIX + "start-timeout"

#: Env vars set on every node range.
ENV_ROLE_NAME = "TORCHX_ROLE_NAME"
#: The role's index in ``app.roles`` (TorchX's name; scripts written for TorchX read it).
ENV_ROLE_IDX = "TORCHX_ROLE_IDX"
ENV_FIRST_NODE = "TORCHX_ROLE_FIRST_NODE"
ENV_JOB_ID = "TORCHX_JOB_ID"
#: What ``${replica_id}`` becomes inside the ``sh -c`` wrapper (Batch does not expand
#: variables in ``command``); an unset node index counts as 0, as POSIX arithmetic does.
REPLICA_ID_EXPR = "$((AWS_BATCH_JOB_NODE_INDEX - TORCHX_ROLE_FIRST_NODE))"
#: Env var holding the main node's address on the other nodes (``${rank0_env}``).
RANK0_ENV = "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"
#: ``${rank0_env}`` of a single-node job, where Batch sets no main-node address: ``localhost``.
RANK0_HOST_ENV = "TORCHX_RANK0_HOST"
#: Env vars this scheduler adds, left out when a role is read back.
OUR_ENV = (ENV_ROLE_NAME, ENV_ROLE_IDX, ENV_FIRST_NODE, RANK0_HOST_ENV)

ULIMIT_NAMES = (
    "core",
    "cpu",
    "data",
    "fsize",
    "locks",
    "memlock",
    "msgqueue",
    "nice",
    "nofile",
    "nproc",
    "rss",
    "rtprio",
    "rttime",
    "sigpending",
    "stack",
)
_EFA_DEVICE = "vpc.amazonaws.com/efa"
_RESOURCE_HINT = (
    " (set Role.resource, e.g. Resource(cpu=1, gpu=0, memMB=1024) or a named resource such as aws_p3.2xlarge)"
)
_JOB_NAME_BAD = re.compile(r"[^A-Za-z0-9_-]+")
_EFS_ID = options.EFS_ID
_PVC_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
_DEVICE_PERMS = {"r": "READ", "w": "WRITE", "m": "MKNOD"}
# A marker no user string contains, substituted for ``${replica_id}`` and then turned into
# shell code outside of quotes.
_REPLICA_MARK = "\x00replica_id\x00"


@dataclass
class BatchJob:
    """The native request: the job definition to register and how to submit it.

    ``images_to_push`` maps a local image id to the ``(repository, tag)`` it is pushed as
    before the job definition is registered. ``attempt_timeout`` (seconds; None: no limit) is
    submitted as the job's ``timeout``, which AWS Batch applies to each attempt of the whole
    job (all nodes of a multi-node one): the run option ``attempt_timeout``, bounded by the GPU
    budget ``max_gpu_hours`` (``attempt_seconds``).
    """

    name: str
    queue: str
    share_id: str | None
    job_def: dict[str, Any]
    images_to_push: dict[str, tuple[str, str]] = field(default_factory=dict)
    priority: int = 0
    attempt_timeout: int | None = None
    #: No platform was asked for: ``schedule`` renders the job again for EKS when the
    #: queue's compute environments are EKS (``options.BatchOptions.follows_queue``).
    follows_queue: bool = False

    @property
    def on_eks(self) -> bool:
        """Whether the job is rendered as pods for EKS compute environments."""
        return eks.is_eks_job(self.job_def)

    @property
    def app_id(self) -> str:
        """``queue:job_name``."""
        return f"{self.queue}:{self.name}"

    def submit_request(self) -> dict[str, Any]:
        """The ``SubmitJob`` arguments, given the registered job definition's ARN later."""
        req: dict[str, Any] = {
            "jobName": self.name,
            "jobQueue": self.queue,
            "tags": dict(self.job_def.get("tags", {})),
        }
        if not self.on_eks:  # AWS Batch refuses propagateTags for jobs on EKS
            req["propagateTags"] = True
        if self.share_id:
            req["shareIdentifier"] = self.share_id
            req["schedulingPriorityOverride"] = self.priority
        if self.attempt_timeout is not None:
            req["timeout"] = {"attemptDurationSeconds": self.attempt_timeout}
        return req

    def format(self) -> str:
        """What a dry run shows: images to push, the job definition and the submit request."""
        return json.dumps(
            {
                "images_to_push": {k: f"{r}:{t}" for k, (r, t) in self.images_to_push.items()},
                "job_definition": self.job_def,
                "submit_job": self.submit_request(),
            },
            indent=2,
            sort_keys=True,
        )


# --------------------------------------------------------------------------- cfg values


def queue_name(queue: str) -> str:
    """A queue name from a name or an ARN (``arn:...:job-queue/NAME``)."""
    name = queue.rsplit("job-queue/", 1)[-1] if queue.startswith("arn:") else queue
    if not name or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}", name):
        raise InvalidRunConfigError(
            f"cfg: queue={queue!r} is not a job queue name or ARN (letters, digits, '-', '_', up to 128)"
        )
    return name


def parse_ulimits(items: list[str] | None) -> list[dict[str, Any]]:
    """``["nofile:1024:4096", ...]`` -> Batch ``ulimits``; bad entries raise naming them."""
    out: list[dict[str, Any]] = []
    for item in items or []:
        parts = item.split(":")
        form = "name:softLimit:hardLimit, e.g. nofile:1024:4096"
        if len(parts) != 3:
            raise InvalidRunConfigError(f"cfg: ulimits entry {item!r} is not {form}")
        name, soft, hard = (p.strip() for p in parts)
        if name not in ULIMIT_NAMES:
            raise InvalidRunConfigError(
                f"cfg: ulimits entry {item!r} has unknown name {name!r}; allowed: {', '.join(ULIMIT_NAMES)}"
            )
        try:
            soft_i, hard_i = int(soft), int(hard)
        except ValueError:
            raise InvalidRunConfigError(f"cfg: ulimits entry {item!r} needs integer limits ({form})") from None
        soft_n, hard_n = (float("inf") if v == -1 else v for v in (soft_i, hard_i))
        if soft_n < 0 or hard_n < 0 or soft_n > hard_n:
            raise InvalidRunConfigError(
                f"cfg: ulimits entry {item!r} must have 0 <= softLimit <= hardLimit (-1: unlimited; {form})"
            )
        out.append({"name": name, "softLimit": soft_i, "hardLimit": hard_i})
    return out


def labels_hash(labels: Mapping[str, str]) -> str:
    """A short, stable hash of a label set: the job-name prefix jobs are found by."""
    blob = json.dumps(sorted(labels.items()), separators=(",", ":"))
    return "l" + hashlib.sha256(blob.encode()).hexdigest()[:12]


def make_job_name(app_name: str, labels: Mapping[str, str]) -> str:
    """A unique Batch job name: ``[<labels hash>-]<app name>-<random>``.

    Jobs with labels start with their labels' hash so ``ListJobs``' ``JOB_NAME`` prefix
    filter finds them (ListJobs cannot filter on tags).
    """
    suffix = secrets.token_hex(4)
    prefix = f"{labels_hash(labels)}-" if labels else ""
    room = JOB_NAME_MAX - len(prefix) - len(suffix) - 1
    base = _JOB_NAME_BAD.sub("-", app_name).strip("-_")[:room] or "app"
    return f"{prefix}{base}-{suffix}"


# --------------------------------------------------------------------------- validation


def validate(app: AppDef, on_eks: bool = False) -> None:
    """Batch's own limits (raise ``InvalidSpecError`` naming the field), before any AWS call;
    ``on_eks``: the job runs pods (a volume mount's ``src`` names a PVC, not an EFS id)."""
    if len(app.roles) > MAX_NODE_RANGES:
        raise InvalidSpecError(
            f"app.roles: {len(app.roles)} roles; AWS Batch allows at most {MAX_NODE_RANGES} node ranges (one per role)"
        )
    total = sum(r.num_replicas for r in app.roles)
    if total > MAX_NODES:
        raise InvalidSpecError(
            f"roles[*].num_replicas: {total} nodes in total; AWS Batch allows at most {MAX_NODES} per job"
        )
    itypes = set()
    for i, role in enumerate(app.roles):
        where = f"roles[{i}]"
        res = role.resource
        if not isinstance(res.cpu, int) or res.cpu < 1:
            raise InvalidSpecError(
                f"{where}.resource.cpu: role {role.name!r} asks for {res.cpu!r} vCPUs; "
                f"AWS Batch jobs need an int >= 1{_RESOURCE_HINT}"
            )
        if not isinstance(res.memMB, int) or res.memMB < MIN_MEMORY_MB:
            raise InvalidSpecError(
                f"{where}.resource.memMB: role {role.name!r} asks for {res.memMB!r} MiB; "
                f"AWS Batch needs an int >= {MIN_MEMORY_MB}{_RESOURCE_HINT}"
            )
        if not isinstance(res.gpu, int) or res.gpu < 0:
            raise InvalidSpecError(f"{where}.resource.gpu: {res.gpu!r} must be an int >= 0")
        if role.max_retries + 1 > MAX_ATTEMPTS:
            raise InvalidSpecError(
                f"{where}.max_retries: {role.max_retries}; AWS Batch allows at most {MAX_ATTEMPTS} attempts "
                f"(max_retries <= {MAX_ATTEMPTS - 1})"
            )
        if res.capabilities.get(INSTANCE_TYPE):
            itypes.add(res.capabilities[INSTANCE_TYPE])
        for j, mount in enumerate(role.mounts):
            _validate_mount(f"{where}.mounts[{j}]", mount, on_eks)
    if len(itypes) > 1:
        raise InvalidSpecError(
            f"roles[*].resource: instance types {sorted(itypes)}; all node ranges of an AWS Batch "
            "multi-node job must use the same instance type"
        )


def _validate_mount(where: str, mount: BindMount | VolumeMount | DeviceMount, on_eks: bool) -> None:
    if isinstance(mount, BindMount | DeviceMount):
        paths = {"src": mount.src_path, "dst": mount.dst_path}
    else:
        paths = {"dst": mount.dst_path}
        if on_eks and not _PVC_NAME.fullmatch(mount.src):
            raise InvalidSpecError(
                f"{where}: volume src={mount.src!r} is not a persistent volume claim name (platform=EKS mounts "
                "a PVC of the pod's namespace: lower-case letters, digits, '-' and '.')"
            )
        if not on_eks and not _EFS_ID.match(mount.src):
            raise InvalidSpecError(
                f"{where}: volume src={mount.src!r} is not an EFS file system id (fs-xxxxxxxx); "
                "mount other file systems on the host and bind-mount them"
            )
    for key, path in paths.items():
        if not path.startswith("/"):
            raise InvalidSpecError(f"{where}: {key}={path!r} must be an absolute path")


def check_tags(tags: Mapping[str, str]) -> None:
    """Batch's tag limits: at most 50, keys up to 128 and values up to 256 characters."""
    if len(tags) > MAX_TAGS:
        raise InvalidSpecError(
            f"app.metadata/labels: {len(tags)} job tags (metadata, labels and {TAG_PREFIX}*); "
            f"AWS Batch allows at most {MAX_TAGS}"
        )
    for key, value in tags.items():
        if not 1 <= len(key) <= 128 or len(value) > 256:
            raise InvalidSpecError(
                f"app.metadata/labels: tag {key!r}={value!r} is too long (keys 1-128, values up to 256 characters)"
            )


# --------------------------------------------------------------------------- rendering


def _quote_with_replica(text: str) -> str:
    """Shell-quote ``text``, leaving the replica id expression unquoted so it expands."""
    parts = text.split(_REPLICA_MARK)
    return f'"{REPLICA_ID_EXPR}"'.join(shlex.quote(p) if p or len(parts) == 1 else "" for p in parts)


def role_env(role: Role, role_idx: int, first_node: int, opts: BatchOptions) -> list[dict[str, str]]:
    """The environment of role ``role_idx`` (macros applied) whose first replica is node
    ``first_node``, as Batch's ``name``/``value`` pairs (an ECS container's ``environment``, a
    pod container's ``env``): the role's env, then ours (``OUR_ENV``); a single-node job gets
    the ``${rank0_env}`` variable holding ``localhost``."""
    env = {**role.env, ENV_ROLE_NAME: role.name, ENV_ROLE_IDX: str(role_idx), ENV_FIRST_NODE: str(first_node)}
    if opts.job_type == "container":
        env.setdefault(RANK0_HOST_ENV, "localhost")
    return [{"name": k, "value": v.replace(_REPLICA_MARK, "0")} for k, v in env.items()]


def command(role: Role) -> list[str]:
    """``entrypoint + args``; under ``sh -c`` when a value uses ``${replica_id}``."""
    argv = [role.entrypoint, *role.args]
    per_node_env = {k: v for k, v in role.env.items() if _REPLICA_MARK in v}
    if not per_node_env and not any(_REPLICA_MARK in a for a in argv):
        return argv
    for key in per_node_env:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise InvalidSpecError(
                f"env: {key!r} uses ${{replica_id}}, so it is set by a shell, which needs a name of letters, "
                "digits and '_' not starting with a digit"
            )
    exports = "".join(f"export {k}={_quote_with_replica(v)}; " for k, v in per_node_env.items())
    return ["sh", "-c", exports + "exec " + " ".join(_quote_with_replica(a) for a in argv)]


def _resource_requirements(res: Resource) -> list[dict[str, str]]:
    reqs = [{"type": "VCPU", "value": str(res.cpu)}, {"type": "MEMORY", "value": str(res.memMB)}]
    if res.gpu > 0:
        reqs.append({"type": "GPU", "value": str(res.gpu)})
    return reqs


def _mounts(role: Role) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """``(volumes, mountPoints, devices)`` for the role's mounts and EFA devices."""
    volumes: list[dict[str, Any]] = []
    points: list[dict[str, Any]] = []
    devices: list[dict[str, Any]] = []
    for i, mount in enumerate(role.mounts):
        name = f"mount_{i}"
        if isinstance(mount, BindMount):
            volumes.append({"name": name, "host": {"sourcePath": mount.src_path}})
            points.append({"containerPath": mount.dst_path, "readOnly": mount.read_only, "sourceVolume": name})
        elif isinstance(mount, VolumeMount):
            volumes.append({"name": name, "efsVolumeConfiguration": {"fileSystemId": mount.src}})
            points.append({"containerPath": mount.dst_path, "readOnly": mount.read_only, "sourceVolume": name})
        else:
            devices.append(
                {
                    "hostPath": mount.src_path,
                    "containerPath": mount.dst_path,
                    "permissions": [_DEVICE_PERMS[p] for p in mount.permissions],
                }
            )
    for i in range(role.resource.devices.get(_EFA_DEVICE, 0)):
        path = f"/dev/infiniband/uverbs{i}"
        devices.append({"hostPath": path, "containerPath": path, "permissions": ["READ", "WRITE", "MKNOD"]})
    return volumes, points, devices


def container_properties(
    role: Role,
    role_idx: int,
    first_node: int,
    cfg: Mapping[str, Any],
    ulimits: list[dict[str, Any]],
    opts: BatchOptions,
) -> dict[str, Any]:
    """The container of role ``role_idx`` (macros already applied) whose first replica is node
    ``first_node``: a node range's ``container`` or a single-node job's ``containerProperties``.

    ``/dev/shm`` is sized like TorchX does (the role's memory; PyTorch's ``DataLoader`` workers
    share tensors through it and die of Docker's 64 MiB) unless ``shm_size`` says otherwise.
    Fields Fargate does not take are left out; ``options.resolve`` rejected asking for them.
    """
    volumes, points, devices = _mounts(role)
    container: dict[str, Any] = {
        "image": role.image,
        "command": command(role),
        "environment": role_env(role, role_idx, first_node, opts),
        "resourceRequirements": _resource_requirements(role.resource),
        "logConfiguration": {"logDriver": "awslogs"},
        "volumes": volumes,
        "mountPoints": points,
    }
    linux: dict[str, Any] = {}
    if not opts.fargate:
        container["privileged"] = bool(cfg.get("privileged"))
        container["ulimits"] = ulimits
        shm = role.resource.memMB if opts.shm_size is None else opts.shm_size
        if shm:
            linux["sharedMemorySize"] = shm
    if devices:
        linux["devices"] = devices
    if linux:
        container["linuxParameters"] = linux
    # AWS takes instanceType for multi-node jobs only; a single-node job gets the named
    # resource's vCPUs, memory and GPUs (TorchX also renders it for one replica only).
    if role.resource.capabilities.get(INSTANCE_TYPE) and opts.job_type == "multinode":
        container["instanceType"] = role.resource.capabilities[INSTANCE_TYPE]
    for opt, key in (("job_role_arn", "jobRoleArn"), ("execution_role_arn", "executionRoleArn")):
        if cfg.get(opt):
            container[key] = cfg[opt]
    if opts.fargate:
        container["networkConfiguration"] = {"assignPublicIp": "ENABLED" if opts.assign_public_ip else "DISABLED"}
        container["fargatePlatformConfiguration"] = {"platformVersion": "LATEST"}
    return container


def node_range(container: dict[str, Any], first_node: int, num_replicas: int) -> dict[str, Any]:
    """A node range of ``num_replicas`` nodes from ``first_node``; ``targetNodes`` always in
    AWS's ``first:last`` form (``"2:2"`` for one node)."""
    return {"targetNodes": f"{first_node}:{first_node + num_replicas - 1}", "container": container}


def render(
    app: AppDef,
    cfg: Mapping[str, Any],
    labels: Mapping[str, str],
    *,
    backend: str,
    session_name: str,
    version: str,
    images_to_push: Mapping[str, tuple[str, str]],
    name: str | None = None,
    platform: str | None = None,
) -> BatchJob:
    """The ``BatchJob`` for ``app`` (validated) with resolved ``cfg`` and job ``labels``.

    Substitutes the macros (``${app_id}`` is the full ``queue:job_name``; in a single-node job
    ``${replica_id}`` is ``0`` and ``${rank0_env}`` names a variable holding ``localhost``),
    points roles whose image is pushed at its repository tag, and sets ``TORCHX_JOB_ID`` to the
    app handle when the runner did not. ``name``: the job's name (default: a new one,
    ``make_job_name``); ``platform``: the platform when ``cfg`` leaves it to the queue (EKS).
    """
    if platform is not None and not cfg.get("platform"):
        cfg = {**cfg, "platform": platform}
    opts = options.resolve(app, cfg)
    single = opts.job_type == "container"
    queue = queue_name(str(cfg["queue"]))
    ulimits = parse_ulimits(cfg.get("ulimits"))
    priority = int(cfg.get("priority") or 0)
    if not 0 <= priority <= MAX_PRIORITY:
        raise InvalidRunConfigError(f"cfg: priority={priority} must be between 0 and {MAX_PRIORITY}")
    name = name or make_job_name(app.name, labels)
    app_id = f"{queue}:{name}"
    app_values = macros.Values(img_root="", app_id=app_id, replica_id=macros.replica_id, rank0_env=RANK0_ENV)
    tags = {
        TAG_VERSION: version,
        TAG_APP_NAME: app.name,
        TAG_USER: str(cfg.get("user") or ""),
        **{str(k): app_values.substitute(str(v)) for k, v in app.metadata.items()},
        **{TAG_LABEL + k: v for k, v in labels.items()},
    }
    if cfg.get(START_TIMEOUT) is not None:
        tags[TAG_START_TIMEOUT] = f"{float(cfg[START_TIMEOUT]):g}"
    if opts.eks and cfg.get("eks_log_group"):
        tags[TAG_EKS_LOG_GROUP] = str(cfg["eks_log_group"])
    check_tags(tags)
    containers = []
    first = 0
    for idx, role in enumerate(app.roles):
        values = macros.Values(
            img_root="",
            app_id=app_id,
            replica_id="0" if single else _REPLICA_MARK,
            rank0_env=RANK0_HOST_ENV if single else RANK0_ENV,
        )
        role = values.apply(role)
        role.env.setdefault(ENV_JOB_ID, make_app_handle(backend, session_name, app_id))
        if role.image in images_to_push:
            repo, tag = images_to_push[role.image]
            role.image = f"{repo}:{tag}"
        if opts.eks:
            props = eks.eks_properties(
                role, command(role), role_env(role, idx, first, opts), cfg, opts, eks.pod_labels(app.name, labels)
            )
            containers.append((first, role.num_replicas, props))
        else:
            containers.append((first, role.num_replicas, container_properties(role, idx, first, cfg, ulimits, opts)))
        first += role.num_replicas
    job_def: dict[str, Any] = {"jobDefinitionName": name, "type": opts.job_type}
    if single:
        job_def["eksProperties" if opts.eks else "containerProperties"] = containers[0][2]
    else:
        ranges = [node_range(c, start, n) for start, n, c in containers]
        if opts.eks:
            ranges = [_eks_node_range(rng, role) for rng, role in zip(ranges, app.roles, strict=True)]
        job_def["nodeProperties"] = {"numNodes": first, "mainNode": 0, "nodeRangeProperties": ranges}
    job_def["retryStrategy"] = options.retry_strategy(1 + max(r.max_retries for r in app.roles), opts.retry_on)
    if not opts.eks:  # AWS Batch refuses both for jobs on EKS
        job_def.update(platformCapabilities=[opts.platform], propagateTags=True)
    if opts.consumables:
        job_def["consumableResourceProperties"] = consumable_properties(opts.consumables)
    job_def["tags"] = tags
    return BatchJob(
        name=name,
        queue=queue,
        share_id=str(cfg["share_id"]) if cfg.get("share_id") else None,
        job_def=job_def,
        images_to_push=dict(images_to_push),
        priority=priority,
        attempt_timeout=attempt_seconds(app, cfg),
        follows_queue=opts.follows_queue,
    )


def tagged_start_timeout(tags: Mapping[str, str]) -> float | None:
    """The ``start_timeout`` a job's tags carry (``TAG_START_TIMEOUT``); None: none, or not a
    number > 0."""
    return positive_number(tags.get(TAG_START_TIMEOUT))


def attempt_seconds(app: AppDef, cfg: Mapping[str, Any]) -> int | None:
    """The job's ``timeout.attemptDurationSeconds``: the run option ``attempt_timeout``,
    bounded by the GPU budget ``max_gpu_hours`` over the GPUs the job reserves (each node's
    GPUs, every node: ``guards.budget_seconds``), so that AWS Batch stops an attempt that
    would spend the budget with nobody watching; never under AWS Batch's minimum
    (``MIN_ATTEMPT_TIMEOUT``). None: neither is set (or the job reserves no GPU)."""
    gpus = sum(max(0, role.resource.gpu) * role.num_replicas for role in app.roles)
    timeout, budget = cfg.get("attempt_timeout"), cfg.get(MAX_GPU_HOURS)
    seconds = budget_seconds(
        float(budget) if budget is not None else None, gpus, int(timeout) if timeout is not None else None
    )
    return None if seconds is None else max(MIN_ATTEMPT_TIMEOUT, seconds)


def _eks_node_range(rng: dict[str, Any], role: Role) -> dict[str, Any]:
    """A node range of pods: ``eksProperties`` for ``container``, and the named resource's
    instance type as the range's ``instanceTypes`` (one element, AWS's limit)."""
    out = {"targetNodes": rng["targetNodes"], "eksProperties": rng["container"]}
    if role.resource.capabilities.get(INSTANCE_TYPE):
        out["instanceTypes"] = [role.resource.capabilities[INSTANCE_TYPE]]
    return out


def consumable_properties(consumables: Sequence[tuple[str, int]]) -> dict[str, Any]:
    """``consumableResourceProperties`` for ``(name or ARN, quantity)`` pairs: what the job
    holds while it runs (the job definition's, or SubmitJob's override)."""
    return {"consumableResourceList": [{"consumableResource": n, "quantity": q} for n, q in consumables]}


# --------------------------------------------------------------------------- reading back


def target_range(target: str, num_nodes: int) -> tuple[int, int]:
    """The first and last node of a ``targetNodes`` value (``"2:5"``, ``"3:"``, ``"4"``)."""
    start, sep, end = target.partition(":")
    first = int(start) if start else 0
    if not sep:
        return first, first
    return first, int(end) if end else num_nodes - 1


def is_multinode(job: Mapping[str, Any]) -> bool:
    """Whether a DescribeJobs entry is a multi-node parallel job (JobDetail has no ``type``)."""
    return bool(job.get("nodeProperties"))


def node_ranges(job: Mapping[str, Any]) -> list[tuple[str, int, int, dict[str, Any]]]:
    """``(role name, first node, last node, container)`` of each node range of a job; a
    single-node job is one range of node 0 (its ``container``). A job on EKS is read through
    ``eks.as_ecs_shape`` (its pod's container as an ECS one)."""
    job = eks.as_ecs_shape(job)
    if not is_multinode(job):
        container = job.get("container") or {}
        env = {e["name"]: e["value"] for e in container.get("environment", [])}
        return [(env.get(ENV_ROLE_NAME, "node_range_0"), 0, 0, dict(container))]
    props = job.get("nodeProperties") or {}
    num = int(props.get("numNodes", 0))
    out = []
    for i, rng in enumerate(props.get("nodeRangeProperties", [])):
        container = rng.get("container", {})
        env = {e["name"]: e["value"] for e in container.get("environment", [])}
        first, last = target_range(rng["targetNodes"], num)
        out.append((env.get(ENV_ROLE_NAME, f"node_range_{i}"), first, last, container))
    return out


def role_from_container(name: str, num_replicas: int, container: Mapping[str, Any]) -> Role:
    """A ``Role`` rebuilt from a node range's container (as far as Batch keeps it)."""
    reqs = {r["type"]: r["value"] for r in container.get("resourceRequirements", [])}
    command = list(container.get("command", []))
    env = {e["name"]: e["value"] for e in container.get("environment", [])}
    for key in OUR_ENV:
        env.pop(key, None)
    caps = {INSTANCE_TYPE: container["instanceType"]} if container.get("instanceType") else {}
    return Role(
        name=name,
        image=container.get("image", ""),
        entrypoint=command[0] if command else "",
        args=command[1:],
        env=env,
        num_replicas=num_replicas,
        resource=Resource(
            cpu=int(reqs.get("VCPU", container.get("vcpus", 0)) or 0),
            gpu=int(reqs.get("GPU", 0)),
            memMB=int(reqs.get("MEMORY", container.get("memory", 0)) or 0),
            capabilities=caps,
        ),
    )
