"""The lease service pycnid runs: leases per attachment, the combiner that merges concurrent ADDs
into one txn, the pool cache and its watch, housekeeping, and the IPAM metrics."""
