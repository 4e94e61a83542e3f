"""pycni-svc: publishes a Pod attachment as a Service endpoint."""
