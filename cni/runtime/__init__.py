"""A libcni-compatible CNI runtime: conflist loading, plugin exec, the result cache, and
ADD/CHECK/DEL/GC/STATUS over a list. Standard library only (plus `cni.spec`)."""
from __future__ import annotations

from .chain import Runtime
from .conflist import NetworkConfigList, PluginConf, load_network_conf
from .errors import PluginFailed
from .inject import RuntimeConf

__all__ = ["Runtime", "RuntimeConf", "NetworkConfigList", "PluginConf", "PluginFailed",
           "load_network_conf"]
