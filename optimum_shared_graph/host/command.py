"""optimum-intel's `optimum-cli export openvino` command (`OVExportCommand`), extended for the process."""

from __future__ import annotations

from typing import Callable


def export_command_extended(add_arguments: Callable, run: Callable) -> bool:
    """Extend optimum-intel's `export openvino` command for the rest of the process; return whether it was
    extended now (False: already extended, or optimum-intel is not installed). Idempotent.

    `add_arguments(parser)` runs after the command's own `parse_args(parser)`; `run(command, original_run)`
    replaces its `run(self)` (`original_run(command)` is optimum-intel's). The originals are kept on the class
    as `_shared_graph_original`.
    """
    try:
        from optimum.commands.export import openvino as cli_module
    except ImportError:  # optimum-intel not installed: nothing to patch
        return False
    command = cli_module.OVExportCommand
    if getattr(command, "_shared_graph_original", None) is not None:
        return False
    original_parse, original_run = command.parse_args, command.run

    def parse_args(parser):
        original_parse(parser)
        add_arguments(parser)

    def patched_run(self):
        return run(self, original_run)

    parse_args.__wrapped__, patched_run.__wrapped__ = original_parse, original_run  # for inspect.unwrap
    command._shared_graph_original = (original_parse, original_run)
    command.parse_args = staticmethod(parse_args)
    command.run = patched_run
    return True
