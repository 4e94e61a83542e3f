"""`pycni doctor`: parsing and printing only; the checks and repairs are ``doctor/``.

Exit status 2 means "found something", so a usage error exits 1 (click's own is 2), as every
other error does: a script can tell a typo from residue.
"""

from __future__ import annotations

from typing import Any

import click

from cli.command import Env, command_options
from cli.open_store import load_config

DEFAULT_GRACE = 60.0  # seconds: an ADD makes its veth well within it after taking its lease
#: seconds: two of pycnid's SQLite polls (0.5 s), in which its passes follow a DEL
DEFAULT_SETTLE = 1.0


def seconds(default: float) -> dict[str, Any]:
    """A duration option's type, default and metavar."""
    return {
        "type": click.FloatRange(min=0),
        "default": default,
        "show_default": True,
        "metavar": "SECONDS",
    }


class DoctorCommand(click.Command):
    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            exc.exit_code = 1
            raise


@click.command(name="doctor", cls=DoctorCommand)
@click.option(
    "--repair",
    is_flag=True,
    help="fix what is found: delete unexplained veths, nft elements and stale tables, "
    "apply IPAM check's fixes, and release leases whose attachment has no host veth (safe: "
    "with no interface on the node no traffic uses the address)",
)
@click.option(
    "--network",
    "networks",
    multiple=True,
    metavar="NAME",
    help="a network pycni-bridge serves with pycni-ipam on this node (repeatable) "
    "[default: those of the CNI config directory]",
)
@click.option(
    "--cni-conf-dir",
    default=None,
    metavar="DIR",
    help="the CNI config directory [default: $NETCONFPATH, else /etc/cni/net.d]",
)
@click.option(
    "--grace",
    **seconds(DEFAULT_GRACE),
    help="a lease younger than this is not judged (an ADD takes its lease before it makes "
    "the host veth)",
)
@click.option(
    "--settle",
    **seconds(DEFAULT_SETTLE),
    help="when something is found, look again after this long and report what is still "
    "there (a DEL returns before pycnid's next pass takes its Pod's elements out); 0: "
    "one look",
)
@command_options
def command(
    env: Env,
    repair: bool,
    networks: tuple[str, ...],
    cni_conf_dir: str | None,
    grace: float,
    settle: float,
) -> int:
    """Everything pycni owns on this node that nothing explains; run it in the node's netns.
    Exit 0 clean (or all repaired), 2 when something is found (or left unrepaired)."""
    from doctor.read import default_conf_dir, read_bridge_networks
    from doctor.run import Scope, exit_status, run_doctor, to_document
    from kernel.nft import Nft

    config = load_config(env.opts, sections=True)
    scope = Scope(
        node=config.node_name,
        networks=networks or tuple(read_bridge_networks(cni_conf_dir or default_conf_dir())),
        device=config.overlay.device_name if config.overlay is not None else None,
        endpoints_in_store=config.kube is None,
        grace=grace,
        settle=settle,
    )
    outcomes = run_doctor(env.store(), Nft(), scope, repair)
    env.emit(to_document(scope, outcomes), render_doctor)
    return exit_status(outcomes)


def render_doctor(doc: dict) -> str:
    if doc["clean"]:
        return f"node {doc['node']}: nothing pycni left behind"
    lines = [f"node {doc['node']}: {len(doc['findings'])} finding(s)"]
    for f in doc["findings"]:
        state = {None: "", True: " [repaired]", False: f" [NOT repaired: {f.get('error')}]"}
        lines.append(f"  {f['kind']:<15} {f['object']}: {f['why']}{state[f['repaired']]}")
    return "\n".join(lines)
