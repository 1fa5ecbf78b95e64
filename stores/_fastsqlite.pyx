# cython: language_level=3, boundscheck=False, wraparound=False
"""The sqlite store's row building, compiled: ``stores.sqlite``'s ``rows`` and
``buckets_into``, in C.

``stores.sqlite`` is the reference and what runs without a C compiler; these are twins
of its two per-record Python loops (the statements' parameters of a commit; the buckets
of a read), which took ~3 us an event of a replay. ``tests/unit/test_sqlite_fast.py``
builds the rows of decided streams both ways and compares them. Attributes are read in
their slots (``handlers._slots.Field``).
"""

from handlers._slots cimport Field

from handlers.state import Account, Bucket, EventRecord
from schemas.events import EventType
from stores.base import DamagedRecord, key_hint

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

cdef dict _TYPE_TEXT = {kind: kind.value for kind in EventType}
"""An event type's text (``.value`` of an enum is a Python-level property)."""


def slot_fields():
    """Whether every attribute above is read in its slot (as ``_fastcore.slot_fields``)."""
    fields = [
        _B_COUNT, _B_AMOUNT, _B_VERSION, _B_PERIOD_END, _B_EXPIRES_AT, _B_BORN, _A_SEQ,
        _A_VERSION, _R_FINGERPRINT, _R_ACCOUNT, _R_TYPE, _R_ACCEPTED, _R_SEQ, _R_VERDICT,
        _R_AMOUNT, _R_CURRENCY, _R_REVERSED, _R_BUCKETS, _R_OCCURRED, _R_VERSION,
        _R_EXPIRES_AT, _R_BORN,
    ]
    return {f"{f.owner_type.__name__}.{f.name}": f.offset >= 0 for f in fields}


def rows(dict buckets, dict accounts, dict events, dict expected_buckets,
         dict expected_events, pack, json_text):
    """``stores.sqlite.rows``: the parameters of a commit's six statements."""
    cdef list fresh_b = [], old_b = [], fresh_a = [], old_a = [], fresh_e = [], old_e = []
    cdef tuple row
    for k, b in buckets.items():
        version = _B_VERSION.get(b)
        if version == 1:
            fresh_b.append(
                (
                    k,
                    _B_COUNT.get(b),
                    _B_AMOUNT.get(b),
                    _B_PERIOD_END.get(b),
                    _B_EXPIRES_AT.get(b),
                    _B_BORN.get(b),
                )
            )
        elif version > 1:
            old_b.append(
                (
                    _B_COUNT.get(b),
                    _B_AMOUNT.get(b),
                    version,
                    _B_PERIOD_END.get(b),
                    _B_EXPIRES_AT.get(b),
                    _B_BORN.get(b),
                    k,
                    version - 1,
                    expected_buckets[k],
                )
            )
    for k, a in accounts.items():
        version = _A_VERSION.get(a)
        if version == 1:
            fresh_a.append((k, _A_SEQ.get(a)))
        elif version > 1:
            old_a.append((_A_SEQ.get(a), version, k, version - 1))
    for k, r in events.items():
        kind = _R_TYPE.get(r)
        text = _TYPE_TEXT.get(kind)
        born = _R_BORN.get(r)
        version = _R_VERSION.get(r)
        row = (
            _R_FINGERPRINT.get(r),
            _R_ACCOUNT.get(r),
            kind.value if text is None else text,
            int(_R_ACCEPTED.get(r)),
            _R_SEQ.get(r),
            pack(_R_VERDICT.get(r)),
            _R_AMOUNT.get(r),
            _R_CURRENCY.get(r),
            _R_REVERSED.get(r),
            json_text(_R_BUCKETS.get(r)),
            _R_OCCURRED.get(r),
            version,
            _R_EXPIRES_AT.get(r),
            json_text(born) if born else None,
            k,
        )
        if version == 1:
            fresh_e.append(row)
        elif version > 1:
            old_e.append(row + (version - 1, expected_events[k]))
    return fresh_b, old_b, fresh_a, old_a, fresh_e, old_e


def buckets_into(rows, dict out):
    """``stores.sqlite.buckets_into``: each ``buckets`` row read as a Bucket in ``out``."""
    cdef tuple row
    for found in rows:
        row = <tuple?>found
        if len(row) != 7:  # (the statement selects seven columns)
            raise DamagedRecord(f"a buckets row of {len(row)} columns")
        count, amount, version, period_end, expires_at, born = row[1:]
        if not (
            type(count) is int and type(amount) is int and type(version) is int
            and count >= 0 and amount >= 0
            and (period_end is None or type(period_end) is int)
            and (expires_at is None or type(expires_at) is int)
            and (born is None or type(born) is int)
        ):
            raise DamagedRecord(f"{key_hint(row[0])}: a row that is not a bucket's")
        out[row[0]] = Bucket(count, amount, version, period_end, expires_at, born or 0)


def event_row_ok(tuple row):
    """``stores.sqlite.event_row_ok``, compiled."""
    accepted = row[4]
    expires_at = row[13]
    return (
        type(row[5]) is int
        and type(row[7]) is int
        and type(row[9]) is int
        and type(row[11]) is int
        and type(row[12]) is int
        and type(accepted) is int
        and (accepted == 0 or accepted == 1)
        and (expires_at is None or type(expires_at) is int)
    )
