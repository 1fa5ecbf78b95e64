"""The compiled partitioner (``streams._fastkafka``) places every key where aiokafka's
``DefaultPartitioner`` does: one account's verdicts keep landing on one partition, in
order, whichever build publishes them."""

from __future__ import annotations

import pytest
from aiokafka.partitioner import DefaultPartitioner, murmur2  # type: ignore[import-untyped]
from hypothesis import given
from hypothesis import strategies as st

from streams import output
from tests.unit.built import assert_built_after, optional, private

_fastkafka, needs_compiled = optional("streams._fastkafka")


@needs_compiled
@given(st.binary(max_size=300))
def test_murmur2_is_the_java_clients(key: bytes) -> None:
    assert _fastkafka.murmur2(key) == murmur2(key)


@needs_compiled
@given(st.binary(max_size=64), st.integers(min_value=1, max_value=500))
def test_a_key_goes_to_the_default_partitioners_partition(key: bytes, count: int) -> None:
    partitions = list(range(count))
    assert _fastkafka.partition(key, partitions) == DefaultPartitioner()(
        key, partitions, partitions
    )


_JAVA_CLIENT: list[tuple[bytes, int]] = [
    (b"21", -973932308),
    (b"foobar", -790332482),
    (b"a-little-bit-long-string", -985981536),
    (b"a-little-bit-longer-string", -1486304829),
    (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    (b"abc", 479470107),
]
"""The cases of Apache Kafka's ``UtilsTest.testMurmur2`` (the Java client's signed ints)."""


@pytest.mark.parametrize(("key", "expected"), _JAVA_CLIENT)
def test_the_java_clients_own_cases(key: bytes, expected: int) -> None:
    """Whichever build is in use, as the Java client hashes."""

    def signed(value: int) -> int:
        return value - (1 << 32) if value >= 1 << 31 else value

    assert signed(murmur2(key)) == expected
    if _fastkafka is not None:
        assert signed(_fastkafka.murmur2(key)) == expected


@needs_compiled
def test_output_uses_the_compiled_partitioner() -> None:
    assert private(output, "_partition") is _fastkafka.partition
    with pytest.raises(TypeError):
        _fastkafka.partition(None, [0, 1])


@needs_compiled
def test_the_built_extension_is_not_older_than_its_source() -> None:
    """An edit to ``_fastkafka.pyx`` takes effect only once built again."""
    assert_built_after(_fastkafka, "streams/_fastkafka.pyx")
