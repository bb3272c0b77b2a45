"""The GPU ledger on the host's real NVIDIA devices (``-m gpu``: ``scripts/gpu-check.sh`` runs
these where a GPU is; they are deselected elsewhere). Detection finds what ``nvidia-smi -L``
lists; one job per device plus one more: each runs on a device of its own, which
``nvidia-smi -i`` finds, and the last waits for a device given back."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from airflow_provider_torchx.core.schedulers.local import LocalScheduler, gpus
from airflow_provider_torchx.core.specs import AppDef, AppState, Resource, Role, macros
from tests.core.local.helpers import wait_done

pytestmark = pytest.mark.gpu


@pytest.fixture
def devices(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    monkeypatch.delenv(gpus.GPUS_ENV, raising=False)
    found = gpus.host_devices()
    assert found, "no NVIDIA GPU detected (nvidia-smi -L, /proc/driver/nvidia/gpus): run these on a GPU host"
    return found


def test_detection_matches_nvidia_smi(devices: list[int]) -> None:
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=True).stdout
    assert len(devices) == listed.count("GPU "), listed


def test_one_job_per_device_and_one_that_waits(sched: LocalScheduler, devices: list[int], tmp_path: Path) -> None:
    script = (
        "nvidia-smi -i $CUDA_VISIBLE_DEVICES --query-gpu=index --format=csv,noheader; "
        f"while [ ! -e {tmp_path}/gate-{macros.app_id} ]; do sleep 0.05; done"
    )
    app = AppDef("one", roles=[Role("g", entrypoint="sh", args=["-c", script], resource=Resource(1, 1, 64))])
    cfg = {"auto_set_cuda_visible_devices": True}
    app_ids = [sched.schedule(sched.submit_dryrun(app, cfg)) for _ in range(len(devices) + 1)]  # type: ignore[arg-type]
    want = [AppState.RUNNING] * len(devices) + [AppState.PENDING]
    deadline = time.monotonic() + 30
    while True:
        descs = [sched.describe(a) for a in app_ids]
        if [d.state for d in descs] == want and descs[-1].msg.startswith("waiting for 1 GPU, 0 free, held by"):  # type: ignore[union-attr]
            break
        assert time.monotonic() < deadline, descs
        time.sleep(0.05)
    shown = [sched.describe(a).roles_statuses[0].replicas[0].msg for a in app_ids[:-1]]  # type: ignore[union-attr]
    assert sorted(shown) == sorted(f"GPUs {d}" for d in devices), shown
    for app_id in app_ids:
        (tmp_path / f"gate-{app_id}").touch()
        desc = wait_done(sched, app_id)
        assert desc.state == AppState.SUCCEEDED, desc
        lines = [line.strip() for line in sched.log_iter(app_id, "g")]
        assert lines == [desc.roles_statuses[0].replicas[0].msg.removeprefix("GPUs ")], lines
