"""Rendering a role as a pod for a queue of EKS compute environments, and reading pods back.

Pure functions over the shapes of the AWS Batch API reference (``EksProperties``,
``EksPodProperties``, ``EksContainer``; ``EksAttemptDetail`` and ``EksPropertiesDetail`` in
``DescribeJobs``), beside ``render`` (the ECS rendering), whose command, environment and
rendezvous variables a pod's container gets unchanged: the TorchX env is the same on ECS and
EKS. moto registers and submits EKS jobs but runs no pods; what a running or ended pod looks
like is read from the documented fields only.

A role's resources become the container's ``requests`` and ``limits`` (equal, so the pod gets
the Guaranteed class: memory in ``Mi``, whole vCPUs, ``nvidia.com/gpu``); ``/dev/shm`` is a
memory-backed ``emptyDir`` sized like ``shm_size`` on ECS; a bind mount is a ``hostPath``
volume and a volume mount a ``persistentVolumeClaim`` (``src`` is the claim's name, as TorchX's
Kubernetes scheduler reads it). The pod's labels carry the job's Airflow identity
(``core/identity.py``) as valid Kubernetes label values, so ``kubectl get pods -l`` finds it.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any

from airflow_provider_torchx.core import identity
from airflow_provider_torchx.core.schedulers.aws_batch.options import BatchOptions
from airflow_provider_torchx.core.specs import BindMount, Role, VolumeMount

#: The container's name in every pod (one container per pod).
CONTAINER_NAME = "main"
GPU_RESOURCE = "nvidia.com/gpu"
SHM_VOLUME = "dshm"
#: Pod label keys (letters, digits, ``-`` and ``_``: what ``EksMetadata.labels`` takes) for
#: the job's identity and app name.
LABEL_KEYS: dict[str, str] = {
    identity.DAG_ID: "airflow-dag-id",
    identity.TASK_ID: "airflow-task-id",
    identity.RUN_ID: "airflow-run-id",
    identity.MAP_INDEX: "airflow-map-index",
}
LABEL_APP_NAME = "torchx-app-name"
MAX_LABEL_VALUE = 63
_LABEL_BAD = re.compile(r"[^A-Za-z0-9_.-]+")
_LABEL_EDGE = re.compile(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$")


def label_value(text: str) -> str:
    """``text`` as a Kubernetes label value: at most 63 letters, digits, ``-``, ``_`` and
    ``.``, starting and ending with a letter or digit (others become ``_``; a longer value keeps
    its start and a hash of the whole, so distinct values stay distinct)."""
    value = _LABEL_EDGE.sub("", _LABEL_BAD.sub("_", text))
    if len(value) > MAX_LABEL_VALUE:
        digest = hashlib.sha256(text.encode()).hexdigest()[:10]
        value = _LABEL_EDGE.sub("", value[: MAX_LABEL_VALUE - len(digest) - 1]) + "-" + digest
    return value


def pod_labels(app_name: str, labels: Mapping[str, str]) -> dict[str, str]:
    """The pod's labels: the app name and the job's Airflow identity labels it has."""
    out = {LABEL_APP_NAME: label_value(app_name)}
    out.update({key: label_value(labels[name]) for name, key in LABEL_KEYS.items() if labels.get(name)})
    return {k: v for k, v in out.items() if v}


def resources(role: Role) -> dict[str, dict[str, str]]:
    """The container's ``requests`` and ``limits`` (equal): vCPUs, memory in MiB, GPUs."""
    res = role.resource
    amounts = {"cpu": str(res.cpu), "memory": f"{res.memMB}Mi"}
    if res.gpu > 0:
        amounts[GPU_RESOURCE] = str(res.gpu)
    return {"requests": dict(amounts), "limits": dict(amounts)}


def volumes(role: Role, shm_mib: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(volumes, volumeMounts)``: ``/dev/shm`` of ``shm_mib`` MiB (none for 0), then the
    role's bind mounts (``hostPath``) and volume mounts (``persistentVolumeClaim``).
    ``options.resolve`` already refused device mounts."""
    vols: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    if shm_mib:
        vols.append({"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": f"{shm_mib}Mi"}})
        mounts.append({"name": SHM_VOLUME, "mountPath": "/dev/shm"})
    for i, mount in enumerate(role.mounts):
        name = f"mount-{i}"
        if isinstance(mount, BindMount):
            vols.append({"name": name, "hostPath": {"path": mount.src_path}})
        elif isinstance(mount, VolumeMount):
            vols.append({"name": name, "persistentVolumeClaim": {"claimName": mount.src, "readOnly": mount.read_only}})
        else:
            continue
        mounts.append({"name": name, "mountPath": mount.dst_path, "readOnly": mount.read_only})
    return vols, mounts


def eks_properties(
    role: Role,
    argv: list[str],
    env: list[dict[str, str]],
    cfg: Mapping[str, Any],
    opts: BatchOptions,
    labels: Mapping[str, str],
) -> dict[str, Any]:
    """The ``eksProperties`` of role ``role`` (macros applied): one pod of one container
    running ``argv`` (``render.command``) with ``env`` (``render.role_env``); ``labels``: the
    pod's (``pod_labels``). A single-node job's ``eksProperties`` or a node range's."""
    vols, mounts = volumes(role, role.resource.memMB if opts.shm_size is None else opts.shm_size)
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": role.image,
        "command": argv[:1],
        "args": argv[1:],
        "env": env,
        "resources": resources(role),
        "volumeMounts": mounts,
    }
    if cfg.get("privileged"):
        container["securityContext"] = {"privileged": True}
    metadata: dict[str, Any] = {"labels": dict(labels)}
    if cfg.get("namespace"):
        metadata["namespace"] = str(cfg["namespace"])
    pod: dict[str, Any] = {"containers": [container], "volumes": vols, "metadata": metadata}
    if cfg.get("service_account"):
        pod["serviceAccountName"] = str(cfg["service_account"])
    return {"podProperties": pod}


