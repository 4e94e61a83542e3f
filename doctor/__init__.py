"""`pycni doctor`: what pycni left on this node that nothing explains, and its repair."""
