"""Batch reclaims on a capacity ladder (docs/architecture.md, "Capacity ladder"): a job whose
attempts end with ``Host EC2 (instance i-...) terminated.`` moves after its rung's
``max_infra_failures``. moto cannot reclaim a host, so the jobs are ``DescribeJobs`` entries
shaped as the AWS Batch API reference shows them (``tests/core/aws_batch/fakes.py``), each
checked against botocore's model of the ``DescribeJobs`` output, read as the Batch scheduler
reads them (``describe_response``, ``batch_usage``) and judged by the ladder's rules with the
operator's own count (``operators/climb.py``). The move itself on the moto server is in
``test_ladder_jobs.py``."""

from __future__ import annotations

from typing import Any

import botocore.session
import pytest

from airflow_provider_torchx.core.failures import FailureKind, classify
from airflow_provider_torchx.core.schedulers.api import DescribeAppResponse
from airflow_provider_torchx.core.schedulers.aws_batch.status import describe_response
from airflow_provider_torchx.core.schedulers.aws_batch.usage import batch_usage
from airflow_provider_torchx.ladder import Move, Outcome, Rung, Why, decide, infra_failures
from airflow_provider_torchx.operators.climb import _attempt_reasons
from tests.core.aws_batch.fakes import SPOT_RECLAIMED, attempt, container_job

EXITED = "Essential container in task exited"
BOX = Rung("box", "local_cwd")
ONDEMAND = Rung("ondemand", "aws_batch", host_paths=False)

#: Python types of botocore's scalar shapes (timestamps are epoch milliseconds in JobDetail: ``long``).
SCALARS: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "long": (int,),
    "boolean": (bool,),
    "double": (int, float),
    "float": (int, float),
}


def check_shape(value: Any, shape: Any, path: str) -> None:
    """``value`` fits botocore's ``shape``: every key a member of its structure, every scalar of
    its type; ``AssertionError`` naming the path otherwise."""
    kind = shape.type_name
    if kind == "structure":
        assert isinstance(value, dict), f"{path}: {value!r} is not a {shape.name}"
        unknown = sorted(set(value) - set(shape.members))
        assert not unknown, f"{path}: {unknown} are not members of {shape.name}"
        for key, item in value.items():
            check_shape(item, shape.members[key], f"{path}.{key}")
    elif kind == "list":
        assert isinstance(value, list), f"{path}: {value!r} is not a list"
        for i, item in enumerate(value):
            check_shape(item, shape.member, f"{path}[{i}]")
    elif kind == "map":
        assert isinstance(value, dict), f"{path}: {value!r} is not a map"
        for key, item in value.items():
            check_shape(key, shape.key, f"{path} key")
            check_shape(item, shape.value, f"{path}[{key!r}]")
    else:
        assert isinstance(value, SCALARS[kind]) and not (kind != "boolean" and isinstance(value, bool)), (
            f"{path}: {value!r} is not a {kind}"
        )


def job_detail() -> Any:
    """botocore's model of a ``DescribeJobs`` answer's ``jobs[]`` entry (``JobDetail``)."""
    model = botocore.session.get_session().get_service_model("batch")
    return model.operation_model("DescribeJobs").output_shape.members["jobs"].member


def ended_job(*reasons: str, exit_code: int | None = None) -> dict[str, Any]:
    """A single-node ECS job that FAILED after one attempt per reason (the last one's is the
    job's ``statusReason``; ``exit_code``: the last attempt's container's), checked against
    botocore's model."""
    attempts = [attempt(reason, exit_code if n == len(reasons) else None, n=n) for n, reason in enumerate(reasons, 1)]
    job = container_job(status="FAILED", statusReason=reasons[-1], attempts_allowed=len(reasons), attempts=attempts)
    job["startedAt"], job["stoppedAt"] = attempts[0]["startedAt"], attempts[-1]["stoppedAt"]
    if exit_code is not None:
        job["container"]["exitCode"] = exit_code
    check_shape(job, job_detail(), "jobs[0]")
    return job


