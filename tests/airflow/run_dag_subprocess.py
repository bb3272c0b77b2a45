"""Run one DAG of a file of the test DAGs folder with ``dag.test()`` in a fresh process (so Airflow reads
its configuration, e.g. ``[metrics]`` or ``[openlineage]``, from this process's environment),
then print each task's state, try number and ``usage`` XCom as one JSON line ``RESULT {...}``.

Usage: ``python -m tests.airflow.run_dag_subprocess DAG_FILE DAG_ID`` (a file of the DAGs folder)
with the environment of ``tests/fixtures/airflow.py`` (AIRFLOW_HOME, DAGs folder, migrated database).
"""

from __future__ import annotations

import json
import os
import sys


def main(dag_file: str, dag_id: str) -> None:
    try:
        from airflow.dag_processing.dagbag import DagBag
    except ImportError:  # Airflow < 3.2
        from airflow.models.dagbag import DagBag  # type: ignore[no-redef]

    dag = DagBag(os.path.join(os.environ["AIRFLOW__CORE__DAGS_FOLDER"], dag_file)).get_dag(dag_id)
    dag_run = dag.test()
    result = {}
    for ti in dag_run.get_task_instances():
        usage = ti.xcom_pull(task_ids=ti.task_id, key="usage")
        result[ti.task_id] = {"state": str(ti.state), "try_number": ti.try_number, "usage": usage}
    # One write: ``print`` writes the text and the newline apart, and a log line of another
    # thread (Python runs unbuffered here) could land between them, on the RESULT line.
    sys.stdout.write("RESULT " + json.dumps(result) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
