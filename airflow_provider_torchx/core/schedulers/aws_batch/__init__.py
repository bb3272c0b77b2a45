"""The AWS Batch scheduler: each app runs as one single-node or multi-node parallel job (see ``scheduler``)."""

from airflow_provider_torchx.core.schedulers.aws_batch.render import BatchJob
from airflow_provider_torchx.core.schedulers.aws_batch.scheduler import AWSBatchScheduler, create_scheduler

__all__ = ["AWSBatchScheduler", "BatchJob", "create_scheduler"]
