"""Every key of the store: the prefixes and the key builders (pure, no I/O).

This module is the one place a key is spelled; the records that live under them are their
owners' (``ipam.records``, ``nodes.record``, ``services.record``, ``netpol.record``)::

    /pycni/v1/pools/<pool>                       cidr, blockSize, disabled, nodeSelector, ranges
    /pycni/v1/blocks/<pool>/<block-cidr>         affinity node, allocations {ip: handle id}
    /pycni/v1/handles/<network>/<cid>/<ifname>   the IPs held by one attachment + attributes
    /pycni/v1/affinity/<node>/<pool>/<block-cidr>  index: "this node claimed that block"
    /pycni/v1/nodes/<node>, heartbeats/<node>    node records (overlay fields: ``nodes.record``)
                                                 and their leases (``nodes``)
    /pycni/v1/handles/_vtep/<node>/<device>.v4   a node's VTEP address (a handle like any other)
    /pycni/v1/reaper/suspects/<node>             a node the reaper saw without heartbeat
    /pycni/v1/meta/pools                         bumped by every pool add and rm
    /pycni/v1/meta/access-probe                  never written: pycnid's start-up write check
    /pycni/v1/services/<ns>/<name>               Services (``services.record``)
    /pycni/v1/endpoints/<ns>/<pod>/<ifname>      a Pod's attachment as a Service endpoint
    /pycni/v1/serviceips/<ip>, nodeports/<proto>/<port>  index: "ns/name" holds it
    /pycni/v1/meta/services                      the service CIDRs and the nodePort range
    /pycni/v1/proxyinputs/<node>                 what a node's Service proxy programmed from
    /pycni/v1/netpols/<ns>/<name>                NetworkPolicies, as ``to_dict`` renders them
                                                 with the API's defaults (``netpol.record``)
    /pycni/v1/namespaces/<ns>                    a namespace's labels: {"labels": {...}}

The affinity index is written and deleted in the same txn as its block, so a node finds its
own blocks with one ``keys_only`` range instead of reading every block of the pool.

CIDRs in keys write ``/`` as ``-`` (``10.22.0.0/26`` -> ``10.22.0.0-26``); changing that
encoding would strand every stored row.
"""

from __future__ import annotations

import ipaddress

from store.base import PREFIX

_IPNet = ipaddress.IPv4Network | ipaddress.IPv6Network
POOLS = f"{PREFIX}pools/"
BLOCKS = f"{PREFIX}blocks/"
HANDLES = f"{PREFIX}handles/"
AFFINITY = f"{PREFIX}affinity/"
NODES = f"{PREFIX}nodes/"
HEARTBEATS = f"{PREFIX}heartbeats/"
SUSPECTS = f"{PREFIX}reaper/suspects/"
POOLS_MARKER = f"{PREFIX}meta/pools"
ACCESS_PROBE = f"{PREFIX}meta/access-probe"  # store.etcd.check_access: permission, no write
ROLE_RANGE = PREFIX  # what pycnid's etcd role must cover (readwrite on every key under it)
SERVICES = f"{PREFIX}services/"
ENDPOINTS = f"{PREFIX}endpoints/"
SERVICE_IPS = f"{PREFIX}serviceips/"  # written and deleted in the same txn as their Service
NODE_PORTS = f"{PREFIX}nodeports/"
SERVICES_META = f"{PREFIX}meta/services"
PROXY_INPUTS = f"{PREFIX}proxyinputs/"
NETPOLS = f"{PREFIX}netpols/"
NAMESPACES = f"{PREFIX}namespaces/"
BUFFER_NETWORK = "_buffer"  # handles/_buffer/<node>/<pool>: a node's outage buffer
VTEP_NETWORK = "_vtep"  # handles/_vtep/<node>/<device>: a node's overlay tunnel addresses


def proxy_inputs_key(node: str) -> str:
    return f"{PROXY_INPUTS}{node}"


def netpol_key(namespace: str, name: str) -> str:
    return f"{NETPOLS}{namespace}/{name}"


def namespace_key(namespace: str) -> str:
    return f"{NAMESPACES}{namespace}"


def cidr_key(cidr: _IPNet | str) -> str:
    return str(cidr).replace("/", "-")


def parse_cidr_key(text: str) -> _IPNet:
    address, _, prefix = text.rpartition("-")
    return ipaddress.ip_network(f"{address}/{prefix}")


def pool_key(pool: str) -> str:
    return f"{POOLS}{pool}"


def blocks_prefix(pool: str) -> str:
    return f"{BLOCKS}{pool}/"


def block_key(pool: str, cidr: _IPNet | str) -> str:
    return blocks_prefix(pool) + cidr_key(cidr)


def handles_prefix(network: str) -> str:
    return f"{HANDLES}{network}/"


def affinity_prefix(node: str, pool: str | None = None) -> str:
    return f"{AFFINITY}{node}/" + (f"{pool}/" if pool is not None else "")


def affinity_key(node: str, pool: str, cidr: _IPNet | str) -> str:
    return affinity_prefix(node, pool) + cidr_key(cidr)


def block_affinity_key(node: str, key: str) -> str:
    """The index key of the block stored at ``key`` when ``node`` claimed it."""
    return f"{AFFINITY}{node}/{key[len(BLOCKS) :]}"


def handle_key(handle_id: str) -> str:
    """The key of a handle named as blocks name it (``network/containerID/ifname``)."""
    return f"{HANDLES}{handle_id}"


def is_buffer_handle(handle_id: str) -> bool:
    return handle_id.startswith(f"{BUFFER_NETWORK}/")


def parse_block_key(key: str) -> tuple[str, str]:
    """(pool, block CIDR) of a block key or of an affinity key."""
    head, _, cidr_text = key.rpartition("/")
    return head.rpartition("/")[2], str(parse_cidr_key(cidr_text))
