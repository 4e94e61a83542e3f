"""The outage buffer: addresses held per node and pool so ADD is served while etcd is away, the
journal under stateDir, and its replay when etcd returns."""
