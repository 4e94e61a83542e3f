"""The Service proxy's pure core: the model, the nftables layout and diffs, the tracer."""
