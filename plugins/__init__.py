"""Plugin handlers (policy): run inside pycnid, one object per plugin type."""
