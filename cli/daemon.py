"""`pycni daemon [--config F]`: run the node daemon pycnid in the foreground."""

from __future__ import annotations

import click


@click.command(name="daemon")
@click.option(
    "--config",
    "-c",
    "config",
    default=None,
    type=click.Path(dir_okay=False),
    help="daemon config (JSON); default: built-in defaults",
)
@click.option("--socket", default=None, help="override the socket path")
@click.option("--node-name", default=None, help="override nodeName")
def command(config: str | None, socket: str | None, node_name: str | None) -> None:
    """Run pycnid, the node daemon that serves the plugins."""
    from pycnid.main import main as pycnid_main

    argv = [
        *(["--config", config] if config else []),
        *(["--socket", socket] if socket else []),
        *(["--node-name", node_name] if node_name else []),
    ]
    pycnid_main(argv)
