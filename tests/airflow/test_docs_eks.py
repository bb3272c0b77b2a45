"""docs/schedulers.md, "Batch on EKS": the newcomer's dry run of a 2-node EKS GPU training
through a ``torchx`` connection works as the docs give it. The snippet's connection (its
``export``) and its Python script are taken from the page and run in this process (no AWS
settings: a dry run makes no call), which is what its ``bash`` does without a second Airflow
start-up."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
from pathlib import Path

import botocore.session
import pytest
from botocore.validate import ParamValidator

SNIPPET = re.compile(r"```bash\n(?P<body>.*?)```", re.S)


def docs_snippet() -> tuple[str, str, str]:
    """``(variable, value, script)``: the snippet's ``export`` and its ``dryrun_eks.py``."""
    docs = (Path(__file__).parents[2] / "docs" / "schedulers.md").read_text()
    found = SNIPPET.search(docs[docs.index("A newcomer's dry run") :])
    assert found is not None
    body = found["body"]
    export = re.search(r"^export (\w+)=('.*?')\n", body, re.S | re.M)
    script = re.search(r"<<'EOF'\n(.*?)\nEOF\n", body, re.S)
    assert export is not None and script is not None
    (value,) = shlex.split(export[2])
    return export[1], value, script[1]


def test_the_eks_dry_run_of_the_docs_works_as_written(monkeypatch: pytest.MonkeyPatch) -> None:
    name, value, script = docs_snippet()
    for key in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv(name, value)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(script, "dryrun_eks.py", "exec"), {"__name__": "__main__"})
    out = json.loads(printed.getvalue()[printed.getvalue().index("{\n") :])
    job_def = out["job_definition"]
    (node_range,) = job_def["nodeProperties"]["nodeRangeProperties"]
    pod = node_range["eksProperties"]["podProperties"]
    (container,) = pod["containers"]
    assert (job_def["nodeProperties"]["numNodes"], node_range["targetNodes"]) == (2, "0:1")
    assert container["resources"]["limits"] == {"cpu": "90", "memory": "900000Mi", "nvidia.com/gpu": "8"}
    assert "--nnodes 2 --nproc_per_node 8" in container["args"][1]
    assert {"name": "WANDB_API_KEY", "value": "***"} in container["env"]
    assert "0123456789abcdef" not in printed.getvalue()
    assert (pod["metadata"]["namespace"], pod["serviceAccountName"]) == ("training", "torchx-trainer-sa")
    assert job_def["consumableResourceProperties"]["consumableResourceList"] == [
        {"consumableResource": "wandb-seats", "quantity": 1}
    ]
    batch = botocore.session.get_session().get_service_model("batch")
    arn = "arn:aws:batch:us-east-1:123456789012:job-definition/j:1"
    for shape, params in (
        ("RegisterJobDefinitionRequest", job_def),
        ("SubmitJobRequest", {**out["submit_job"], "jobDefinition": arn}),
    ):
        report = ParamValidator().validate(params, batch.shape_for(shape))
        assert not report.has_errors(), report.generate_report()