# --------------------------------------------------------------------------- reading back


def _memory_mib(text: str) -> int:
    """A Kubernetes memory quantity in MiB (``8192Mi``, ``8Gi``, bytes); 0 if unreadable."""
    m = re.fullmatch(r"(\d+)(Ki|Mi|Gi|Ti)?", str(text).strip())
    if not m:
        return 0
    scale = {None: 1 / 2**20, "Ki": 1 / 1024, "Mi": 1, "Gi": 1024, "Ti": 1024**2}[m.group(2)]
    return int(int(m.group(1)) * scale)


def container_view(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The pod's (first) container in the shape of an ECS ``container`` (``image``,
    ``command`` = command + args, ``environment``, ``resourceRequirements``), so one reading
    (``render.role_from_container``) serves both."""
    containers = pod.get("containers") or [{}]
    c = containers[0]
    amounts = {**((c.get("resources") or {}).get("requests") or {}), **((c.get("resources") or {}).get("limits") or {})}
    reqs = [{"type": "VCPU", "value": str(amounts.get("cpu", 0))}]
    reqs.append({"type": "MEMORY", "value": str(_memory_mib(amounts.get("memory", "0")))})
    if amounts.get(GPU_RESOURCE):
        reqs.append({"type": "GPU", "value": str(amounts[GPU_RESOURCE])})
    view: dict[str, Any] = {
        "image": c.get("image", ""),
        "command": [*(c.get("command") or []), *(c.get("args") or [])],
        "environment": list(c.get("env") or []),
        "resourceRequirements": reqs,
    }
    if c.get("exitCode") is not None:
        view["exitCode"] = c["exitCode"]
    if c.get("reason"):
        view["reason"] = c["reason"]
    return view


def is_eks_job(job: Mapping[str, Any]) -> bool:
    """Whether a DescribeJobs entry (or a job definition) runs pods on EKS."""
    if job.get("eksProperties") or job.get("eksAttempts"):
        return True
    ranges = (job.get("nodeProperties") or {}).get("nodeRangeProperties") or []
    return any(r.get("eksProperties") for r in ranges)


def _attempt(attempt: Mapping[str, Any]) -> dict[str, Any]:
    """An ``EksAttemptDetail`` as an ECS ``AttemptDetail``: its first container's exit code
    and reason as ``container``; pod and node names kept."""
    c = (attempt.get("containers") or [{}])[0]
    container = {k: c[k] for k in ("exitCode", "reason") if c.get(k) is not None}
    out = {k: attempt[k] for k in ("startedAt", "stoppedAt", "statusReason") if attempt.get(k) is not None}
    return {**out, "container": container, "podName": attempt.get("podName"), "nodeName": attempt.get("nodeName")}


def as_ecs_shape(job: Mapping[str, Any]) -> Mapping[str, Any]:
    """A DescribeJobs entry of an EKS job with the ECS fields the status and usage readers
    use: ``attempts`` from ``eksAttempts``; a single-node job's ``container`` (definition,
    exit code, reason) from ``eksProperties.podProperties``; ``podName``/``nodeName`` of its
    pod (or newest attempt); a multi-node job's node ranges each with a ``container`` view.
    Any other entry is returned as it is."""
    if not is_eks_job(job):
        return job
    out = dict(job)
    out["attempts"] = [_attempt(a) for a in job.get("eksAttempts") or []]
    pod = (job.get("eksProperties") or {}).get("podProperties") or {}
    out.pop("container", None)  # what moto puts there describes no pod
    if pod:
        out["container"] = container_view(pod)
    last = out["attempts"][-1] if out["attempts"] else {}
    out["podName"] = pod.get("podName") or last.get("podName")
    out["nodeName"] = pod.get("nodeName") or last.get("nodeName")
    out["podNamespace"] = ((pod.get("metadata") or {}).get("namespace")) or next(
        (a.get("podNamespace") for a in reversed(job.get("eksAttempts") or []) if a.get("podNamespace")), None
    )
    props = job.get("nodeProperties")
    if props:
        ranges = []
        for rng in props.get("nodeRangeProperties") or []:
            pod_props = (rng.get("eksProperties") or {}).get("podProperties")
            if pod_props:
                view = container_view(pod_props)
                if rng.get("instanceTypes"):
                    view["instanceType"] = rng["instanceTypes"][0]
                rng = {**rng, "container": view}
            ranges.append(rng)
        out["nodeProperties"] = {**props, "nodeRangeProperties": ranges}
    return out
