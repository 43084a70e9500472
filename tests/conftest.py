"""pytest configuration shared by the test files."""

from hypothesis import settings

# The property tests check results, not speed (timings live in bench/): no per-example
# deadline, which a loaded machine or a parallel worker (make test: pytest-xdist) can miss.
settings.register_profile("fwht-kv", deadline=None)
settings.load_profile("fwht-kv")
