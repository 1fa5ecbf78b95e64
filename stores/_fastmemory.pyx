# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""The memory store's read and write, compiled: ``stores.memory``'s ``_read`` and
``_write`` loops, its bucket packing and its event records' header, in C.

``stores.memory`` is the reference and what runs without a C compiler; this is a twin of
its hot loops, used when the extension is built, with the same layout (a bucket is
``<6q``: count, amount, version, period_end, expires_at, born; an event record starts
with ``<2q``: version, expires_at; -2**63 stands for None) and the same checks, in the
same order, with the same errors. ``tests/unit/test_memory_fast.py`` runs the same
commits both ways and compares what is stored and what is raised. Attributes are read
in their slots (``handlers._slots.Field``).
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.stdint cimport INT64_MIN, int64_t
from libc.string cimport memcpy

import struct

from handlers._slots cimport Field

from handlers.state import Account, Bucket, EventRecord, Keys, Snapshot, Writes
from limitflow.errors import ConflictError
from stores.base import Expected, key_hint

cdef int64_t _NONE = INT64_MIN
"""None in a packed integer field (every real value is larger)."""

ctypedef struct _Row:
    int64_t count
    int64_t amount
    int64_t version
    int64_t period_end
    int64_t expires_at
    int64_t born

ctypedef struct _Header:
    int64_t version
    int64_t expires_at

cdef Field _B_COUNT = Field(Bucket, "count")
cdef Field _B_AMOUNT = Field(Bucket, "amount")
cdef Field _B_VERSION = Field(Bucket, "version")
cdef Field _B_PERIOD_END = Field(Bucket, "period_end")
cdef Field _B_EXPIRES_AT = Field(Bucket, "expires_at")
cdef Field _B_BORN = Field(Bucket, "born")
cdef Field _A_SEQ = Field(Account, "seq")
cdef Field _A_VERSION = Field(Account, "version")
cdef Field _R_FINGERPRINT = Field(EventRecord, "fingerprint")
cdef Field _R_ACCOUNT = Field(EventRecord, "account_id")
cdef Field _R_TYPE = Field(EventRecord, "type")
cdef Field _R_ACCEPTED = Field(EventRecord, "accepted")
cdef Field _R_SEQ = Field(EventRecord, "seq")
cdef Field _R_VERDICT = Field(EventRecord, "verdict")
cdef Field _R_AMOUNT = Field(EventRecord, "amount")
cdef Field _R_CURRENCY = Field(EventRecord, "currency")
cdef Field _R_REVERSED = Field(EventRecord, "reversed")
cdef Field _R_BUCKETS = Field(EventRecord, "buckets")
cdef Field _R_OCCURRED = Field(EventRecord, "occurred")
cdef Field _R_VERSION = Field(EventRecord, "version")
cdef Field _R_EXPIRES_AT = Field(EventRecord, "expires_at")
cdef Field _R_BORN = Field(EventRecord, "born")
cdef Field _W_BUCKETS = Field(Writes, "buckets")
cdef Field _W_ACCOUNTS = Field(Writes, "accounts")
cdef Field _W_EVENTS = Field(Writes, "events")
cdef Field _X_BUCKETS = Field(Expected, "buckets")
cdef Field _X_EVENTS = Field(Expected, "events")
cdef Field _K_BUCKETS = Field(Keys, "buckets")
cdef Field _K_ACCOUNTS = Field(Keys, "accounts")
cdef Field _K_EVENTS = Field(Keys, "events")
cdef Field _S_BUCKETS = Field(Snapshot, "buckets")
cdef Field _S_ACCOUNTS = Field(Snapshot, "accounts")
cdef Field _S_EVENTS = Field(Snapshot, "events")


