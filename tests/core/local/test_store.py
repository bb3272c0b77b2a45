"""The local job store's listing of app ids (``store.JobStore.app_ids``)."""

from __future__ import annotations

import os
from pathlib import Path

from airflow_provider_torchx.core.schedulers.local import store


def test_app_ids_are_the_valid_names_only(tmp_path: Path) -> None:
    jobs = store.JobStore(tmp_path)
    jobs.ensure()
    for name in ("job-1", "a_b.c", "a..b", ".hidden", "x y", "-dash", "ok\n"):
        (Path(jobs.root) / name).mkdir()
    (Path(jobs.root) / store.FINISHED_INDEX).write_text("{}")
    assert jobs.app_ids() == {"job-1", "a_b.c"}


def test_app_ids_see_a_new_job_whether_or_not_the_listing_is_reused(tmp_path: Path) -> None:
    jobs = store.JobStore(tmp_path)
    jobs.create("first")
    assert jobs.app_ids() == {"first"}  # the directory changed just now: not reused
    jobs.create("second")
    assert jobs.app_ids() == {"first", "second"}
    os.utime(jobs.root, ns=(10**18, 10**18))  # long unchanged: the listing is kept
    assert jobs.app_ids() == {"first", "second"}
    assert jobs.app_ids() is jobs.app_ids()
    jobs.create("third")  # the mtime moves on: listed again
    assert jobs.app_ids() == {"first", "second", "third"}
