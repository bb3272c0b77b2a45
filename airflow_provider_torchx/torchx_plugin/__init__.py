"""The ``aws_batch`` scheduler for TorchX users: the core's AWS Batch scheduler behind TorchX's
``Scheduler`` interface, registered with TorchX by ``torchx_plugins/schedulers/`` (TorchX's
namespace package for outside schedulers; docs/torchx-plugin.md).

Its modules import ``torchx`` and are loaded only by TorchX, through that registration: nothing
else in this package imports them, so a user without TorchX sees no change.
"""
