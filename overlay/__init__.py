"""The multi-node pod network: peers from the node registry, programmed as routes, neighbours and
FDB entries."""
