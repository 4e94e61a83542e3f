"""Names derived from an attachment (network, containerID, ifname), so DEL and GC find what
ADD made without the pod netns or prevResult.

- the host veth: ``veth`` + 11 hex digits of a hash (15 chars, IFNAMSIZ-1);
- the attachment tag: ``<network>/<containerID>/<ifname>`` (or a hashed form when that is too
  long or holds unusual characters), used as the nft element comment and, prefixed with
  ``pycni:``, as the host veth's alias (IFLA_IFALIAS) so GC can tell whose veth it is.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from cni.spec.request import Request

SAFE_PART = re.compile(r"^[A-Za-z0-9_.\-]+$")
MAX_TAG = 120  # nft comments hold at most 128 bytes
ALIAS_PREFIX = "pycni:"


def _digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def network_hash(network: str) -> str:
    return "#" + _digest("network", network)[:10]


@dataclass(frozen=True)
class Attachment:
    network: str
    container_id: str
    ifname: str

    @classmethod
    def of(cls, req: Request) -> Attachment:
        return cls(req.network, req.env.container_id, req.env.ifname)

    @property
    def host_veth(self) -> str:
        return "veth" + _digest(self.network, self.container_id, self.ifname)[:11]

    @property
    def tag(self) -> str:
        parts = (self.network, self.container_id, self.ifname)
        plain = "/".join(parts)
        if len(plain) <= MAX_TAG and all(SAFE_PART.match(p) for p in parts):
            return plain
        return f"{network_hash(self.network)}/{_digest(*parts)[:24]}"

    @property
    def alias(self) -> str:
        return ALIAS_PREFIX + self.tag


def tag_in_network(tag: str, network: str) -> bool:
    """Whether an attachment tag (plain or hashed) belongs to ``network``."""
    return tag.startswith(network + "/") or tag.startswith(network_hash(network) + "/")


def tag_of_alias(alias: str | None) -> str | None:
    if alias and alias.startswith(ALIAS_PREFIX):
        return alias[len(ALIAS_PREFIX) :]
    return None
