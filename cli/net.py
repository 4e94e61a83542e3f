"""`pycni net add|check|del|gc|status NAME NETNS [-i IFNAME]`: cnitool, without Go.

Parsing only; the behaviour is `cni.runtime.tool`. `add` prints the result (4-space JSON),
the others print nothing; on error a readable report on stderr and exit status 1.
"""

from __future__ import annotations

import json
import os
import sys

import click

from cni.runtime.tool import describe_error, run_net, tool_env
from cni.spec.errors import CNIError

IFNAME_HELP = "interface name in the namespace (default: $CNI_IFNAME or eth0)"


@click.group(name="net")
def command() -> None:
    """Attach namespaces to a CNI network like cnitool (NETCONFPATH, CNI_PATH, CNI_ARGS,
    CAP_ARGS, CNI_IFNAME; results cached in $CNI_CACHE_DIR or /var/lib/cni)."""


def run_verb(verb: str, name: str, netns: str, ifname: str | None) -> None:
    try:
        result = run_net(verb, name, netns, tool_env(os.environ, ifname), stderr=sys.stderr)
    except CNIError as exc:
        click.echo(describe_error(exc, verb, name, netns), err=True)
        sys.exit(1)
    if result is not None:
        click.echo(json.dumps(result, indent=4))


def _verb(verb: str, summary: str) -> None:
    @command.command(name=verb, help=summary)
    @click.argument("name")
    @click.argument("netns")
    @click.option("-i", "--ifname", default=None, help=IFNAME_HELP)
    def _run(name: str, netns: str, ifname: str | None) -> None:
        run_verb(verb, name, netns, ifname)


_verb("add", "Add the network NAME to the namespace at path NETNS; print the result.")
_verb("check", "Check that the attachment of NAME in NETNS is as ADD made it.")
_verb("del", "Remove the network NAME from the namespace at path NETNS.")
_verb("gc", "Delete every cached attachment of NAME, then send GC to its plugins.")
_verb("status", "Ask each plugin of NAME whether it can serve ADD now.")
