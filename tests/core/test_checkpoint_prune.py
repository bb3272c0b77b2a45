"""``core/checkpoint_prune.py``: the rule that says which checkpoint locations a prune removes
(one test per row of ``decide``'s docstring), and the walk that removes them without following
a link, on real files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from airflow_provider_torchx.core import checkpoints
from airflow_provider_torchx.core.checkpoint_prune import (
    LocationView,
    TaskState,
    Unreadable,
    Use,
    decide,
    prune,
    split_location,
    walk_location,
)
from airflow_provider_torchx.core.identity import TaskIdentity

NOW = 100_000.0
LIMIT = 3600.0
OLD = NOW - 2 * LIMIT
RECENT = NOW - 60
TI = TaskIdentity("train", "fit", "manual__1")


def finished(ti_state: str | None = "success", **kw: object) -> TaskState:
    values: dict[str, object] = {"dag_known": True, "run_state": "success", "run_ended_at": OLD}
    values |= {"ti_found": True, "ti_state": ti_state} | kw
    return TaskState(**values)  # type: ignore[arg-type]


def view(**kw: object) -> LocationView:
    values: dict[str, object] = {"location": "/ck/train/manual__1/fit", "identity": TI, "newest_write": OLD}
    values |= {"last_job_end": OLD, "task": finished()} | kw
    return LocationView(**values)  # type: ignore[arg-type]


def verdict(**kw: object) -> tuple[bool, str]:
    got = decide(view(**kw), now=NOW, older_than=LIMIT)
    return got.remove, got.reason


def test_row1_a_uri_is_kept() -> None:
    assert verdict(location="s3://b/ck/train/manual__1/fit") == (False, "not a local path (its owner prunes it)")


def test_row2_a_refused_walk_is_kept_untouched() -> None:
    assert verdict(refused="/ck/train/manual__1 is a symbolic link: not followed") == (
        False,
        "/ck/train/manual__1 is a symbolic link: not followed",
    )


def test_row3_a_live_job_keeps_it() -> None:
    assert verdict(live_job="echo-abc") == (False, "job echo-abc, which uses it, has not ended")


def test_row4_a_write_within_the_limit_keeps_it() -> None:
    assert verdict(newest_write=RECENT) == (False, "written 60s ago")


def test_row5_a_job_that_ended_within_the_limit_keeps_it() -> None:
    assert verdict(last_job_end=RECENT) == (False, "a job using it ended 60s ago")


def test_row6_no_airflow_task_is_judged_by_its_writes() -> None:
    assert verdict(identity=None, task=None) == (True, "no Airflow task's; last written 7200s ago")


def test_row7_without_airflow_only_the_writes_and_jobs_decide() -> None:
    removed, why = verdict(task=None)
    assert removed and why.startswith("Airflow not at hand")


def test_row8_an_unreadable_answer_keeps_it() -> None:
    assert verdict(task=Unreadable("OperationalError: db down")) == (
        False,
        "its task instance's state cannot be read: OperationalError: db down",
    )


def test_row9_a_dag_unknown_to_the_database_keeps_it() -> None:
    assert verdict(task=TaskState(dag_known=False)) == (False, "DAG 'train' is not in this deployment's database")


def test_row10_a_deleted_dag_run_removes_it() -> None:
    assert verdict(task=TaskState(dag_known=True)) == (True, "its DAG run is gone; last written 7200s ago")


@pytest.mark.parametrize(
    "state",
    ["up_for_retry", "up_for_reschedule", None, "scheduled", "queued", "running", "deferred", "restarting"],
)
def test_row11_a_task_instance_that_can_still_run_keeps_it(state: str | None) -> None:
    """Whatever its run says (here: over long ago)."""
    removed, why = verdict(task=finished(state))
    assert not removed and why.endswith("it can still run"), why
    assert (state or "without a state") in why


@pytest.mark.parametrize("run_state", ["queued", "running"])
def test_row12_a_dag_run_not_over_keeps_it(run_state: str) -> None:
    """A cleared task puts its run back to queued: kept, even where the task instance ended."""
    assert verdict(task=finished(run_state=run_state)) == (False, f"its DAG run is {run_state}")


@pytest.mark.parametrize(("ended", "why"), [(RECENT, "ended 60s ago"), (None, "has no end date")])
def test_row13_a_dag_run_ended_within_the_limit_keeps_it(ended: float | None, why: str) -> None:
    assert verdict(task=finished(run_ended_at=ended)) == (False, f"its DAG run {why}")


def test_row14_a_task_instance_gone_from_its_ended_run_removes_it() -> None:
    removed, why = verdict(task=finished(ti_found=False, ti_state=None))
    assert removed and "without this task instance" in why


@pytest.mark.parametrize("state", ["success", "failed", "skipped", "upstream_failed", "removed"])
def test_row15_a_finished_task_instance_of_an_old_run_removes_it(state: str) -> None:
    assert verdict(task=finished(state, run_state="failed")) == (
        True,
        f"its DAG run ended failed 7200s ago, the task instance {state}; last written 7200s ago",
    )


# --------------------------------------------------------------------------- real files


def _tree(tmp_path: Path) -> tuple[Path, str, Path]:
    """A root with one location holding a file and a subdirectory, and a file outside."""
    root = tmp_path / "root"
    location = checkpoints.checkpoint_dir(str(root), TI)
    Path(location, "sub").mkdir(parents=True)
    Path(location, "step-1.pt").write_bytes(b"w" * 5000)
    Path(location, "sub", "shard").write_bytes(b"s" * 100)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_bytes(b"p")
    return root, location, outside


def test_the_walk_removes_the_location_and_its_empty_parents(tmp_path: Path) -> None:
    root, location, _ = _tree(tmp_path)
    sibling = Path(checkpoints.checkpoint_dir(str(root), TI._replace(task_id="eval")))
    sibling.mkdir()
    seen = walk_location(location, TI)
    assert seen.present and seen.refused is None and seen.tally.size >= 5100
    assert seen.tally.newest_write == max(os.lstat(p).st_mtime for p in [Path(location), *Path(location).rglob("*")])
    assert Path(location).is_dir(), "a survey removes nothing"
    done = walk_location(location, TI, remove=True)
    assert not Path(location).exists() and sibling.is_dir() and done.tally.links == []
    walk_location(str(sibling), TI._replace(task_id="eval"), remove=True)
    assert list(root.iterdir()) == [], "the run's and the DAG's directories went with their last location"


@pytest.mark.parametrize("level", ["dag", "run", "location"])
def test_a_linked_directory_on_the_way_is_skipped_and_nothing_outside_is_touched(tmp_path: Path, level: str) -> None:
    """The run level (as reported), the DAG level and the location itself swapped for a link
    to a directory outside the root: the location is skipped whole, the outside file stays."""
    _, location, outside = _tree(tmp_path)
    swapped = {"dag": Path(location).parents[1], "run": Path(location).parent, "location": Path(location)}[level]
    target = outside / "inside-copy"
    os.rename(swapped, target)
    (target / "bait").write_bytes(b"b")
    swapped.symlink_to(target)
    done = walk_location(location, TI, remove=True)
    assert done.refused == f"{swapped} is a symbolic link: not followed"
    assert (outside / "precious").exists() and (target / "bait").exists() and swapped.is_symlink()


def test_a_linked_task_level_of_a_mapped_task_is_skipped(tmp_path: Path) -> None:
    mapped = TI._replace(map_index=2)
    root = tmp_path / "root"
    location = Path(checkpoints.checkpoint_dir(str(root), mapped))
    outside = tmp_path / "outside" / "task"
    (outside / location.name).mkdir(parents=True)
    (outside / location.name / "step-1.pt").write_bytes(b"w")
    location.parent.parent.mkdir(parents=True)
    location.parent.symlink_to(outside)
    done = walk_location(str(location), mapped, remove=True)
    assert done.refused == f"{location.parent} is a symbolic link: not followed"
    assert (outside / location.name / "step-1.pt").exists()


def test_links_inside_are_left_and_reported_not_counted(tmp_path: Path) -> None:
    """A link to a file outside and one to a directory outside, inside the location: neither
    followed nor removed; the rest goes, and the report names exactly what was left."""
    _, location, outside = _tree(tmp_path)
    Path(location, "latest.pt").symlink_to(outside / "precious")
    Path(location, "sub", "more").symlink_to(outside)
    before = walk_location(location, TI).tally.size
    done = walk_location(location, TI, remove=True)
    assert sorted(done.tally.links) == [f"{location}/latest.pt", f"{location}/sub/more"]
    assert done.tally.size == before and done.tally.problems == []
    assert sorted(p.name for p in Path(location).rglob("*")) == ["latest.pt", "more", "sub"]
    assert (outside / "precious").read_bytes() == b"p"


def test_a_location_not_built_from_an_identity_is_walked_from_its_parent(tmp_path: Path) -> None:
    """The CLI's ``run --checkpoint_dir``: its parents are the user's; only it is walked."""
    assert split_location("/data/ck", None) == ("/data", ["ck"])
    assert split_location("/data/ck", TI) == ("/data", ["ck"])
    assert split_location("/r/train/manual__1/fit", TI) == ("/r", ["train", "manual__1", "fit"])


def test_prune_applies_the_rule_and_removes_only_what_it_says(tmp_path: Path) -> None:
    """Two locations of old, finished task instances; one's task is up for retry: only the other
    goes (Airflow's answer from a stand-in reader); a dry run removes nothing."""
    root, location, _ = _tree(tmp_path)
    retried = TI._replace(task_id="retried")
    kept = checkpoints.checkpoint_dir(str(root), retried)
    Path(kept).mkdir()
    for p in (location, kept, f"{location}/sub", f"{location}/sub/shard", f"{location}/step-1.pt"):
        os.utime(p, (OLD, OLD))
    answers = {TI: finished(), retried: finished("up_for_retry")}
    uses = {location: [Use("a", TI, True, OLD)], kept: [Use("b", retried, True, OLD)]}
    dry = prune(uses, now=NOW, older_than=LIMIT, dry_run=True, task_states=lambda ids: answers)
    assert [(o.location, o.verdict.remove) for o in dry] == [(location, True), (kept, False)]
    assert Path(location).is_dir()
    done = prune(uses, now=NOW, older_than=LIMIT, dry_run=False, task_states=lambda ids: answers)
    assert [o.verdict.remove for o in done] == [True, False]
    assert not Path(location).exists() and Path(kept).is_dir()


def test_prune_keeps_every_airflow_location_when_the_database_cannot_be_read(tmp_path: Path) -> None:
    _, location, _ = _tree(tmp_path)

    def down(ids: object) -> dict[TaskIdentity, TaskState]:
        raise ConnectionError("database at db:5432 refused")

    (done,) = prune({location: [Use("a", TI, True, 0.0)]}, now=NOW * 1e5, older_than=1, dry_run=False, task_states=down)
    assert not done.verdict.remove and "ConnectionError" in done.verdict.reason and Path(location).is_dir()
