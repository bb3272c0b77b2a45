"""The progress line says when a job's log read lags (a shared CloudWatch budget) and by how
much: the follower keeps the furthest-behind replica's lag of its last batch."""

from __future__ import annotations

from typing import Any

from airflow_provider_torchx.core.logstream import LogFollower
from airflow_provider_torchx.core.schedulers.api import LogChunk
from airflow_provider_torchx.core.specs import AppState, AppStatus, ReplicaStatus, RoleStatus
from airflow_provider_torchx.watch import progress_line


class LaggingRunner:
    """``read_log`` of two replicas, each ``behind`` seconds behind (None: not known)."""

    def __init__(self, behind: dict[int, float | None]) -> None:
        self.behind = behind

    def read_log(
        self, app_handle: str, role: str, k: int, cursor: Any = None, streams: Any = None, max_lines: Any = None
    ) -> LogChunk:
        return LogChunk(lines=[f"line of {k}\n"], cursor=f"c{k}", eof=False, behind_s=self.behind[k])


def running(replicas: int = 2) -> AppStatus:
    reps = [ReplicaStatus(id=k, state=AppState.RUNNING, role="main", hostname="") for k in range(replicas)]
    return AppStatus(state=AppState.RUNNING, roles=[RoleStatus("main", reps)])


def test_the_progress_line_says_how_far_the_log_is_behind() -> None:
    follower = LogFollower(LaggingRunner({0: 3.0, 1: 42.4}), "aws_batch://s/q:app")  # type: ignore[arg-type]
    assert follower.behind_s is None
    batch = follower.read(running())
    assert follower.behind_s is None  # only once the batch was written out
    follower.advance(batch)
    assert follower.behind_s == 42.4  # the furthest behind replica
    line = progress_line("aws_batch://s/q:app", running(), 75.0, follower.behind_s)
    assert line.endswith("; elapsed 75s; log 42s behind")
    # caught up (or less than a second behind), or a backend that does not say: no note
    for behind in (0.0, 0.4, None):
        follower.advance(LogFollower(LaggingRunner({0: behind, 1: behind}), "h").read(running()))  # type: ignore[arg-type]
        assert progress_line("h", running(), 75.0, follower.behind_s).endswith("; elapsed 75s")
