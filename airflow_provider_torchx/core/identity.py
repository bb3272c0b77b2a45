"""The labels naming the Airflow task instance a job belongs to.

The operator labels each job it submits with its task instance's identity (``airflow.dag_id``,
``airflow.task_id``, ``airflow.run_id``, ``airflow.map_index``; never the try number): a
retry finds its job by them, the orphaned-jobs reaper judges the job by them, the UI filters
and authorises by them and the CLI's ``list`` names the task. They are spelled here only. The
core never imports Airflow: these are plain labels to it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

DAG_ID = "airflow.dag_id"
TASK_ID = "airflow.task_id"
RUN_ID = "airflow.run_id"
MAP_INDEX = "airflow.map_index"
#: Every identity label, in the order of ``TaskIdentity``'s fields.
IDENTITY_KEYS = (DAG_ID, TASK_ID, RUN_ID, MAP_INDEX)


class TaskIdentity(NamedTuple):
    """A task instance as its job's labels name it (``map_index`` -1: not mapped)."""

    dag_id: str
    task_id: str
    run_id: str
    map_index: int = -1

    def labels(self) -> dict[str, str]:
        """The job labels naming this task instance."""
        return dict(zip(IDENTITY_KEYS, (self.dag_id, self.task_id, self.run_id, str(self.map_index)), strict=True))

    @classmethod
    def from_labels(cls, labels: Mapping[str, str]) -> TaskIdentity | None:
        """The task instance a job's ``labels`` name; None unless every identity label is
        there and ``map_index`` is an integer (a job Airflow did not submit)."""
        if any(not labels.get(key) for key in IDENTITY_KEYS):
            return None
        try:
            map_index = int(labels[MAP_INDEX])
        except ValueError:
            return None
        return cls(labels[DAG_ID], labels[TASK_ID], labels[RUN_ID], map_index)


def task_label(labels: Mapping[str, str]) -> str | None:
    """``dag_id.task_id[map_index]`` of a job an Airflow task launched (None: its labels name
    no DAG and task; the map index shows only for a mapped task)."""
    dag_id, task_id = labels.get(DAG_ID), labels.get(TASK_ID)
    if not (dag_id and task_id):
        return None
    map_index = labels.get(MAP_INDEX, "-1")
    return f"{dag_id}.{task_id}" + (f"[{map_index}]" if map_index not in ("", "-1") else "")
