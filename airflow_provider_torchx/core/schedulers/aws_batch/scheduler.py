"""``AWSBatchScheduler``: an ``AppDef`` as one AWS Batch job, single-node or multi-node parallel.

Calls go through the boto3 clients of ``clients.AWSClients`` (injected, from an injected boto3
session, or from boto3's default chain; ``AWS_ENDPOINT_URL`` and the region come from the
environment), which retry throttling, 5xx and lost connections themselves. Status reads go
through the process-wide ``StatusPoller`` (a look for its futures: ``looks.Look``); log reads
through ``joblogs.JobLogs``. boto3 and docker are imported only when a client is first needed.
"""

from __future__ import annotations

import builtins
import concurrent.futures
import functools
import logging
from collections.abc import Callable, Collection, Iterable, Mapping
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_provider_torchx.core import workspace
from airflow_provider_torchx.core.errors import InvalidRunConfigError, UnknownQueueError
from airflow_provider_torchx.core.rates import rates_of
from airflow_provider_torchx.core.runopts import Cfg, CfgVal, runopts
from airflow_provider_torchx.core.schedulers.api import (
    CancelledBy,
    DescribeAppResponse,
    ListAppResponse,
    LogChunk,
    Scheduler,
    SchedulerCapabilities,
    Stream,
    labels_match,
    newest,
)
from airflow_provider_torchx.core.schedulers.aws_batch import (
    eks,
    looks,
    options,
    preflight,
    render,
    run_options,
    status,
    stuck,
)
from airflow_provider_torchx.core.schedulers.aws_batch.clients import AWSClients, all_items, client_config
from airflow_provider_torchx.core.schedulers.aws_batch.joblogs import JobLogs
from airflow_provider_torchx.core.schedulers.aws_batch.looks import R
from airflow_provider_torchx.core.schedulers.aws_batch.poller import NOT_VISIBLE, StatusPoller, client_key
from airflow_provider_torchx.core.schedulers.aws_batch.pricing import AttemptPricer
from airflow_provider_torchx.core.schedulers.aws_batch.setup_errors import translate_setup_errors, translated_iter
from airflow_provider_torchx.core.schedulers.aws_batch.usage import batch_usage
from airflow_provider_torchx.core.specs import AppDef, AppDryRunInfo, AppState, Role
from airflow_provider_torchx.core.statedir import default_state_dir

if TYPE_CHECKING:
    import asyncio

log = logging.getLogger(__name__)

