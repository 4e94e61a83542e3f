"""The kinds pycnid reads from the API server: where each is listed and watched (all
namespaces), and what RBAC must grant for it (``list`` and ``watch``, nothing else)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Kind:
    kind: str  # "Service"
    resource: str  # "services": RBAC's name and the path's last segment
    group: str = ""  # "" is the core group
    version: str = "v1"

    @property
    def path(self) -> str:
        """The collection across every namespace."""
        base = f"/api/{self.version}" if not self.group else f"/apis/{self.group}/{self.version}"
        return f"{base}/{self.resource}"


SERVICE = Kind("Service", "services")
ENDPOINT_SLICE = Kind("EndpointSlice", "endpointslices", "discovery.k8s.io")
POD = Kind("Pod", "pods")
NAMESPACE = Kind("Namespace", "namespaces")
NETWORK_POLICY = Kind("NetworkPolicy", "networkpolicies", "networking.k8s.io")
#: Every kind pycnid reads: the Service proxy's two and NetworkPolicy's three (Nodes are not
#: read: every node runs pycnid, whose node records give the addresses). The ClusterRole in
#: conf/kubernetes/ grants list and watch on exactly these (tests/unit/test_kube_manifests.py).
KINDS = (SERVICE, ENDPOINT_SLICE, POD, NAMESPACE, NETWORK_POLICY)