def slot_fields():
    """Whether every attribute above is read in its slot (as ``_fastcore.slot_fields``)."""
    fields = [
        _B_COUNT, _B_AMOUNT, _B_VERSION, _B_PERIOD_END, _B_EXPIRES_AT, _B_BORN, _A_SEQ,
        _A_VERSION,
        _R_FINGERPRINT, _R_ACCOUNT, _R_TYPE, _R_ACCEPTED, _R_SEQ, _R_VERDICT, _R_AMOUNT,
        _R_CURRENCY, _R_REVERSED, _R_BUCKETS, _R_OCCURRED, _R_VERSION, _R_EXPIRES_AT, _R_BORN,
        _W_BUCKETS, _W_ACCOUNTS, _W_EVENTS, _X_BUCKETS, _X_EVENTS, _K_BUCKETS, _K_ACCOUNTS,
        _K_EVENTS, _S_BUCKETS, _S_ACCOUNTS, _S_EVENTS,
    ]
    return {f"{f.owner_type.__name__}.{f.name}": f.offset >= 0 for f in fields}


cdef inline int64_t _packed(object value) except? -1:
    """A field of a packed record: None as _NONE (OverflowError past 64 bits)."""
    return _NONE if value is None else <int64_t>value


cdef inline object _unpacked(int64_t value):
    return None if value == _NONE else value


cdef inline object _copy_account(object account):
    """``account.copy()``: built here for an Account (its method is Python code)."""
    if type(account) is Account:
        return Account(_A_SEQ.get(account), _A_VERSION.get(account))
    return account.copy()


cdef bytes _pack_bucket(object b):
    cdef _Row row
    row.count = _B_COUNT.get(b)
    row.amount = _B_AMOUNT.get(b)
    row.version = _B_VERSION.get(b)
    row.period_end = _packed(_B_PERIOD_END.get(b))
    row.expires_at = _packed(_B_EXPIRES_AT.get(b))
    row.born = _B_BORN.get(b)
    return PyBytes_FromStringAndSize(<char*>&row, sizeof(_Row))


cdef int _row(bytes packed, _Row* row) except -1:
    if PyBytes_GET_SIZE(packed) != sizeof(_Row):
        raise struct.error(f"unpack requires a buffer of {sizeof(_Row)} bytes")
    memcpy(row, PyBytes_AS_STRING(packed), sizeof(_Row))
    return 0


def pack_bucket(b):
    """``stores.memory._pack_bucket``."""
    return _pack_bucket(b)


def unpack_bucket(bytes packed):
    """``stores.memory._unpack_bucket``."""
    return _unpack_bucket(packed)


cdef object _unpack_bucket(bytes packed):
    cdef _Row row
    _row(packed, &row)
    return Bucket(
        row.count,
        row.amount,
        row.version,
        _unpacked(row.period_end),
        _unpacked(row.expires_at),
        row.born,
    )


cdef int _check(object key, bint stored, object held_version, object held_expires_at,
                object version, object expires_at) except -1:
    """``stores.memory._check``: raise ``ConflictError`` unless the stored record (its
    version and expiry; ``stored`` false when absent) is the one a write of ``version``
    replaces."""
    if not stored:
        if version == 1:
            return 0
    elif held_version == version - 1 and held_expires_at == expires_at:
        return 0
    raise ConflictError(f"{key_hint(key)} changed since it was read")


cdef bytes _SHAPED = b"\x02"


cdef bytes _pack_event(object record, object encode, object compress, object shapes):
    """``stores.memory.Codec.pack``: the header, then ``_SHAPED`` and ``encode(fields)``
    with the verdict packed by ``shapes``, or ``compress(encode(fields))``."""
    cdef _Header header
    cdef bytes frame
    born = _R_BORN.get(record)
    verdict = _R_VERDICT.get(record)
    shaped = None if shapes is None else shapes.pack(verdict)
    doc = encode(
        (
            _R_FINGERPRINT.get(record),
            _R_ACCOUNT.get(record),
            _R_TYPE.get(record),
            _R_ACCEPTED.get(record),
            _R_SEQ.get(record),
            verdict if shaped is None else shaped,
            _R_AMOUNT.get(record),
            _R_CURRENCY.get(record),
            _R_REVERSED.get(record),
            _R_BUCKETS.get(record),
            _R_OCCURRED.get(record),
            born or (),
        )
    )
    header.version = _R_VERSION.get(record)
    header.expires_at = _packed(_R_EXPIRES_AT.get(record))
    cdef Py_ssize_t tag = 0 if shaped is None else 1
    frame = compress(doc) if shaped is None else doc
    cdef Py_ssize_t size = PyBytes_GET_SIZE(frame)
    cdef bytes out = PyBytes_FromStringAndSize(NULL, sizeof(_Header) + tag + size)
    cdef char* at = PyBytes_AS_STRING(out)
    memcpy(at, &header, sizeof(_Header))
    if tag:
        at[sizeof(_Header)] = PyBytes_AS_STRING(_SHAPED)[0]
    memcpy(at + sizeof(_Header) + tag, PyBytes_AS_STRING(frame), size)
    return out


