"""A local job's record (``core/schedulers/local/record.py``): the shapes its files must have
(declared with ``shapes.py``) and what is derived from them, each rule tested alone on parsed
dicts and a fake clock (no supervisor, no ``/proc``); ``read_entry`` and ``JobRecords`` on
files in a temporary store."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_torchx.core.schedulers.api import CancelledBy
from airflow_provider_torchx.core.schedulers.local import procfs, record, shapes, store
from airflow_provider_torchx.core.specs import AppState

NOW = 1_000_000.0
SUP = {"pid": 4242, "start": 99, "boot": "b"}


def request(**changes: Any) -> dict[str, Any]:
    """A ``request.json`` as the scheduler writes it (the keys a reader relies on), submitted
    a minute before ``NOW``: role ``w`` of two replicas."""
    rec = {
        "backend": "local_cwd",
        "app_name": "app",
        "log_dir": "/store/app-1",
        "labels": {"team": "a"},
        "cfg": {},
        "role_params": {"w": [{"args": ["sleep", "1"], "env": {}}, {"args": ["sleep", "1"], "env": {}}]},
        "roles": [{"name": "w", "entrypoint": "sleep", "args": ["1"], "num_replicas": 2}],
        "created": NOW - 60,
        "host": "here",
    }
    return rec | changes


def state(app_state: str = "RUNNING", *replica_states: str, **changes: Any) -> dict[str, Any]:
    """A ``state.json`` as the supervisor writes it, with a replica of role ``w`` per state."""
    reps = [
        {"state": s, "pid": 100 + k, "start": 7, "attempts": [{"started": NOW - 50}]}
        for k, s in enumerate(replica_states)
    ]
    return {"state": app_state, "num_restarts": 0, "msg": "", "replicas": {"w": reps}} | changes


def why(name: str, value: Any) -> str | None:
    return shapes.why_not(record.SHAPES[name], value)


# ------------------------------------------------------------------ shapes


def test_each_file_as_its_writer_writes_it_fits() -> None:
    assert why(store.REQUEST, request()) is None
    assert why(store.STATE, state("RUNNING", "RUNNING", "SUCCEEDED") | {"tracked": [[1, 2]]}) is None
    assert why(store.SUPERVISOR, SUP) is None
    assert why(store.CANCEL, {"time": NOW, "grace": 10.0, "pid": 1, "reason": "task a.b was marked failed"}) is None


def test_a_file_that_is_not_an_object_is_named_as_what_it_is() -> None:
    assert why(store.REQUEST, [1, 2]) == "the file is an array, not an object"
    assert why(store.SUPERVISOR, "x") == "the file is a string, not an object"


def test_a_missing_key_is_named_with_what_it_should_hold() -> None:
    rec = request()
    del rec["created"]
    assert why(store.REQUEST, rec) == "'created' is missing (a number)"


def test_a_key_of_the_wrong_type_is_named_with_the_type_it_has() -> None:
    assert why(store.REQUEST, request(labels=["team"])) == "'labels' is an array, not an object"
    assert why(store.SUPERVISOR, {"pid": "12", "start": 1}) == "'pid' is a string, not an integer"
    assert why(store.REQUEST, request(created=None)) == "'created' is null, not a number"


def test_an_item_is_named_by_its_place_in_the_file() -> None:
    rec = request(roles=[{"name": "w"}, 7])
    assert why(store.REQUEST, rec) == "'roles'[1] is a number, not a role"
    rec = request(role_params={"w": [{"env": {}}]})
    assert why(store.REQUEST, rec) == "'role_params'['w'][0]['args'] is missing (a value)"


def test_a_state_must_be_an_app_state_by_name() -> None:
    assert why(store.STATE, {"state": "BOGUS"}) == "'state' is 'BOGUS', not an app state"
    assert why(store.STATE, {"state": {}}) == "'state' is {}, not an app state"  # not hashable: no TypeError
    bad_replica = state("RUNNING", "RUNNING") | {"replicas": {"w": [{"state": "running"}]}}
    assert why(store.STATE, bad_replica) == "'replicas'['w'][0]['state'] is 'running', not an app state"


def test_optional_keys_may_be_absent_never_wrong() -> None:
    assert why(store.STATE, {"state": "PENDING"}) is None
    assert why(store.STATE, {"state": "PENDING", "replicas": None}) == "'replicas' is null, not an object"
    assert why(store.CANCEL, {}) is None
    assert why(store.CANCEL, {"reason": None}) is None
    assert why(store.CANCEL, {"reason": 5}) == "'reason' is a number, not a string or null"


def test_a_replicas_attempts_are_objects() -> None:
    st = {"state": "FAILED", "replicas": {"r0": [{"state": "FAILED", "attempts": [1]}]}}
    assert why(store.STATE, st) == "'replicas'['r0'][0]['attempts'][0] is a number, not an object"


def test_tracked_processes_are_pid_and_start_pairs() -> None:
    assert why(store.STATE, {"state": "RUNNING", "tracked": [[1, 2, 3]]}) == (
        "'tracked'[0] has 3 items, not a [pid, start] pair"
    )
    assert why(store.STATE, {"state": "RUNNING", "tracked": [[1, "2"]]}) == (
        "'tracked'[0][1] is a string, not an integer"
    )


def test_keys_no_reader_relies_on_are_not_checked() -> None:
    assert why(store.REQUEST, request(extra={"anything": [None]}, gpus=7)) is None
    assert why(store.SUPERVISOR, SUP | {"boot": 3}) is None


def test_read_entry_names_the_job_and_the_file_and_reads_a_missing_one_as_none(tmp_path: Path) -> None:
    job = tmp_path / "app-1"
    job.mkdir()
    assert record.read_entry(str(tmp_path), "app-1", store.STATE) is None
    (job / store.STATE).write_text(json.dumps({"state": "BOGUS"}))
    with pytest.raises(store.CorruptEntryError, match=rf"job 'app-1': {job / store.STATE} is corrupt \('state' is"):
        record.read_entry(str(tmp_path), "app-1", store.STATE)
    (job / store.SUPERVISOR).write_text("garbage{")
    with pytest.raises(store.CorruptEntryError, match=r"supervisor\.json is corrupt \(not JSON"):
        record.read_entry(str(tmp_path), "app-1", store.SUPERVISOR)
    (tmp_path / "app-2").write_text("not a job")
    with pytest.raises(store.CorruptEntryError, match=r"app-2 is corrupt \(a file, not a job directory\)"):
        record.read_entry(str(tmp_path), "app-2", store.REQUEST)


# ------------------------------------------------------------------ a job not recorded as ended


def test_a_job_of_another_host_is_as_its_state_says() -> None:
    st = state("RUNNING", "RUNNING")
    assert record.live_state(request(), st, None, here=False, alive=False, now=NOW) is st


def test_a_supervised_job_is_as_its_state_says_pending_before_its_first() -> None:
    st = state("RUNNING", "RUNNING")
    assert record.live_state(request(), st, SUP, here=True, alive=True, now=NOW) is st
    assert record.live_state(request(), None, SUP, here=True, alive=True, now=NOW) == record.PENDING_STATE


def test_a_job_waits_for_its_supervisor_until_the_start_timeout() -> None:
    rec = request(created=NOW - record.SUPERVISOR_START_TIMEOUT + 1)
    assert record.live_state(rec, None, None, here=True, alive=False, now=NOW) == record.PENDING_STATE
    rec = request(created=NOW - record.SUPERVISOR_START_TIMEOUT)
    assert record.live_state(rec, None, None, here=True, alive=False, now=NOW) is None


def test_a_job_whose_supervisor_died_is_an_orphan() -> None:
    assert record.live_state(request(), state("RUNNING", "RUNNING"), SUP, here=True, alive=False, now=NOW) is None


# ------------------------------------------------------------------ an orphan's end


def test_an_orphans_unfinished_replicas_fail_and_the_rest_keep_their_end() -> None:
    st = state("RUNNING", "SUCCEEDED", "RUNNING")
    end = record.orphan_end(st, SUP, None, now=NOW)
    assert (end["state"], end["ended"]) == ("FAILED", NOW)
    assert [r["state"] for r in end["replicas"]["w"]] == ["SUCCEEDED", "FAILED"]
    assert [r["state"] for r in st["replicas"]["w"]] == ["SUCCEEDED", "RUNNING"]  # left as it was


def test_an_orphan_with_a_cancel_request_ends_cancelled_saying_by_whom() -> None:
    end = record.orphan_end(state("RUNNING", "RUNNING"), SUP, {"reason": "task a.b was marked failed"}, now=NOW)
    assert end["state"] == "CANCELLED" and end["replicas"]["w"][0]["state"] == "CANCELLED"
    assert end["msg"] == (
        "cancelled by request: task a.b was marked failed (the supervisor ended before it could record it)"
    )


def test_an_orphan_whose_supervisor_never_started_says_so() -> None:
    end = record.orphan_end(None, None, None, now=NOW, last_words="ignored")
    assert end["state"] == "FAILED" and end["replicas"] == {}
    assert end["msg"] == f"the supervisor did not start within {record.SUPERVISOR_START_TIMEOUT:.0f} s"


def test_an_orphan_whose_supervisor_died_quotes_its_last_words() -> None:
    end = record.orphan_end(state("RUNNING", "RUNNING"), SUP, None, now=NOW, last_words="MemoryError")
    assert end["msg"] == "the supervisor (pid 4242) died before the job ended; its last words: MemoryError"


def test_a_finalised_orphan_says_its_replicas_were_stopped_and_names_the_strays() -> None:
    end = record.orphan_end(state("RUNNING", "RUNNING"), SUP, None, now=NOW, strays=[])
    assert end["msg"] == "the supervisor (pid 4242) died before the job ended; its replicas were stopped"
    strays = [procfs.ProcInfo(1000 + i, 1, 1, 1, 5, f"p{i}") for i in range(12)]
    end = record.orphan_end(state("RUNNING", "RUNNING"), SUP, None, now=NOW, strays=strays)
    named = ", ".join(f"{1000 + i} (p{i})" for i in range(record.STRAYS_NAMED))
    assert end["msg"].endswith(f"; stopped 12 process(es) left outside the replicas: {named} and 2 more")


def test_a_jobs_recorded_processes_are_its_replicas_and_what_its_supervisor_tracked() -> None:
    st = state("RUNNING", "RUNNING", "PENDING") | {"tracked": [[7, 8]]}
    st["replicas"]["w"][1] = {"state": "PENDING"}  # not started: no process
    assert record.recorded_processes(st) == ({(100, 7)}, {(7, 8)})
    assert record.recorded_processes(None) == (set(), set())


# ------------------------------------------------------------------ the description


def test_a_replica_never_started_is_pending_while_the_job_lives() -> None:
    assert record.unstarted_replica("RUNNING") == {"state": "PENDING"}
    assert record.unstarted_replica("CANCELLED") == {
        "state": "CANCELLED",
        "msg": "never started: the job ended CANCELLED before this replica ran",
    }


def test_every_replica_of_the_request_has_a_status() -> None:
    desc = record.description("app-1", request(), record.PENDING_STATE, None)
    assert [(r.id, r.state) for r in desc.roles_statuses[0].replicas] == [(0, AppState.PENDING), (1, AppState.PENDING)]
    desc = record.description("app-1", request(), state("CANCELLED"), None)
    assert {r.state for r in desc.roles_statuses[0].replicas} == {AppState.CANCELLED}


def test_a_replicas_message_names_its_gpus_unless_it_has_another() -> None:
    st = state("RUNNING", "RUNNING", "FAILED")
    st["replicas"]["w"][0]["devices"] = "0,1"
    st["replicas"]["w"][1].update(devices="2", msg="exit 3")
    replicas = record.description("app-1", request(), st, None).roles_statuses[0].replicas
    assert [(r.msg, r.devices) for r in replicas] == [("GPUs 0,1", "0,1"), ("exit 3", "2")]


def test_a_live_job_has_its_usage_so_far_an_ended_one_its_usage() -> None:
    live = record.description("app-1", request(), state("RUNNING", "RUNNING", "RUNNING"), None)
    assert live.usage is None and live.usage_so_far is not None and live.usage_so_far.submitted == NOW - 60
    ended = record.description("app-1", request(), state("SUCCEEDED", "SUCCEEDED", "SUCCEEDED", ended=NOW), None)
    assert ended.usage is not None and ended.usage_so_far is None and ended.ended == NOW


def test_the_cancel_request_gives_the_cancel_fields() -> None:
    unsaid = {"cancel_reason": None, "cancelled_by": None, "stopped_while_refused": None}
    assert record.cancel_fields(None) == {"cancel_requested": False, **unsaid}
    assert record.cancel_fields({"reason": None}) == {"cancel_requested": True, **unsaid}
    assert record.cancel_fields({"reason": "x", "by": "reaper"})["cancelled_by"] == CancelledBy.REAPER
    assert record.cancel_fields({"refused": "job 'a': bad"})["stopped_while_refused"] == "job 'a': bad"
    desc = record.description("app-1", request(), state("RUNNING"), {"reason": "user"})
    assert (desc.cancel_requested, desc.cancel_reason) == (True, "user")


def test_a_job_is_of_the_host_its_record_names_or_of_this_one() -> None:
    assert record.on_this_host(request(host="here"), "here")
    assert not record.on_this_host(request(host="there"), "here")
    rec = request()
    del rec["host"]
    assert record.on_this_host(rec, "here")


# ------------------------------------------------------------------ reads


def test_records_drop_a_job_another_process_deleted(tmp_path: Path) -> None:
    (tmp_path / "app-1").mkdir()
    (tmp_path / "app-1" / store.REQUEST).write_text(json.dumps(request()))
    records = record.JobRecords(str(tmp_path), cache_size=10)
    assert records.request("app-1") == request()
    os.unlink(tmp_path / "app-1" / store.REQUEST)
    assert records.request("app-1") is None
    assert records.request("../app-1") is None  # no job of this store


def test_records_cache_ended_states_up_to_their_size(tmp_path: Path) -> None:
    records = record.JobRecords(str(tmp_path), cache_size=1)
    for app_id in ("app-1", "app-2"):
        (tmp_path / app_id).mkdir()
        (tmp_path / app_id / store.STATE).write_text(json.dumps(state("SUCCEEDED")))
        assert records.state(app_id, request())["state"] == "SUCCEEDED"
    (tmp_path / "app-2" / store.STATE).write_text("{}")  # cached: never read again
    assert records.state("app-2", request())["state"] == "SUCCEEDED"
    (tmp_path / "app-1" / store.STATE).write_text("{}")  # dropped for app-2: read again
    with pytest.raises(store.CorruptEntryError):
        records.state("app-1", request())
    with pytest.raises(ValueError, match="cache_size: 0 must be > 0"):
        record.JobRecords(str(tmp_path), cache_size=0)
