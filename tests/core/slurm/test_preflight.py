"""The partition preflight's rules (``preflight.py``) over ``scontrol show partition -o`` and
``scontrol show node -o`` as Slurm 22.05 prints them (captured from the test cluster)."""

from __future__ import annotations

import pytest

from airflow_provider_torchx.core.errors import InvalidRunConfigError, JobWontFitError
from airflow_provider_torchx.core.schedulers.slurm import preflight
from airflow_provider_torchx.core.schedulers.slurm.commands import parse_key_values
from airflow_provider_torchx.core.schedulers.slurm.options import time_limit
from tests.core.slurm.conftest import DATA

PARTITIONS = [parse_key_values(line) for line in (DATA / "scontrol-partition-22.05.txt").read_text().splitlines()]
NODES = [parse_key_values(line) for line in (DATA / "scontrol-node-22.05.txt").read_text().splitlines()]


def _role(replicas: int = 1, cpu: int = 1, gpu: int = 0, mem: int = 100) -> dict[str, object]:
    return {"name": "r", "num_replicas": replicas, "resource": {"cpu": cpu, "gpu": gpu, "memMB": mem}}


def test_scontrol_records_parse_with_values_holding_spaces() -> None:
    assert (PARTITIONS[0]["PartitionName"], PARTITIONS[0]["MaxTime"], PARTITIONS[0]["State"]) == (
        "debug",
        "01:00:00",
        "UP",
    )
    assert [(n["NodeName"], n["Gres"], n["RealMemory"], n["Partitions"]) for n in NODES] == [
        ("n1", "gpu:2", "2000", "debug"),
        ("n2", "gpu:2", "2000", "debug"),
    ]
    assert NODES[0]["OS"].startswith("Linux ")


def test_a_job_that_fits_goes_to_the_default_partition() -> None:
    assert preflight.check_fit([_role(2, cpu=2, gpu=2, mem=2000)], {"time": "59"}, PARTITIONS, NODES) == "debug"


@pytest.mark.parametrize(
    ("roles", "cfg", "error", "says"),
    [
        (
            [_role()],
            {"partition": "x"},
            InvalidRunConfigError,
            "partition='x' does not exist on this Slurm cluster; its partitions: debug",
        ),
        (
            [_role(3)],
            {},
            JobWontFitError,
            "role 'r' needs 3 node(s) with 1 CPUs, 100 MB each; partition 'debug' has 2 such node(s) of 2",
        ),
        ([_role(gpu=3)], {}, JobWontFitError, "3 GPUs each; partition 'debug' has 0 such node(s) of 2 (at most 2 GPUs"),
        ([_role(cpu=3)], {}, JobWontFitError, "(at most 2 GPUs, 2 CPUs and 2000 MB per node)"),
        ([_role(mem=2001)], {}, JobWontFitError, "2001 MB each; partition 'debug' has 0 such node(s)"),
        (
            [_role()],
            {"time": "1:00:01"},
            JobWontFitError,
            "cfg: time='1:00:01' exceeds partition 'debug''s MaxTime 01:00:00",
        ),
    ],
)
def test_what_does_not_fit(roles: list[dict[str, object]], cfg: dict[str, str], error: type, says: str) -> None:
    with pytest.raises(error) as err:
        preflight.check_fit(roles, cfg, PARTITIONS, NODES)
    assert says in str(err.value)


@pytest.mark.parametrize(
    ("cfg", "time"),
    [
        ({"attempt_timeout": 3601}, "01:00:00"),  # the guard's 61 minutes: the partition's limit is shorter
        ({"max_gpu_hours": 4}, "01:00:00"),  # 4 GPU-hours over 2 GPUs: 2 hours
        ({"attempt_timeout": 3600}, "60"),
        ({"attempt_timeout": 7200, "time": "30"}, "30"),
    ],
)
def test_a_guard_s_limit_over_max_time_is_lowered_to_it(cfg: dict[str, object], time: str) -> None:
    roles = [_role(gpu=2)]
    assert preflight.check_fit(roles, cfg, PARTITIONS, NODES) == "debug"
    limit = time_limit(2, cfg)
    assert limit is not None
    script = f"#!/bin/sh\n#SBATCH --time={limit[0]}\necho\n"
    assert preflight.fit_time(script, roles, cfg, PARTITIONS[0]) == f"#!/bin/sh\n#SBATCH --time={time}\necho\n"


def test_a_partition_that_is_not_up_fits_nothing() -> None:
    down = [{**PARTITIONS[0], "State": "DRAIN"}]
    with pytest.raises(JobWontFitError, match="partition 'debug' is DRAIN, not UP"):
        preflight.check_fit([_role()], {}, down, NODES)


def test_the_partition_s_per_job_limits() -> None:
    limited = [{**PARTITIONS[0], "MaxNodes": "1", "MaxMemPerNode": "500"}]
    with pytest.raises(JobWontFitError, match="allows at most MaxNodes=1 per job"):
        preflight.check_fit([_role(2)], {}, limited, NODES)
    with pytest.raises(JobWontFitError, match="has MaxMemPerNode=500 MB"):
        preflight.check_fit([_role(mem=600)], {}, limited, NODES)


def test_no_default_partition_asks_for_one() -> None:
    with pytest.raises(InvalidRunConfigError, match="no default partition; set one of: debug"):
        preflight.check_fit([_role()], {}, [{**PARTITIONS[0], "Default": "NO"}], NODES)


@pytest.mark.parametrize(
    ("gres", "gpus"), [("gpu:2", 2), ("gpu:a100:4(S:0-1)", 4), ("gpu:a100:4,gpu:v100:2", 6), ("(null)", 0), ("", 0)]
)
def test_gpus_a_node_counts(gres: str, gpus: int) -> None:
    assert preflight.gpus_of(gres) == gpus
