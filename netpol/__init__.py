"""Kubernetes NetworkPolicy v1: label selectors, policies parsed as the API server validates
them, and the verdict of a cluster's policies for one connection (pure)."""
