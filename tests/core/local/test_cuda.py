"""auto_set_cuda_visible_devices: the seed's examples on a host with an injected GPU count."""

from __future__ import annotations

import pytest

from airflow_provider_torchx.core.schedulers.local import LocalScheduler, create_cwd_scheduler
from airflow_provider_torchx.core.specs import AppDef, Resource, Role

ON = {"auto_set_cuda_visible_devices": True}


def gpus(name: str, num_replicas: int, gpu: int) -> Role:
    return Role(name, entrypoint="true", num_replicas=num_replicas, resource=Resource(cpu=1, gpu=gpu, memMB=128))


def devices(sched: LocalScheduler, app: AppDef, cfg: dict[str, object] = ON) -> dict[str, list[str | None]]:
    info = sched.submit_dryrun(app, cfg)  # type: ignore[arg-type]
    return {
        role: [p.env.get("CUDA_VISIBLE_DEVICES") for p in params] for role, params in info.request.role_params.items()
    }


@pytest.fixture
def eight() -> LocalScheduler:
    return create_cwd_scheduler("gpu", device_count=lambda: 8)


def test_example_1_two_replicas_of_two(eight: LocalScheduler) -> None:
    assert devices(eight, AppDef("a", roles=[gpus("r", 2, 2)])) == {"r": ["0,1", "2,3"]}


def test_example_2_too_few_devices_warns_and_sets_nothing(eight: LocalScheduler) -> None:
    with pytest.warns(UserWarning, match="requests 12 GPUs but this host has 8"):
        assert devices(eight, AppDef("a", roles=[gpus("r", 3, 4)])) == {"r": [None, None, None]}


def test_example_3_roles_in_order(eight: LocalScheduler) -> None:
    app = AppDef("a", roles=[gpus("r0", 1, 2), gpus("r1", 3, 1)])
    assert devices(eight, app) == {"r0": ["0,1"], "r1": ["2", "3", "4"]}


def test_exactly_as_many_as_available_and_cpu_roles_untouched(eight: LocalScheduler) -> None:
    app = AppDef("a", roles=[gpus("r0", 2, 4), Role("cpu", entrypoint="true", env={"CUDA_VISIBLE_DEVICES": "7"})])
    assert devices(eight, app) == {"r0": ["0,1,2,3", "4,5,6,7"], "cpu": ["7"]}


def test_off_by_default_and_overwrites_the_role_env(eight: LocalScheduler) -> None:
    role = gpus("r", 1, 1)
    role.env["CUDA_VISIBLE_DEVICES"] = "5"
    assert devices(eight, AppDef("a", roles=[role]), {}) == {"r": ["5"]}
    assert devices(eight, AppDef("a", roles=[role])) == {"r": ["0"]}
