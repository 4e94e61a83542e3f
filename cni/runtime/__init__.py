"""A libcni-compatible CNI runtime: conflist loading, plugin exec, the result cache, and
ADD/CHECK/DEL/GC/STATUS over a list. Standard library only (plus `cni.spec`)."""

from __future__ import annotations

from cni.runtime.chain import Runtime
from cni.runtime.conflist import NetworkConfigList, PluginConf, load_network_conf
from cni.runtime.errors import PluginFailed
from cni.runtime.inject import RuntimeConf

__all__ = [
    "Runtime",
    "RuntimeConf",
    "NetworkConfigList",
    "PluginConf",
    "PluginFailed",
    "load_network_conf",
]
