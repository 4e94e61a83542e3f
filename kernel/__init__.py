"""Netlink and kernel mechanisms (pyroute2, sysctl, nftables). No CNI policy here."""