BACKEND = "aws_batch"
#: Failed jobs' ListJobs summaries kept per scheduler (see ``_summary_container``).
_MAX_SUMMARIES = 1000


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("airflow-provider-torchx")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def _error_code(err: Exception) -> str:
    response = getattr(err, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


@translate_setup_errors(
    "submit_dryrun",
    "schedule",
    "describe",
    "describe_native",
    "list",
    "cancel",
    "delete",
    "read_log",
    "log_iter",
    "check_settings",
)
class AWSBatchScheduler(Scheduler[render.BatchJob]):
    """Runs apps on AWS Batch; app ids are ``queue:job_name``.

    ``client`` (Batch), ``log_client`` (CloudWatch Logs), ``ec2_client`` (EC2: the queue
    check's instance types), ``docker_client`` or a boto3
    ``session`` may be injected; otherwise they are created on first use, from
    ``session_factory``, else from ``region``/``profile`` (or the run options of those names,
    given before the first AWS call) over boto3's default chain (``aws``: ``AWSClients``).
    ``session_key`` names the credentials ``session_factory``'s sessions carry (the hook: a
    fingerprint of the AWS connection; None: boto3's default chain): instances with equal keys
    share the status poller and the CloudWatch budget (``credentials_key``). AWS setup errors
    raise ``SchedulerSetupError`` (``setup_errors.py``).
    """

    supports_workspace = True
    capabilities = SchedulerCapabilities(aws_session=True, prices_attempts=True)

    def __init__(
        self,
        session_name: str,
        client: Any | None = None,
        log_client: Any | None = None,
        docker_client: Any | None = None,
        session: Any | None = None,
        ec2_client: Any | None = None,
        session_factory: Callable[[], Any] | None = None,
        region: str | None = None,
        profile: str | None = None,
        session_key: str | None = None,
    ) -> None:
        super().__init__(BACKEND, session_name)
        #: The session, clients, credentials key and what is shared under it.
        self.aws = AWSClients(
            client=client,
            log_client=log_client,
            ec2_client=ec2_client,
            docker_client=docker_client,
            session=session,
            session_factory=session_factory,
            region=region,
            profile=profile,
            session_key=session_key,
        )
        self._summaries: dict[str, dict[str, Any]] = {}
        #: The one bound ``_response`` every look holds (``looks.Look``): a look adds no other object.
        self._respond = self._response
        #: The replica logs of this instance's jobs.
        self.logs = JobLogs(self.aws, self.backend, self._job, self._nodes, self._queue_view)

    # ------------------------------------------------------------------ clients

    @property
    def client(self) -> Any:
        """The Batch client."""
        return self.aws.client

    @property
    def log_client(self) -> Any:
        """The CloudWatch Logs client."""
        return self.aws.log_client

    @property
    def ec2_client(self) -> Any:
        """The EC2 client (``DescribeInstanceTypes`` for the queue check)."""
        return self.aws.ec2_client

    @property
    def docker_client(self) -> Any:
        """The Docker client (workspace builds and pushes)."""
        return self.aws.docker_client

    @property
    def credentials_key(self) -> str:
        """Which credentials this instance's clients sign with (``AWSClients.credentials_key``)."""
        return self.aws.credentials_key

    @property
    def poller(self) -> StatusPoller:
        """The process-wide status poller of this instance's client and credentials
        (``AWSClients.poller``)."""
        return self.aws.poller

    # ------------------------------------------------------------------ submit

    def _run_opts(self) -> runopts:
        return run_options.run_opts()

    def _validate(self, app: AppDef, scheduler: str, cfg: dict[str, CfgVal]) -> None:
        self.aws.use_location(cfg)
        render.validate(app, on_eks=options.resolve(app, cfg).eks)
        render.queue_name(str(cfg["queue"]))
        render.parse_ulimits(cfg.get("ulimits"))  # type: ignore[arg-type]
        for i, role in enumerate(app.roles):
            if workspace.is_local_image(role.image) and not cfg.get("image_repo"):
                raise InvalidRunConfigError(
                    f"cfg: image_repo is not set, but roles[{i}] ({role.name!r}) runs the local image "
                    f"{role.image!r}, which must be pushed to a repository AWS Batch can pull from"
                )

    def build_workspace_image(self, role: Role, cfg: Mapping[str, CfgVal]) -> str | None:
        """Build ``role.workspace`` on ``role.image`` with Docker; the local image id. It is
        pushed to ``image_repo`` when the job is scheduled."""
        if not role.workspace:
            return None
        if not cfg.get("image_repo"):
            raise InvalidRunConfigError(
                f"cfg: image_repo is not set, but role {role.name!r} has a workspace whose image must be "
                "pushed to a repository AWS Batch can pull from (e.g. image_repo=<account>.dkr.ecr.<region>"
                ".amazonaws.com/<repo>)"
            )
        return workspace.build_image(self.docker_client, role.image, role.workspace, quiet=bool(cfg.get("quiet")))

    def _submit_dryrun(
        self, app: AppDef, cfg: dict[str, CfgVal], labels: dict[str, str]
    ) -> AppDryRunInfo[render.BatchJob]:
        to_push = {
            r.image: workspace.push_target(r.image, str(cfg["image_repo"]))
            for r in app.roles
            if workspace.is_local_image(r.image)
        }
        job = render.render(
            app,
            cfg,
            labels,
            backend=self.backend,
            session_name=self.session_name,
            version=_version(),
            images_to_push=to_push,
        )
        return AppDryRunInfo(job, render.BatchJob.format)

    def _no_such_queue(self, queue: str) -> UnknownQueueError:
        names = sorted(q["jobQueueName"] for q in self._all_queues())
        return UnknownQueueError(
            f"cfg: queue={queue!r} does not exist in {self.aws.region()}; "
            f"existing queues: {', '.join(names) or '(none)'}"
        )

    def _describe_queue(self, queue: str) -> preflight.QueueView | None:
        return preflight.describe(self.client, lambda: self.ec2_client, queue)

    def _queue_view(self, queue: str) -> preflight.QueueView:
        """The queue's descriptions, shared by the process for ``preflight.CACHE_TTL``; an
        error for a queue that does not exist."""
        key = (*client_key(self.client, self.credentials_key), queue)
        view = preflight.queue_cache.get(key, functools.partial(self._describe_queue, queue))
        if view is None:
            raise self._no_such_queue(queue)
        return view

    def _for_queue(self, info: AppDryRunInfo[render.BatchJob]) -> render.BatchJob:
        """The job to submit: one whose platform follows its queue (no ``platform`` asked
        for) is rendered again, under the same name, for EKS when the queue's compute
        environments are EKS (read with the queue check's cached descriptions, so with
        ``check_queue`` only)."""
        job = info.request
        if not job.follows_queue or info._app is None or not any(map(options.is_eks, self._queue_view(job.queue).envs)):
            return job
        return render.render(
            info.app,
            info.cfg,
            info.labels,
            backend=self.backend,
            session_name=self.session_name,
            version=_version(),
            images_to_push=job.images_to_push,
            name=job.name,
            platform="EKS",
        )

    def _check_queue(self, job: render.BatchJob) -> None:
        """A clear error for a queue that does not exist or cannot run ``job`` (read-only
        calls, before any write; each queue's descriptions are shared by the process for
        ``preflight.CACHE_TTL``): see ``options.check_queue`` and ``preflight.check``."""
        queue = job.queue
        view = self._queue_view(queue)
        info = options.QueueInfo(
            kinds=frozenset(options.compute_kind(env) for env in view.envs),
            fair_share=bool(view.queue.get("schedulingPolicyArn")),
        )
        platform = "EKS" if job.on_eks else str(job.job_def["platformCapabilities"][0])
        options.check_queue(queue, info, str(job.job_def["type"]), platform, job.share_id)
        preflight.check(view, preflight.job_needs(job.job_def))

    def schedule(self, dryrun_info: AppDryRunInfo[render.BatchJob]) -> str:
        """Push the images, register the job definition, submit the job; return its app id."""
        job = dryrun_info.request
        if dryrun_info.cfg.get("check_queue", True):  # False: no describe call, the platform as rendered
            job = self._for_queue(dryrun_info)
            self._check_queue(job)
        quiet = bool(dryrun_info.cfg.get("quiet"))
        for image_id, (repo, tag) in job.images_to_push.items():
            workspace.push_image(self.docker_client, image_id, repo, tag, quiet=quiet)
        registered = self.client.register_job_definition(**job.job_def)
        resp = self.client.submit_job(jobDefinition=registered["jobDefinitionArn"], **job.submit_request())
        poller = self.poller
        poller.remember(job.app_id, resp["jobId"])
        poller.expect(resp["jobId"])
        log.info("submitted %s as job %s", job.app_id, resp["jobId"])
        return job.app_id

    # ------------------------------------------------------------------ observe

    def _job_id(self, app_id: str) -> str | None:
        """The Batch job id of ``app_id`` (remembered, else found by name with ListJobs)."""
        queue, sep, name = app_id.partition(":")
        if not sep or not queue or not name:
            return None
        poller = self.poller
        known = poller.job_id(app_id)
        if known:
            return known
        summaries = self._list_jobs(queue, [{"name": "JOB_NAME", "values": [name]}])
        matches = sorted((s for s in summaries if s["jobName"] == name), key=lambda s: s.get("createdAt", 0))
        if not matches:
            return None
        poller.remember(app_id, matches[-1]["jobId"])
        return str(matches[-1]["jobId"])

    def _job(self, app_id: str, max_age: float | None = None) -> dict[str, Any] | None:
        """The newest DescribeJobs entry of ``app_id`` from the shared poller, at most
        ``max_age`` seconds old (the poller's default when None); None: no such job."""
        job_id = self._job_id(app_id)
        if job_id is None:
            return None
        return self.poller.get([job_id], max_age=max_age)[job_id]

    def _nodes(self, job: Mapping[str, Any], nodes: Iterable[int]) -> dict[int, dict[str, Any]]:
        """Child jobs ``jobId#N`` by node index (real AWS; moto has none)."""
        ids = looks.node_ids(job, nodes)
        max_age = looks.ENDED_NODES_MAX_AGE if status.has_ended(job) else None
        return looks.by_node(ids, self.poller.get(list(ids), max_age=max_age))

    def describe(self, app_id: str) -> DescribeAppResponse | None:
        """Status, roles, labels of the job; node details (exit codes) once it ended; its
        attempts priced at AWS's prices when it carries no rates (``pricing.py``: each once
        while it runs and once ended, here blocking)."""
        job = self._job(app_id)
        ended = looks.ended_nodes(job)
        return self._response(app_id, job, self._nodes(job, ended) if job and ended else {}, priced=True)

    @functools.cached_property
    def pricer(self) -> AttemptPricer:
        """What prices this scheduler's attempts at AWS's prices (made on first use),
        its Price List answers kept under the host's state dir."""
        return AttemptPricer(
            lambda service, region: self.aws.session().client(
                service, region_name=region or self.aws.region(), config=client_config()
            ),
            self.aws.region(),
            Path(default_state_dir()) / "aws-prices",
        )

    def describe_future_as(
        self, app_id: str, then: Callable[[DescribeAppResponse | None], R], period: float | None = None
    ) -> concurrent.futures.Future[R] | None:
        """``describe`` answered by the shared poller's thread (its next round, or its cache;
        with ``period``, the job's next scheduled look: ``StatusPoller.request``), mapped by
        ``then`` there, in one future per look (``StatusPoller.request_then``); None before
        this instance made its client (building an AWS session may block) or for an app whose
        job id this process has not learnt yet (``describe`` does both, blocking;
        ``adopt_native_id`` does both without a look-up)."""
        job_id = self._known_job_id(app_id)
        if job_id is None:
            return None
        future: concurrent.futures.Future[R] = concurrent.futures.Future()
        self._look(app_id, job_id, then, period, future)
        return future

    def describe_on_loop_as(
        self,
        app_id: str,
        then: Callable[[DescribeAppResponse | None], R],
        loop: asyncio.AbstractEventLoop,
        period: float | None = None,
    ) -> asyncio.Future[R] | None:
        """``describe_future_as`` resolved on ``loop`` by the poller's thread itself: a look
        holds an asyncio future, the poller's waiter and one ``looks.Look``, nothing more."""
        job_id = self._known_job_id(app_id)
        if job_id is None:
            return None
        future: asyncio.Future[R] = loop.create_future()
        self._look(app_id, job_id, then, period, future)
        return future

    def _known_job_id(self, app_id: str) -> str | None:
        """The job id of ``app_id`` if it is known without a blocking call (the client made,
        the id learnt: see ``describe_future_as``), else None."""
        return self.poller.job_id(app_id) if self.aws.made else None

    def _look(
        self,
        app_id: str,
        job_id: str,
        then: Callable[[DescribeAppResponse | None], R],
        period: float | None,
        future: concurrent.futures.Future[R] | asyncio.Future[R],
    ) -> None:
        """Ask the poller for job ``job_id`` of ``app_id`` on behalf of ``future`` (``looks.Look``)."""
        poller = self.poller
        look = looks.Look(self._respond, poller, app_id, job_id, then, future)
        poller.request_then(future, look, [job_id], period=period)

    def wait_reason(self, app_id: str) -> str:
        """Why the job has not started (``stuck.wait_reason``): one DescribeJobs and a fresh
        description of its queue (never the preflight's cache: the state now is wanted)."""
        job_id = self._job_id(app_id)
        found = self.client.describe_jobs(jobs=[job_id]).get("jobs", []) if job_id else []
        if not found:
            return ""
        queue = str(found[0].get("jobQueue", "")).rsplit("/", 1)[-1]
        return stuck.wait_reason(found[0], self._describe_queue(queue) if queue else None)

    def native_id(self, app_id: str) -> str | None:
        """The Batch job id (remembered, else looked up by name with ListJobs: may block)."""
        return self._job_id(app_id)

    def adopt_native_id(self, app_id: str, native_id: str) -> None:
        """Remember ``native_id`` as the job id of ``app_id`` (no call to AWS). Makes the
        client if needed (building the AWS session may block, once per scheduler), so that
        ``describe_future`` answers from then on."""
        if not native_id:
            raise ValueError(f"native_id: {native_id!r} is not a Batch job id of {app_id}")
        self.poller.remember(app_id, native_id)

    def _response(
        self, app_id: str, job: dict[str, Any] | None, nodes: dict[int, dict[str, Any]], priced: bool = False
    ) -> DescribeAppResponse | None:
        """The description of ``app_id`` from its entry ``job`` and its nodes' child jobs.
        Unless the job carries rates, its attempts at AWS's prices: ``priced`` (``describe``),
        each found now; else (a look, on the poller's thread) a live job's attempts as far as
        they are priced already, the rest priced off that thread for a later look
        (``AttemptPricer.price_soon``), and an ended job's not at all."""
        if job is None:
            return None
        if job is NOT_VISIBLE:
            return DescribeAppResponse(app_id=app_id, state=AppState.PENDING, msg=str(job["statusReason"]))
        if (
            not render.is_multinode(job)
            and status.app_state(job) == AppState.FAILED
            and status.exit_code(job) is None
            and job.get("startedAt")  # a job ended before it started has no exit code to look up
            and not eks.is_eks_job(job)  # a pod's exit code is in the job's eksAttempts
        ):
            job = {**job, "container": {**self._summary_container(app_id, job), **(job.get("container") or {})}}
        resp = status.describe_response(app_id, job, nodes, self.aws.region())
        ended = resp.state.is_terminal()
        price = None
        if rates_of(resp.labels) is None and (priced or not ended):
            price = self.pricer.price if priced else self.pricer.price_soon
        if ended:
            resp.usage = batch_usage(job, nodes, resp.roles, price)
        else:  # what guards read at each look (``core/guards.py``): no AWS call on the look's thread
            resp.usage_so_far = batch_usage(job, nodes, resp.roles, price)
        return resp

    def _summary_container(self, app_id: str, job: Mapping[str, Any]) -> dict[str, Any]:
        """The ``container`` (exit code, reason) of a failed single-node job's ListJobs summary,
        asked once per job: moto's DescribeJobs leaves a container job's exit code out."""
        job_id = str(job["jobId"])
        if job_id not in self._summaries:
            queue, _, name = app_id.partition(":")
            found = [
                s for s in self._list_jobs(queue, [{"name": "JOB_NAME", "values": [name]}]) if s["jobId"] == job_id
            ]
            if len(self._summaries) >= _MAX_SUMMARIES:  # a long-lived triggerer keeps memory flat
                self._summaries.pop(next(iter(self._summaries)))
            self._summaries[job_id] = dict(found[0].get("container") or {}) if found else {}
        return self._summaries[job_id]

    def check_settings(self, cfg: Mapping[str, CfgVal]) -> str:
        """That the job queue ``cfg["queue"]`` exists and runs jobs, by the submit-time
        check's rule (``preflight.queue_refusal``: ENABLED, and VALID or UPDATING), and what it
        does with a job blocked RUNNABLE (``preflight.runnable_limit``)."""
        self.aws.use_location(cfg)
        queue = str(cfg.get("queue"))
        found = self.client.describe_job_queues(jobQueues=[queue]).get("jobQueues", [])
        if not found:
            raise self._no_such_queue(queue)
        refused = preflight.queue_refusal(found[0])
        if refused:
            raise InvalidRunConfigError(f"queue: {refused}: AWS Batch runs no jobs from it")
        state, state_status = found[0].get("state"), found[0].get("status")
        return f"AWS Batch job queue {queue!r} is {state} ({state_status}); {preflight.runnable_limit(found[0])}"

    def describe_native(self, app_id: str) -> AppDryRunInfo[render.BatchJob] | None:
        """The job as Batch holds it, as a ``BatchJob``."""
        job = self._job(app_id)
        if job is None or job is NOT_VISIBLE:
            return None
        multinode, on_eks = render.is_multinode(job), eks.is_eks_job(job)
        job_def = {
            "jobDefinitionName": str(job.get("jobDefinition", "")).rsplit("/", 1)[-1].split(":")[0],
            "type": "multinode" if multinode else "container",
            "nodeProperties": job.get("nodeProperties"),
            "containerProperties": None if multinode or on_eks else _definition_fields(job.get("container") or {}),
            "eksProperties": job.get("eksProperties") if on_eks and not multinode else None,
            "retryStrategy": job.get("retryStrategy"),
            "platformCapabilities": job.get("platformCapabilities"),
            "propagateTags": job.get("propagateTags"),
            "tags": job.get("tags") or {},
        }
        batch_job = render.BatchJob(
            name=str(job["jobName"]),
            queue=app_id.partition(":")[0],
            share_id=job.get("shareIdentifier"),
            job_def={k: v for k, v in job_def.items() if v is not None},
            priority=int(job.get("schedulingPriority") or 0),
        )
        info = AppDryRunInfo(batch_job, render.BatchJob.format)
        info._scheduler = self.backend
        return info

    def _all_queues(self) -> builtins.list[dict[str, Any]]:
        return all_items(self.client, "describe_job_queues", "jobQueues")

    def _list_jobs(
        self, queue: str, filters: builtins.list[dict[str, Any]] | None, job_status: str | None = None
    ) -> builtins.list[dict[str, Any]]:
        """Every job summary of ``queue`` matching ``filters`` (or, without filters, in
        ``job_status``), all pages."""
        kwargs: dict[str, Any] = {"jobQueue": queue}
        if filters:
            kwargs["filters"] = filters
        if job_status:
            kwargs["jobStatus"] = job_status
        try:
            return all_items(self.client, "list_jobs", "jobSummaryList", **kwargs)
        except Exception as err:
            if _error_code(err) == "ClientException":  # no such queue
                raise self._no_such_queue(queue) from None
            raise

    def list(
        self,
        cfg: Cfg | None = None,
        labels: Mapping[str, str] | None = None,
        *,
        limit: int | None = None,
        also_tagged: Collection[str] = (),
    ) -> list[ListAppResponse]:
        """This scheduler's jobs (by tag) in the cfg's queue or in every queue, with ``labels``,
        oldest first; ``limit``: the newest ``limit``. ``also_tagged``: tags that mark other
        jobs to list too (the TorchX plugin: those TorchX 0.7.0's scheduler submitted).

        Jobs with labels are found by their job-name prefix (the hash of the label set they
        were submitted with, so ``labels`` must be that whole set), then confirmed by tags.
        Without labels, all jobs of the queues are listed (``AFTER_CREATED_AT`` makes
        ListJobs return every status) and described in batches of 100 to read their tags,
        newest first (ListJobs' ``createdAt``), stopping once ``limit`` are found.
        """
        self.aws.use_location(cfg)
        want = dict(labels or {})
        if cfg and cfg.get("queue"):
            queues = [render.queue_name(str(cfg["queue"]))]
        else:
            queues = [q["jobQueueName"] for q in self._all_queues()]
        name_filter = {"name": "JOB_NAME", "values": [render.labels_hash(want) + "-*"]} if want else None
        all_filter = {"name": "AFTER_CREATED_AT", "values": ["1"]}
        summaries: dict[str, tuple[str, dict[str, Any]]] = {}
        for queue in queues:
            for s in self._list_jobs(queue, [name_filter or all_filter]):
                summaries[s["jobId"]] = (queue, s)
        return newest(self._described(summaries, want, limit, also_tagged), limit)

    def list_live(self, cfg: Cfg | None = None) -> builtins.list[ListAppResponse]:
        """This scheduler's jobs that have not ended, in the cfg's queue or in every queue:
        ListJobs by each live status (so the queue's ended jobs, which Batch keeps for days,
        are neither paged through nor described), then DescribeJobs per 100 for their tags."""
        if cfg and cfg.get("queue"):
            queues = [render.queue_name(str(cfg["queue"]))]
        else:
            queues = [q["jobQueueName"] for q in self._all_queues()]
        summaries: dict[str, tuple[str, dict[str, Any]]] = {}
        for queue in queues:
            for job_status in status.LIVE_STATUSES:
                for s in self._list_jobs(queue, None, job_status):
                    summaries[s["jobId"]] = (queue, s)
        return [app for app in self._described(summaries, {}) if not app.state.is_terminal()]

    def _described(
        self,
        summaries: Mapping[str, tuple[str, dict[str, Any]]],
        want: Mapping[str, str],
        limit: int | None = None,
        also_tagged: Collection[str] = (),
    ) -> builtins.list[ListAppResponse]:
        """The jobs of ``summaries`` (``{job id: (queue, summary)}``) that this scheduler
        submitted (or that carry a tag of ``also_tagged``) and whose labels include ``want``,
        read with DescribeJobs per 100, newest first; ``limit``: stop after the batch in which
        that many were found."""
        marks = (render.TAG_VERSION, *also_tagged)
        ids = sorted(summaries, key=lambda job_id: (summaries[job_id][1].get("createdAt") or 0, job_id), reverse=True)
        out: builtins.list[ListAppResponse] = []
        for n in range(0, len(ids), 100):
            if limit is not None and len(out) >= limit:
                break
            resp = self.client.describe_jobs(jobs=ids[n : n + 100])
            for job in resp.get("jobs", []):
                tags = job.get("tags") or {}
                if not any(mark in tags for mark in marks):
                    continue
                have = {k[len(render.TAG_LABEL) :]: v for k, v in tags.items() if k.startswith(render.TAG_LABEL)}
                if not labels_match(have, want):
                    continue
                queue = summaries[job["jobId"]][0]
                out.append(
                    ListAppResponse(
                        app_id=f"{queue}:{job['jobName']}",
                        state=status.app_state(job),
                        name=str(job["jobName"]),
                        labels=have,
                        created=status.epoch_seconds(job.get("createdAt")),
                        started=status.epoch_seconds(job.get("startedAt")),
                        ended=status.epoch_seconds(job.get("stoppedAt")),
                        start_timeout=render.tagged_start_timeout(tags),
                    )
                )
        return out

    # ------------------------------------------------------------------ logs

    def read_log(
        self,
        app_id: str,
        role_name: str,
        k: int = 0,
        cursor: str | None = None,
        streams: Stream | None = None,
        max_lines: int | None = None,
    ) -> LogChunk:
        """Lines of replica ``k`` of ``role_name`` after ``cursor``, CloudWatch calls drawn
        from the process's fair ``LogBudget`` (``JobLogs.read``)."""
        return self.logs.read(app_id, role_name, k, cursor, streams, max_lines)

    def log_iter(
        self,
        app_id: str,
        role_name: str,
        k: int = 0,
        regex: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        should_tail: bool = False,
        streams: Stream | None = None,
    ) -> Iterable[str]:
        """Lines of replica ``k`` of ``role_name`` within ``[since, until]``; with
        ``should_tail`` follows until the job ended and its log is drained (``JobLogs.lines``)."""
        return translated_iter(self.logs.lines(app_id, role_name, k, regex, since, until, should_tail, streams))

    # ------------------------------------------------------------------ stop

    def _cancel_existing(self, app_id: str, reason: str | None, by: CancelledBy | None) -> None:
        """Tag the job as cancelled (the tag's value says ``by``), then CancelJob (not started)
        or TerminateJob (started) with a reason of ours (``status.cancel_reason_text``) that
        carries ``reason``, and ``by`` too when the tag could not be set."""
        job = self._job(app_id)  # ``cancel`` described it just now: fresh enough
        if job is None or job is NOT_VISIBLE:
            log.info("cancel: job %s is not visible yet; nothing to cancel", app_id)
            return
        job_id = str(job["jobId"])
        try:
            self.client.tag_resource(resourceArn=job["jobArn"], tags={render.TAG_CANCEL: status.cancel_tag_value(by)})
        except Exception as err:  # the reason still records the request (and who) once Batch applies it
            log.warning("cancel: could not tag %s as cancelled: %s", app_id, err)
            reason = status.cancel_reason_text(self.backend, reason, by)
        else:
            reason = status.cancel_reason_text(self.backend, reason)
        if job.get("status") in status.NOT_STARTED:
            self.client.cancel_job(jobId=job_id, reason=reason)
            again = self.poller.get([job_id], max_age=0.0)[job_id]
            if not again or again.get("status") not in ("STARTING", "RUNNING"):
                self.poller.invalidate(job_id)
                return
            # It started meanwhile: CancelJob does nothing to a started job.
        self.client.terminate_job(jobId=job_id, reason=reason)
        self.poller.invalidate(job_id)
        log.info("cancel: requested for %s (%s)", app_id, job_id)

    def _delete_existing(self, app_id: str) -> None:
        job = self._job(app_id)
        if job is None or job is NOT_VISIBLE or not job.get("jobDefinition"):
            return
        try:
            self.client.deregister_job_definition(jobDefinition=job["jobDefinition"])
        except Exception as err:
            if _error_code(err) != "ClientException":
                raise
            log.info("delete: job definition of %s already gone: %s", app_id, err)


#: ``ContainerDetail`` fields of a running or ended container, not of its definition.
_RUNTIME_FIELDS = frozenset(
    {"exitCode", "reason", "logStreamName", "networkInterfaces", "taskArn", "containerInstanceArn"}
)


def _definition_fields(container: Mapping[str, Any]) -> dict[str, Any]:
    """A single-node job's ``containerProperties`` as DescribeJobs returns them (its
    ``container`` without the fields that describe the run)."""
    return {k: v for k, v in container.items() if k not in _RUNTIME_FIELDS}


#: The keyword arguments ``create_scheduler`` passes on to ``AWSBatchScheduler``.
_FACTORY_KWARGS = (
    "client",
    "log_client",
    "docker_client",
    "session",
    "session_factory",
    "region",
    "profile",
    "session_key",
)


def create_scheduler(session_name: str, **kwargs: Any) -> AWSBatchScheduler:
    """The entry-point factory: ``AWSBatchScheduler``'s keyword arguments, others ignored (as
    every factory does); ``session_factory`` builds the boto3 session on first use when
    ``session`` is not given, else ``region``/``profile`` do."""
    return AWSBatchScheduler(session_name, **{k: v for k, v in kwargs.items() if k in _FACTORY_KWARGS})
