"""Services in the store: the records, input validation, VIP and nodePort allocation, and
which endpoints a selector picks. The proxy (``proxy/``) and `pycni svc` build on it."""
