"""Helpers every long-running part of pycnid stands on: the loop, the metrics registry."""
