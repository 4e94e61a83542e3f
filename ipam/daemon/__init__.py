"""pycnid, the node daemon."""
