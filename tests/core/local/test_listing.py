"""What a listing shows of the local store (``core/schedulers/local/listing.py``): a job's
summary, the order of a listing and which jobs a prune removes, each rule alone on dicts."""

from __future__ import annotations

from typing import Any

from airflow_provider_torchx.core.schedulers.local import listing

REC = {"backend": "local_cwd", "app_name": "app", "labels": {"team": "a"}, "created": 100.0, "cfg": {}}


def summary(state: str, created: float, ended: float | None = None) -> dict[str, Any]:
    return {"backend": "local_cwd", "name": "app", "labels": {}, "created": created, "state": state, "ended": ended}


def test_a_summary_has_the_state_only_when_it_was_read() -> None:
    bare = {"backend": "local_cwd", "name": "app", "labels": {"team": "a"}, "created": 100.0}
    assert listing.summary(REC, None) == bare
    st = {"state": "SUCCEEDED", "started": 101.0, "ended": 102.0, "replicas": {}}
    assert listing.summary(REC, st) == bare | {"state": "SUCCEEDED", "started": 101.0, "ended": 102.0}


def test_an_end_reported_not_recorded_is_marked_orphaned() -> None:
    assert listing.summary(REC, {"state": "FAILED", "orphaned": True})["orphaned"] is True


def test_a_listing_is_oldest_first_then_by_app_id() -> None:
    items = [("b", {"created": 2.0}), ("c", {"created": None}), ("a", {"created": 2.0})]
    assert [app_id for app_id, _ in sorted(items, key=listing.summary_key)] == ["c", "a", "b"]


def test_a_prune_takes_ended_jobs_by_their_end_oldest_first() -> None:
    summaries = {
        "late": summary("SUCCEEDED", created=1.0, ended=50.0),
        "early": summary("FAILED", created=1.0, ended=10.0),
        "live": summary("RUNNING", created=1.0),
        "never-ran": summary("CANCELLED", created=5.0),  # no end: its submission counts
        "recent": summary("SUCCEEDED", created=1.0, ended=99.0),
    }
    assert listing.prunable(summaries, cutoff=50.0) == ["never-ran", "early", "late"]


def test_a_prune_by_state_takes_those_states_only() -> None:
    summaries = {"ok": summary("SUCCEEDED", 1.0, 2.0), "bad": summary("FAILED", 1.0, 2.0)}
    assert listing.prunable(summaries, cutoff=50.0, states=["failed"]) == ["bad"]
    assert listing.prunable({"gone": summary("UNKNOWN", 1.0)}, cutoff=50.0) == []  # could not be finalised
