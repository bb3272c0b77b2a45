"""TorchX's ``status``, ``list``, ``log``, ``cancel``, ``describe`` and ``delete`` subcommands,
printing the plugin's errors as one line (docs/torchx-plugin.md).

``torchx run`` prints a bad run option or app as one ERROR line; TorchX's other subcommands
let any error escape as a traceback. These are TorchX's own subcommands, registered under their
names through TorchX's entry point group ``torchx.cli.cmds`` (which replaces a builtin of the
same name), each run as TorchX runs it, except that an error the plugin raises for the user
(``errors.USER_ERRORS``: bad input, an unusable AWS setup) or a malformed app handle is logged
as one ERROR line in TorchX's log format and the command exits 1. Any other error, and every
other scheduler's, escapes as before. ``torchx log`` reads each replica in a thread of its own: the thread's
traceback is left out for those errors too (TorchX's main thread reports them).
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from torchx import specs as tx
from torchx.cli.cmd_base import SubCommand
from torchx.cli.cmd_cancel import CmdCancel as _TorchXCancel
from torchx.cli.cmd_delete import CmdDelete as _TorchXDelete
from torchx.cli.cmd_describe import CmdDescribe as _TorchXDescribe
from torchx.cli.cmd_list import CmdList as _TorchXList
from torchx.cli.cmd_log import CmdLog as _TorchXLog
from torchx.cli.cmd_status import CmdStatus as _TorchXStatus

from airflow_provider_torchx.torchx_plugin.errors import USER_ERRORS

log = logging.getLogger(__name__)

#: What the subcommands print as one line: the plugin's errors for the user, and TorchX's own
#: for a handle that is not ``scheduler://session/app_id``.
ONE_LINE: tuple[type[Exception], ...] = (*USER_ERRORS, tx.MalformedAppHandleException)


def one_line(err: BaseException) -> str:
    """What the CLI prints for one of ``ONE_LINE``: its message, a bad run option's as
    ``torchx run`` words it, on one line."""
    text = " ".join(str(err).split())
    return f"Invalid scheduler configuration: {text}" if isinstance(err, tx.InvalidRunConfigException) else text


@contextmanager
def one_line_errors() -> Iterator[None]:
    """Within the block, ``ONE_LINE``'s errors end the command with one ERROR line and exit status 1;
    threads started in the block print no traceback for them."""
    previous = threading.excepthook

    def thread_hook(args: threading.ExceptHookArgs) -> None:
        if not isinstance(args.exc_value, ONE_LINE):
            previous(args)

    threading.excepthook = thread_hook
    try:
        yield
    except ONE_LINE as err:
        log.error("%s", one_line(err))
        sys.exit(1)
    finally:
        threading.excepthook = previous


class _OneLineErrors(SubCommand):
    """TorchX's subcommand (the next class in the MRO), run within ``one_line_errors``."""

    def run(self, args: argparse.Namespace) -> None:
        with one_line_errors():
            super().run(args)


class CmdCancel(_OneLineErrors, _TorchXCancel):
    """``torchx cancel``."""


class CmdDelete(_OneLineErrors, _TorchXDelete):
    """``torchx delete``."""


class CmdDescribe(_OneLineErrors, _TorchXDescribe):
    """``torchx describe``."""


class CmdList(_OneLineErrors, _TorchXList):
    """``torchx list``."""


class CmdLog(_OneLineErrors, _TorchXLog):
    """``torchx log``."""


class CmdStatus(_OneLineErrors, _TorchXStatus):
    """``torchx status``."""
