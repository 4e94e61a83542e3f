"""The Kubernetes API as a source: list and watch objects from the API server (mechanism)."""
