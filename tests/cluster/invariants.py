"""An independent judge of the IPAM store contents (read over etcd's HTTP gateway, parsed
here from the documented key layout, not with pycni's record classes), used next to
`pycni ipam check`.

    /pycni/v1/blocks/<pool>/<block-cidr>
        {"allocations": {ip: "<network>/<cid>/<ifname>"}, ...}
    /pycni/v1/handles/<network>/<cid>/<ifname>
        {"ips": [{"address", "pool", "block"}], "attributes"}
    /pycni/v1/affinity/<node>/<pool>/<block-cidr>
        index of the blocks a node claimed

``problems()`` lists every broken rule: an address in two handles, a handle address its block
does not record for it, a block allocation whose handle is missing or does not list it, an
address outside its block, a block and its affinity index entry that disagree.
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass, field

BLOCKS = "/pycni/v1/blocks/"
HANDLES = "/pycni/v1/handles/"
AFFINITY = "/pycni/v1/affinity/"


@dataclass
class StoreView:
    blocks: dict[str, dict] = field(default_factory=dict)  # block key -> record
    handles: dict[str, dict] = field(default_factory=dict)  # holder id -> record
    affinity: set[str] = field(default_factory=set)  # "<node>/<pool>/<cidr-key>"

    @classmethod
    def parse(cls, dump: dict[str, tuple[bytes, int]]) -> StoreView:
        view = cls()
        for key, (value, _rev) in dump.items():
            if key.startswith(BLOCKS):
                view.blocks[key] = json.loads(value)
            elif key.startswith(HANDLES):
                view.handles[key[len(HANDLES) :]] = json.loads(value)
            elif key.startswith(AFFINITY):
                view.affinity.add(key[len(AFFINITY) :])
        return view

    def handle_ips(self, holder: str) -> list[str]:
        return [ip["address"].split("/")[0] for ip in self.handles[holder].get("ips") or []]

    def allocations(self) -> dict[str, str]:
        """Every allocated address -> its holder, over all blocks."""
        out: dict[str, str] = {}
        for record in self.blocks.values():
            out.update(record.get("allocations") or {})
        return out

    def pod_handles(self, network: str) -> dict[str, list[str]]:
        """The handles of one network (pods, not the outage buffer) -> their addresses."""
        return {h: self.handle_ips(h) for h in self.handles if h.startswith(f"{network}/")}

    def problems(self) -> list[str]:
        found: list[str] = []
        owner: dict[str, str] = {}
        by_block = {
            (rec.get("pool"), str(ipaddress.ip_network(rec.get("cidr")))): rec
            for rec in self.blocks.values()
        }
        for holder, record in self.handles.items():
            for ip in record.get("ips") or []:
                address = ip["address"].split("/")[0]
                if address in owner:
                    found.append(f"{address} is in two handles: {owner[address]} and {holder}")
                owner[address] = holder
                block = by_block.get((ip.get("pool"), str(ipaddress.ip_network(ip.get("block")))))
                if block is None:
                    found.append(
                        f"{holder}: block {ip.get('block')} of pool {ip.get('pool')} "
                        "does not exist"
                    )
                elif (block.get("allocations") or {}).get(address) != holder:
                    found.append(
                        f"{holder}: block {ip.get('block')} records {address} for "
                        f"{(block.get('allocations') or {}).get(address)!r}"
                    )
        for key, record in self.blocks.items():
            cidr = ipaddress.ip_network(record["cidr"])
            for address, holder in (record.get("allocations") or {}).items():
                if ipaddress.ip_address(address) not in cidr:
                    found.append(f"{key}: {address} is outside the block")
                if holder not in self.handles:
                    found.append(f"{key}: {address} is held by missing handle {holder}")
                elif address not in self.handle_ips(holder):
                    found.append(f"{key}: {address} is not listed by its handle {holder}")
        return found + self.affinity_problems()

    def affinity_problems(self) -> list[str]:
        """Each claimed block has its index entry under its node, and nothing else does."""
        claimed = {
            f"{rec['affinity']}/{rec['pool']}/{rec['cidr'].replace('/', '-')}"
            for rec in self.blocks.values()
            if rec.get("affinity")
        }
        return [
            f"block claimed without an affinity index entry: {e}"
            for e in sorted(claimed - self.affinity)
        ] + [
            f"affinity index entry without its claimed block: {e}"
            for e in sorted(self.affinity - claimed)
        ]
