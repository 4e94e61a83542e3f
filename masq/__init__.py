"""pycni-masq: the one owner of the masquerade table (the bridge's ipMasq, the overlay's pod
CIDRs)."""
