"""`pycni`, the command line: a click group whose subcommands live in their own modules.

Every module `cli/<name>.py` (not starting with "_") that defines `command` (a click
command or group) becomes `pycni <name>`; modules are imported only when their command is
used or listed, so `pycni net add` never pays for another group's imports. A new group
(`ipam`, `svc`, `node` …) is a new module here, nothing else to edit.
"""

from __future__ import annotations

import importlib
import pkgutil

import click


def command_modules() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


class LazyGroup(click.Group):
    """Subcommands discovered from the modules of this package, imported on demand."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *command_modules()})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        found = super().get_command(ctx, name)
        if found is not None or name not in command_modules():
            return found
        module = importlib.import_module(f"{__name__}.{name}")
        return getattr(module, "command", None)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """pycni: CNI networking for Linux/Kubernetes nodes."""


def main(argv: list[str] | None = None) -> None:
    cli.main(args=argv, prog_name="pycni")
