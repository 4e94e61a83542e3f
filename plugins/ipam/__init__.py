"""pycni-ipam: netconf ranges, requested IPs, the handler over the lease service."""
