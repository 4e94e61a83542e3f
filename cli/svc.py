"""`pycni svc`: config set|show, create, set, rm, ls, show, endpoints, endpoint set|drain —
parsing and printing.

Behaviour lives in ``services.ops.edit`` (over ``services``). The flags of create and
set, or ``--from-json FILE|-`` (the record's JSON fields), make one spec; set replaces only the
fields it names. ``--port [name:]PORT[/PROTO][:TARGET][:NODEPORT]`` (TARGET a number or a
container port's name; an empty TARGET is PORT). Store options, ``--output`` and the error
exit are those of `pycni ipam` (``cli.command``).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from cli.command import Env, Failed, command_options
from cli.open_store import load_config
from cli.output import cell_text, render_table
from services.record import DEFAULT_NODE_PORT_RANGE

if TYPE_CHECKING:
    from services.proxy.view import Records


def parse_ref(text: str) -> tuple[str, str]:
    namespace, slash, name = text.partition("/")
    if not slash or not namespace or not name or "/" in name:
        raise Failed(f"{text!r} is not NAMESPACE/NAME")
    return namespace, name


def parse_port(text: str) -> dict:
    """One --port value as a spec port (ranges are checked by the spec's validation)."""
    parts = text.split(":")
    port: dict[str, Any] = {}
    if parts[0] and not parts[0][0].isdigit():
        port["name"] = parts.pop(0)
    number, slash, protocol = (parts.pop(0) if parts else "").partition("/")
    if not number.isdigit() or slash and not protocol or len(parts) > 2:
        raise Failed(f"--port {text!r} is not [name:]PORT[/PROTO][:TARGET][:NODEPORT]")
    port["port"] = int(number)
    if protocol:
        port["protocol"] = protocol.upper()
    target = parts.pop(0) if parts else ""
    if target:
        port["targetPort"] = int(target) if target.isdigit() else target
    if parts:
        if not parts[0].isdigit():
            raise Failed(f"--port {text!r}: NODEPORT {parts[0]!r} is not a number")
        port["nodePort"] = int(parts[0])
    return port


def parse_selector(pairs: tuple[str, ...]) -> dict[str, str]:
    selector = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq:
            raise Failed(f"--selector {pair!r} is not KEY=VALUE")
        selector[key] = value
    return selector


def read_json(path: str) -> dict:
    try:
        if path == "-":
            doc = json.load(sys.stdin)
        else:
            with open(path, encoding="utf-8") as file:
                doc = json.load(file)
    except (OSError, ValueError) as exc:
        raise Failed(f"--from-json {path}: {exc}") from None
    if not isinstance(doc, dict):
        raise Failed(f"--from-json {path}: not a JSON object")
    return doc


def calc_spec(opts: dict) -> dict:
    """The spec fields the given flags name (``--from-json`` first, flags over it)."""
    spec = read_json(opts["from_json"]) if opts["from_json"] else {}
    flags = {
        "type": opts["kind"],
        "sessionAffinity": opts["session_affinity"],
        "timeoutSeconds": opts["affinity_timeout"],
        "externalTrafficPolicy": opts["external_traffic_policy"],
        "internalTrafficPolicy": opts["internal_traffic_policy"],
        "healthCheckNodePort": opts["health_check_node_port"],
    }
    spec.update({k: v for k, v in flags.items() if v is not None})
    lists = {
        "ports": [parse_port(p) for p in opts["port"]],
        "clusterIPs": list(opts["cluster_ip"]),
        "externalIPs": list(opts["external_ip"]),
        "loadBalancerIPs": list(opts["load_balancer_ip"]),
        "loadBalancerSourceRanges": list(opts["load_balancer_source_range"]),
        "selector": parse_selector(opts["selector"]),
    }
    spec.update({k: v for k, v in lists.items() if v})
    return spec


def spec_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    for decorator in reversed(
        [
            click.option(
                "--type", "kind", type=click.Choice(["ClusterIP", "NodePort", "LoadBalancer"])
            ),
            click.option(
                "--port", multiple=True, metavar="[NAME:]PORT[/PROTO][:TARGET][:NODEPORT]"
            ),
            click.option("--selector", multiple=True, metavar="KEY=VALUE"),
            click.option("--cluster-ip", multiple=True, metavar="IP", help="at most one a family"),
            click.option("--external-ip", multiple=True, metavar="IP"),
            click.option(
                "--load-balancer-ip",
                multiple=True,
                metavar="IP",
                help="a load balancer ingress IP",
            ),
            click.option(
                "--load-balancer-source-range",
                multiple=True,
                metavar="CIDR",
                help="only clients of these reach the load balancer IPs",
            ),
            click.option("--session-affinity", type=click.Choice(["None", "ClientIP"])),
            click.option("--affinity-timeout", type=int, metavar="S"),
            click.option("--external-traffic-policy", type=click.Choice(["Cluster", "Local"])),
            click.option("--internal-traffic-policy", type=click.Choice(["Cluster", "Local"])),
            click.option(
                "--health-check-node-port",
                type=int,
                metavar="PORT",
                help="ETP Local: the port pycnid answers /healthz on (default: allocated)",
            ),
            click.option("--from-json", metavar="FILE|-", help="the spec as JSON"),
        ]
    ):
        fn = decorator(fn)
    return fn


@click.group(name="svc")
def command() -> None:
    """Services: virtual IPs and nodePorts, served by the proxy in pycnid."""


@command.group(name="config")
def svc_config() -> None:
    """The cluster's service CIDRs and nodePort range."""


@svc_config.command(name="set")
@click.option("--cidr", "cidrs", multiple=True, required=True, help="at most one a family")
@click.option(
    "--node-port-range",
    default="-".join(map(str, DEFAULT_NODE_PORT_RANGE)),
    show_default=True,
    metavar="A-B",
)
@command_options
def config_set(env: Env, cidrs: tuple[str, ...], node_port_range: str) -> None:
    """Set the service CIDRs VIPs are allocated from, and the nodePort range."""
    from services.ops.edit import set_settings

    env.emit(set_settings(env.store(), list(cidrs), node_port_range), render_settings)


@svc_config.command(name="show")
@command_options
def config_show(env: Env) -> None:
    from services.ops.edit import show_settings

    env.emit(show_settings(env.store()), render_settings)


@command.command(name="create")
@click.argument("ref", metavar="NS/NAME")
@spec_options
@command_options
def svc_create(env: Env, ref: str, **opts: Any) -> None:
    """Create a Service; clusterIPs and nodePorts not given are allocated."""
    from services.ops.edit import create

    refuse_from_kube(env, "pycni svc create")
    namespace, name = parse_ref(ref)
    spec = calc_spec(opts)
    for field, value in (("namespace", namespace), ("name", name)):
        if spec.setdefault(field, value) != value:
            raise Failed(f"--from-json names {field} {spec[field]!r}, not {value!r}")
    env.emit(create(env.store(), spec), render_service)


@command.command(name="set")
@click.argument("ref", metavar="NS/NAME")
@spec_options
@command_options
def svc_set(env: Env, ref: str, **opts: Any) -> None:
    """Change the fields given; allocations stay unless the change names new ones."""
    from services.ops.edit import change

    refuse_from_kube(env, "pycni svc set")
    env.emit(change(env.store(), *parse_ref(ref), calc_spec(opts)), render_service)


@command.command(name="rm")
@click.argument("ref", metavar="NS/NAME")
@command_options
def svc_rm(env: Env, ref: str) -> None:
    """Remove a Service, freeing its VIPs and nodePorts."""
    from services.ops.edit import remove

    refuse_from_kube(env, "pycni svc rm")
    env.emit(remove(env.store(), *parse_ref(ref)), render_rm)


@command.command(name="ls")
@command_options
def svc_ls(env: Env) -> None:
    """The Services (from the Kubernetes API when pycnid's config has that source)."""
    from services.ops.edit import list_services
    from services.ops.kube import list_kube_services

    records = kube_records(env)
    doc = list_kube_services(records) if records else list_services(env.store())
    env.emit(doc, render_list)


@command.command(name="show")
@click.argument("ref", metavar="NS/NAME")
@command_options
def svc_show(env: Env, ref: str) -> None:
    from services.ops.edit import show
    from services.ops.kube import show_kube

    records = kube_records(env)
    doc = show_kube(records, *parse_ref(ref)) if records else show(env.store(), *parse_ref(ref))
    env.emit(doc, render_service)


@command.command(name="endpoints")
@click.argument("ref", metavar="NS/NAME")
@command_options
def svc_endpoints(env: Env, ref: str) -> None:
    """The endpoints whose labels match the Service's selector, with their ports."""
    from services.ops.edit import endpoints
    from services.ops.kube import kube_endpoints

    records, ref_parts = kube_records(env), parse_ref(ref)
    doc = kube_endpoints(records, *ref_parts) if records else endpoints(env.store(), *ref_parts)
    env.emit(doc, render_endpoints)


@command.group(name="endpoint")
def svc_endpoint() -> None:
    """One Pod's endpoint conditions (ready, serving, terminating)."""


def parse_pod(text: str) -> tuple[str, str]:
    namespace, slash, pod = text.partition("/")
    if not slash or not namespace or not pod or "/" in pod:
        raise Failed(f"{text!r} is not NAMESPACE/POD")
    return namespace, pod


@svc_endpoint.command(name="set")
@click.argument("ref", metavar="NS/POD")
@click.option("--ifname", default=None, help="one attachment (default: every one of the Pod)")
@click.option("--ready/--not-ready", default=None)
@click.option("--serving/--not-serving", default=None)
@click.option("--terminating/--not-terminating", default=None)
@command_options
def endpoint_set(env: Env, ref: str, ifname: str | None, **conditions: bool | None) -> None:
    """Change the conditions given; the proxy sends new connections to ready endpoints, and
    to serving terminating ones only while none is ready."""
    from services.ops.endpoint import set_conditions

    refuse_from_kube(env, "pycni svc endpoint set")
    changes = {k: v for k, v in conditions.items() if v is not None}
    env.emit(set_conditions(env.store(), *parse_pod(ref), ifname, changes), render_conditions)


@svc_endpoint.command(name="drain")
@click.argument("ref", metavar="NS/POD")
@click.option("--ifname", default=None, help="one attachment (default: every one of the Pod)")
@command_options
def endpoint_drain(env: Env, ref: str, ifname: str | None) -> None:
    """Mark terminating before removal: not ready, still serving (no new connections while
    a ready endpoint is left). pycni-svc's DEL removes the record."""
    from services.ops.endpoint import drain

    refuse_from_kube(env, "pycni svc endpoint drain")
    env.emit(drain(env.store(), *parse_pod(ref), ifname), render_conditions)


@command.command(name="trace")
@click.option("--from", "source", required=True, metavar="IP[:PORT]", help="the client")
@click.option("--to", "target", required=True, metavar="VIP:PORT/PROTO", help="where it connects")
@click.option("--node", default=None, help="whose table (default: this node's nodeName)")
@click.option(
    "--iif",
    default=None,
    metavar="IFNAME",
    help="the interface the packet comes in on (what detectLocalMode BridgeInterface asks)",
)
@command_options
def svc_trace(env: Env, source: str, target: str, node: str | None, iif: str | None) -> None:
    """What NODE's Service table does with the packet: entry, verdict, backends, masquerade.
    On this node (the default) NodePorts are traced on the addresses the proxy reads here,
    under the proxy settings of this node's pycnid config; on another node, on what its proxy
    published after its last pass (the answer says which)."""
    from services.ops.trace import render_trace, trace
    from services.proxy.inputs import read_local_addresses

    here = env.config().node_name
    local, config = None, None
    if node in (None, here):
        local, config = read_local_addresses(), load_config(env.opts, sections=True).proxy
    records = kube_records(env)
    doc = trace(env.store(), node or here, source, target, local, config, iif, records)
    env.emit(doc, render_trace)


def kube_records(env: Env) -> Records | None:
    """The proxy's inputs with Services and EndpointSlices from the API server, when pycnid's
    config has the ``kubernetes`` section (None: they are the store's)."""
    from services.ops.kube import read_kube_records

    kube = env.kube()
    return read_kube_records(kube, env.store()) if kube is not None else None


def refuse_from_kube(env: Env, what: str) -> None:
    from services.ops.kube import refuse_edit

    if env.kube() is not None:
        raise refuse_edit(what)


def port_text(port: dict) -> str:
    head = f"{port['name']}:" if port["name"] else ""
    tail = f" nodePort {port['nodePort']}" if port.get("nodePort") else ""
    return f"{head}{port['port']}/{port['protocol']}->{port['targetPort']}{tail}"


def render_rm(doc: dict) -> str:
    freed = [*doc["freed"]["clusterIPs"], *doc["freed"]["nodePorts"]]
    return f"removed {doc['removed']}; freed {', '.join(freed) or 'nothing'}"


def render_settings(doc: dict) -> str:
    settings = doc["settings"]
    if settings is None:
        return "no service settings (pycni svc config set --cidr CIDR)"
    return f"cidrs: {', '.join(settings['cidrs'])}\nnodePortRange: {settings['nodePortRange']}"


def render_list(doc: dict) -> str:
    bad = [f"unreadable record {key} (pycni svc rm removes it)" for key in doc["unreadable"]]
    if not doc["services"]:
        return "\n".join(["no services", *bad])
    return "\n".join(
        [
            render_table(
                ("SERVICE", "TYPE", "CLUSTER-IPS", "EXTERNAL-IPS", "PORTS", "SELECTOR"),
                [
                    [
                        f"{s['namespace']}/{s['name']}",
                        s["type"],
                        ",".join(s["clusterIPs"]) or None,
                        ",".join([*s["externalIPs"], *s.get("loadBalancerIPs", ())]) or None,
                        " ".join(map(port_text, s["ports"])),
                        ",".join(f"{k}={v}" for k, v in s["selector"].items()) or None,
                    ]
                    for s in doc["services"]
                ],
            ),
            *bad,
        ]
    )


LOAD_BALANCER = ("loadBalancerIPs", "loadBalancerSourceRanges")


def render_service(doc: dict) -> str:
    svc = doc["service"]
    lines = [f"service {svc['namespace']}/{svc['name']} ({svc['type']})"]
    svc = {
        "loadBalancerIPs": [],
        "loadBalancerSourceRanges": [],
        **svc,
        "selector": [f"{k}={v}" for k, v in svc["selector"].items()],
    }
    lines += [
        f"  {key}: {cell_text(svc[key])}"
        for key in (
            "clusterIPs",
            "externalIPs",
            *(LOAD_BALANCER if svc["type"] == "LoadBalancer" else ()),
            "selector",
            "sessionAffinity",
            "externalTrafficPolicy",
            "internalTrafficPolicy",
        )
    ]
    if svc.get("healthCheckNodePort"):
        lines.append(f"  healthCheckNodePort: {svc['healthCheckNodePort']}")
    lines += [f"  port {port_text(p)}" for p in svc["ports"]]
    if "endpointCount" in doc:
        lines.append(f"  endpoints: {doc['endpointCount']}")
    return "\n".join(lines)


def conditions_text(e: dict) -> str:
    """ready,serving,terminating as a row shows them ("-": none holds)."""
    return ",".join(c for c in ("ready", "serving", "terminating") if e[c]) or "-"


def render_endpoints(doc: dict) -> str:
    if not doc["endpoints"]:
        return f"{doc['service']}: no endpoints match its selector"
    return render_table(
        ("POD", "IFNAME", "IPS", "NODE", "PORTS", "CONDITIONS"),
        [
            [
                f"{e['namespace']}/{e['pod']}",
                e["ifname"],
                ",".join(e["ips"]),
                e["node"] or None,
                ",".join(f"{k}={v}" for k, v in e["ports"].items()),
                conditions_text(e),
            ]
            for e in doc["endpoints"]
        ],
    )


def render_conditions(doc: dict) -> str:
    return render_table(
        ("POD", "IFNAME", "IPS", "NODE", "CONDITIONS"),
        [
            [
                f"{e['namespace']}/{e['pod']}",
                e["ifname"],
                ",".join(e["ips"]),
                e["node"] or None,
                conditions_text(e),
            ]
            for e in doc["endpoints"]
        ],
    )
