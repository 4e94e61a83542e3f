"""What `pycni netpol` and `pycni ns` run: manifests applied to the store, policies and
namespace labels read and changed, and the tracer over the store's model."""
