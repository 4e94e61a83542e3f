"""What `pycni ipam` runs against the store: inspect, check, show, repair, release and pool edits
(operator tools; the daemon and cni/ never import them)."""
