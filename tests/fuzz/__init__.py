"""Generated-input tests (hypothesis): what an executable and pycnid read, and random
ADD/CHECK/DEL/GC sequences. `make test` runs a few hundred cases, `make fuzz` at least 10,000
(profile chosen by PYCNI_FUZZ_PROFILE, see budget.py)."""
