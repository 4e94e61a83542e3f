"""What `pycni svc` runs: Service edits in the store and the trace over the proxy's inputs."""
