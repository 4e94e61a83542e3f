"""pycni: the store-backed side (IPAM allocator, stores) and the node daemon that hosts
everything."""
