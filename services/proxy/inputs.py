"""What the proxy programs from besides the store: the node's own addresses.

NodePorts answer on the node record's address and on the node's other global addresses
(``view.calc_node_ips``). Those are read from the kernel of the netns the caller runs in:
pycnid's proxy reads them on every pass, and ``pycni svc trace`` reads them the same way when
it is asked about the node it runs on (the CLI runs in the node's netns, as pycnid does), so
both build the model with ``view.calc_model`` from the very same inputs.
"""

from __future__ import annotations

from kernel.session import node_session


def read_local_addresses() -> tuple[str, ...]:
    """The calling netns' global (scope universe) addresses, as the kernel lists them."""
    with node_session() as ipr:
        return tuple(
            a.get_attr("IFA_ADDRESS")
            for a in ipr.get_addr()
            if a["scope"] == 0 and a.get_attr("IFA_ADDRESS")
        )
