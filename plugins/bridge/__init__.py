"""pycni-bridge: the handler and its named ADD steps."""
