"""What the proxy programs from besides the store: the node's own addresses and settings.

NodePorts answer on the node record's address and on the node's other global addresses
(``view.calc_node_ips``). Those are read from the kernel of the netns the caller runs in:
pycnid's proxy reads them on every pass, and ``pycni svc trace`` reads them the same way when
it is asked about the node it runs on (the CLI runs in the node's netns, as pycnid does), so
both build the model with ``view.calc_model`` from the very same inputs.

Asked about another node, the tracer cannot read that node's kernel nor its config: each
node's proxy publishes both (``ProxyInputs`` at ``/pycni/v1/proxyinputs/<node>``) whenever they
change, after the pass that programmed them, and the tracer reads them from there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cni.spec.errors import CNIError
from kernel.session import node_session
from services.proxy.config import ProxyConfig, parse_proxy_config, render_proxy_settings
from store.codec import CorruptRecord, decode, encode


def read_local_addresses() -> tuple[str, ...]:
    """The calling netns' global (scope universe) addresses, as the kernel lists them."""
    with node_session() as ipr:
        return tuple(
            a.get_attr("IFA_ADDRESS")
            for a in ipr.get_addr()
            if a["scope"] == 0 and a.get_attr("IFA_ADDRESS")
        )


@dataclass(frozen=True)
class ProxyInputs:
    """One node's proxy inputs as it last programmed them: ``{"addresses": [...],
    "settings": {<the services section's proxy keys>}, "at": <unix time>}``."""

    addresses: tuple[str, ...]
    config: ProxyConfig
    at: float = 0.0

    def to_bytes(self) -> bytes:
        doc = {
            "addresses": list(self.addresses),
            "settings": render_proxy_settings(self.config),
            "at": self.at,
        }
        return encode(doc)

    @classmethod
    def from_bytes(cls, key: str, raw: bytes) -> ProxyInputs:
        doc: Any = decode(key, raw)
        try:
            addresses = doc["addresses"]
            if not isinstance(addresses, list) or not all(isinstance(a, str) for a in addresses):
                raise TypeError("addresses: a list of strings is expected")
            settings = doc["settings"]
            if not isinstance(settings, dict):
                raise TypeError("settings: an object is expected")
            config = parse_proxy_config({"services": {**settings, "proxy": True}})
            at = doc.get("at", 0.0)
            if isinstance(at, bool) or not isinstance(at, (int, float)):
                raise TypeError("at: a number is expected")
        except (KeyError, TypeError) as exc:
            raise CorruptRecord(f"corrupt proxy inputs {key}", str(exc)) from None
        except CNIError as exc:
            raise CorruptRecord(f"corrupt proxy inputs {key}", exc.msg) from None
        assert config is not None  # proxy is true
        return cls(tuple(addresses), config, float(at))
