"""A job's record under its directory (``record.py``), as the job and ``schedule`` write it."""

from __future__ import annotations

import json
from pathlib import Path

from airflow_provider_torchx.core.schedulers.slurm import record


def _job(directory: Path) -> None:
    directory.mkdir(parents=True)
    (directory / "job.json").write_text(
        json.dumps({"name": "t", "roles": [{"name": "a", "num_replicas": 2}], "labels": {"k": "v"}, "submitted": 1.5})
    )


def test_what_the_job_wrote_is_read(tmp_path: Path) -> None:
    _job(tmp_path / "7")
    (tmp_path / "7" / "started").write_text("10\n")
    (tmp_path / "7" / "a" / "0").mkdir(parents=True)
    (tmp_path / "7" / "a" / "0" / "exit").write_text("3 12\n")
    (tmp_path / "7" / "a" / "0" / "host").write_text("n1 11\n")
    rec = record.read("7", str(tmp_path / "7"))
    assert rec is not None
    assert (rec.name, rec.labels, rec.submitted, rec.started, rec.ended) == ("t", {"k": "v"}, 1.5, 10.0, None)
    assert rec.exits == {("a", 0): record.ReplicaEnd(3, 12.0)}
    assert (rec.hosts, rec.starts) == ({("a", 0): "n1"}, {("a", 0): 11.0})


def test_a_file_the_job_swapped_for_a_link_is_not_followed(tmp_path: Path) -> None:
    _job(tmp_path / "7")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("0 12\n")
    (tmp_path / "7" / "a" / "0").mkdir(parents=True)
    (tmp_path / "7" / "a" / "0" / "exit").symlink_to(elsewhere)
    rec = record.read("7", str(tmp_path / "7"))
    assert rec is not None and rec.exits == {}


def test_no_job_json_is_no_record(tmp_path: Path) -> None:
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "job.json").write_text("[1, 2]")
    assert record.read("7", str(tmp_path / "7")) is None
    assert record.read("8", str(tmp_path / "8")) is None


def test_the_index_names_each_job_s_directory(tmp_path: Path) -> None:
    index = record.JobIndex(tmp_path / "index")
    index.add("7", "/shared/jobs/7")
    index.add("7", "/shared/jobs/7")
    assert (index.get("7"), index.get("8"), index.get("../x")) == ("/shared/jobs/7", None, None)
    assert list(index.items()) == [("7", "/shared/jobs/7")]
    index.remove("7")
    index.remove("7")
    assert list(index.items()) == []
