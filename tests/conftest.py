"""Settings for every test directory."""

from __future__ import annotations

from hypothesis import HealthCheck, settings

# The property tests check results, not speed: on a machine busy with other work (CI
# shares its two cores with the brokers and servers of the integration tests) an example
# can take longer than hypothesis's 200 ms deadline, and a test then failed for that alone.
settings.register_profile("limitflow", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("limitflow")