def described(job: dict[str, Any]) -> DescribeAppResponse:
    """``job`` as the Batch scheduler's ``describe`` reads it (unpriced)."""
    desc = describe_response("spot:app-1", job, {}, "us-west-2")
    desc.usage = batch_usage(job, {}, desc.roles)
    return desc


def verdict(job: dict[str, Any], limit: int | None, index: int = 1) -> Move | None:
    """The ladder's verdict on ``job`` ended on rung ``index`` of box -> spot (``limit``) ->
    on-demand, counted as the operator counts it (``Climb.next_rung``: the failure's kind,
    then each attempt the platform lost)."""
    desc = described(job)
    failure = classify(desc)
    assert failure is not None
    failures = infra_failures(failure.kind, _attempt_reasons(desc))
    spot = Rung("spot", "aws_batch", host_paths=False, max_infra_failures=limit)
    return decide([BOX, spot, ONDEMAND], index, Outcome("failed", kind=failure.kind, failures=failures))


def test_the_shape_check_refuses_what_describejobs_never_answers() -> None:
    """The check can fail: a member DescribeJobs does not have, a timestamp as text."""
    job = ended_job(SPOT_RECLAIMED)
    with pytest.raises(AssertionError, match=r"jobs\[0\]: \['reclaimed'\] are not members of JobDetail"):
        check_shape({**job, "reclaimed": True}, job_detail(), "jobs[0]")
    job["attempts"][0]["stoppedAt"] = "1970-01-01"
    with pytest.raises(AssertionError, match=r"jobs\[0\]\.attempts\[0\]\.stoppedAt: '1970-01-01' is not a long"):
        check_shape(job, job_detail(), "jobs[0]")


def test_a_job_whose_every_attempt_lost_its_host_is_infra_and_counts_each_attempt() -> None:
    desc = described(ended_job(SPOT_RECLAIMED, SPOT_RECLAIMED))
    assert classify(desc) is not None and classify(desc).kind == FailureKind.INFRA  # type: ignore[union-attr]
    assert _attempt_reasons(desc) == [SPOT_RECLAIMED, SPOT_RECLAIMED]
    assert infra_failures(FailureKind.INFRA, _attempt_reasons(desc)) == 2


@pytest.mark.parametrize(
    ("reasons", "limit"),
    [((SPOT_RECLAIMED,), 1), ((SPOT_RECLAIMED, SPOT_RECLAIMED), 2), ((SPOT_RECLAIMED,) * 3, 2)],
    ids=["one of one", "two of two", "three over two"],
)
def test_reclaimed_attempts_move_the_job_once_they_reach_the_rungs_limit(reasons: tuple[str, ...], limit: int) -> None:
    detail = f"{len(reasons)} capacity/infra failures there (max_infra_failures={limit})"
    assert verdict(ended_job(*reasons), limit) == Move(1, 2, Why.INFRA_FAILURES, detail)


@pytest.mark.parametrize("limit", [3, None], ids=["two of three", "no limit"])
def test_fewer_reclaimed_attempts_than_the_limit_or_no_limit_stay(limit: int | None) -> None:
    assert verdict(ended_job(SPOT_RECLAIMED, SPOT_RECLAIMED), limit) is None


def test_a_reclaim_then_an_app_failure_does_not_move() -> None:
    """The final attempt decides the kind: the app's exit 3 after a reclaim is ``app``, which
    the next rung would fail the same way."""
    job = ended_job(SPOT_RECLAIMED, EXITED, exit_code=3)
    assert classify(described(job)).kind == FailureKind.APP  # type: ignore[union-attr]
    assert verdict(job, 1) is None


def test_reclaims_on_the_last_rung_act_as_without_a_ladder() -> None:
    assert verdict(ended_job(SPOT_RECLAIMED, SPOT_RECLAIMED), 1, index=2) is None