def write(dict buckets, dict accounts, dict events, writes, expected, encode, codec_for):
    """``MemoryStore._write`` after its round trip is counted: check every record, then
    store them all, or raise ``ConflictError`` with nothing changed. Event records are
    packed as ``Codec.pack`` does, with ``encode`` and the compressor and shapes of
    ``codec_for()`` (called once the checks have passed, as ``_write`` makes the store's
    codec then)."""
    cdef dict w_buckets = _W_BUCKETS.get(writes)
    cdef dict w_accounts = _W_ACCOUNTS.get(writes)
    cdef dict w_events = _W_EVENTS.get(writes)
    cdef dict x_buckets = _X_BUCKETS.get(expected)
    cdef dict x_events = _X_EVENTS.get(expected)
    cdef _Row row
    cdef _Header header
    cdef bytes packed
    # check everything before changing anything: all or nothing
    for key, account in w_accounts.items():
        stored = accounts.get(key)
        if stored is None:
            _check(key, False, None, None, _A_VERSION.get(account), None)
        else:
            _check(key, True, _A_VERSION.get(stored), None, _A_VERSION.get(account), None)
    for key, bucket in w_buckets.items():
        packed = buckets.get(key)
        if packed is None:
            _check(key, False, None, None, _B_VERSION.get(bucket), x_buckets[key])
        else:
            _row(packed, &row)
            _check(
                key,
                True,
                row.version,
                _unpacked(row.expires_at),
                _B_VERSION.get(bucket),
                x_buckets[key],
            )
    for key, record in w_events.items():
        packed = events.get(key)
        if packed is None:
            _check(key, False, None, None, _R_VERSION.get(record), x_events[key])
        else:
            if PyBytes_GET_SIZE(packed) < sizeof(_Header):
                raise struct.error(
                    f"unpack_from requires a buffer of at least {sizeof(_Header)} bytes"
                )
            memcpy(&header, PyBytes_AS_STRING(packed), sizeof(_Header))
            _check(
                key,
                True,
                header.version,
                _unpacked(header.expires_at),
                _R_VERSION.get(record),
                x_events[key],
            )
    for key, bucket in w_buckets.items():
        buckets[key] = _pack_bucket(bucket)
    for key, account in w_accounts.items():
        accounts[key] = _copy_account(account)  # the caller keeps changing its records
    if w_events:
        codec = codec_for()
        compress, shapes = codec.compress, codec.shapes
        for key, record in w_events.items():
            events[key] = _pack_event(record, encode, compress, shapes)


def read(dict buckets, dict accounts, dict events, keys, unpack):
    """``MemoryStore._read`` after its round trip is counted; event records are read
    with ``unpack`` (the codec's; None: the store holds none yet)."""
    snapshot = Snapshot()
    cdef dict s_buckets = _S_BUCKETS.get(snapshot)
    cdef dict s_accounts = _S_ACCOUNTS.get(snapshot)
    cdef dict s_events = _S_EVENTS.get(snapshot)
    for key in _K_BUCKETS.get(keys):
        packed = buckets.get(key)
        if packed is not None:
            s_buckets[key] = _unpack_bucket(packed)
    for key in _K_ACCOUNTS.get(keys):
        account = accounts.get(key)
        if account is not None:
            s_accounts[key] = _copy_account(account)
    if unpack is not None:
        for key in _K_EVENTS.get(keys):
            record = events.get(key)
            if record is not None:
                s_events[key] = unpack(record)
    return snapshot
