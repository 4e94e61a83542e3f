"""The multi-node pod network: node namespaces on an underlay, each with its own pycnid on one
etcd."""
