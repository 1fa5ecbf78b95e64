# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""The hot path of ``handlers.decide``, compiled: plan and decide a new payment or reversal.

``handlers.decide`` is the reference and the whole core; this module is a faster twin of
its hot path only (``Decider.plan``, ``Decider._payment`` and ``Decider._reversal``),
used when the extension is built. It writes the verdict's JSON itself, byte for byte
what msgspec writes for the ``Verdict`` struct, instead of building a struct per
applicable rule. Anything else (an event id sent again with another payload) and
anything unusual (a scope or match field that is not a string, a long key, a number past
62 bits, a reversal's amount to read in the original's currency, a bucket not as its
payment left it or of a rule removed or changed to another window since) goes to the
Python path, so the two never differ on an edge case:
``tests/unit/test_fastcore.py`` decides the same streams both ways and compares every
byte. It reads and writes the attributes of the event and of the
state records in their slots (``handlers._slots.Field``), as Python's member descriptors
do, without the attribute lookup each time.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_GetItem, PyDict_SetItem
from cpython.long cimport PyLong_AsLongLongAndOverflow
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF
from cpython.set cimport PySet_Add
from cpython.tuple cimport PyTuple_Check, PyTuple_GET_ITEM, PyTuple_GET_SIZE, PyTuple_SET_ITEM
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcmp, memcpy

from handlers._slots cimport Field

import msgspec

from handlers.periods import window_of
from handlers.state import Account, Bucket, EventRecord, Keys, Snapshot, WorkingState, Writes
from schemas.currencies import MINOR_UNITS
from schemas.events import Event, EventType
from schemas.rules import Window
from schemas.verdicts import Decision, Reason

cdef extern from *:
    """
    /* An instance of a tuple subclass (a NamedTuple) with room for n items, as
       tuple.__new__(cls, items) makes it, without the Python-level call. */
    static PyObject* lf_tuple_of(PyObject* cls, Py_ssize_t n) {
        return ((PyTypeObject*)cls)->tp_alloc((PyTypeObject*)cls, n);
    }
    /* Item i of such a new tuple: a new reference to value. */
    static inline void lf_put(PyObject* t, Py_ssize_t i, PyObject* value) {
        Py_INCREF(value);
        PyTuple_SET_ITEM(t, i, value);
    }
    """
    object lf_tuple_of(object cls, Py_ssize_t n)
    void _put "lf_put" (object t, Py_ssize_t i, object value)

cdef extern from *:
    """
    /* Whether a str holds neither '|' nor a backslash (a scope value a bucket key takes as
       it is, see handlers.decide.escape). */
    static int lf_plain(PyObject* s) {
        Py_ssize_t i, n = PyUnicode_GET_LENGTH(s);
        int kind = PyUnicode_KIND(s);
        const void* data = PyUnicode_DATA(s);
        for (i = 0; i < n; i++) {
            Py_UCS4 ch = PyUnicode_READ(kind, data, i);
            if (ch == '|' || ch == 0x5C) return 0;
        }
        return 1;
    }
    /* The bytes of an ASCII str that JSON takes as they are (no quote, backslash or
       control character), or NULL. */
    static const char* lf_json_ascii(PyObject* s, Py_ssize_t* n) {
        Py_ssize_t i;
        const unsigned char* data;
        if (!PyUnicode_IS_COMPACT_ASCII(s)) return NULL;
        *n = PyUnicode_GET_LENGTH(s);
        data = (const unsigned char*)PyUnicode_DATA(s);
        for (i = 0; i < *n; i++) {
            if (data[i] < 0x20 || data[i] == '"' || data[i] == 0x5C) return NULL;
        }
        return (const char*)data;
    }
    /* a + b: for two ASCII strs (every usual bucket key), made at once, without
       PyNumber_Add's dispatch and PyUnicode_Concat's checks (~350 instructions a key,
       a fifth of planning; ~180 here); any other pair by PyUnicode_Concat. */
    static PyObject* lf_join(PyObject* a, PyObject* b) {
        Py_ssize_t na, nb;
        PyObject* joined;
        if (!PyUnicode_IS_COMPACT_ASCII(a) || !PyUnicode_IS_COMPACT_ASCII(b))
            return PyUnicode_Concat(a, b);
        na = PyUnicode_GET_LENGTH(a);
        nb = PyUnicode_GET_LENGTH(b);
        joined = PyUnicode_New(na + nb, 127);
        if (joined == NULL) return NULL;
        memcpy(PyUnicode_DATA(joined), PyUnicode_DATA(a), na);
        memcpy((char*)PyUnicode_DATA(joined) + na, PyUnicode_DATA(b), nb);
        return joined;
    }
    """
    str lf_join(str a, str b)
    bint lf_plain(str s)
    dict lf_dict_of "_PyDict_NewPresized" (Py_ssize_t n)
    const char* lf_json_ascii(str s, Py_ssize_t* n)

cdef Field _E_TYPE = Field(Event, "type")
cdef Field _E_ID = Field(Event, "event_id")
cdef Field _E_ACCOUNT = Field(Event, "account_id")
cdef Field _E_AMOUNT = Field(Event, "amount")
cdef Field _E_CURRENCY = Field(Event, "currency")
cdef Field _E_OCCURRED_AT = Field(Event, "occurred_at")
cdef Field _E_EPOCH = Field(Event, "epoch")
cdef Field _E_FIELDS = Field(Event, "fields")
cdef Field _E_FINGERPRINT = Field(Event, "fingerprint")
cdef Field _B_COUNT = Field(Bucket, "count")
cdef Field _B_AMOUNT = Field(Bucket, "amount")
cdef Field _B_PERIOD_END = Field(Bucket, "period_end")
cdef Field _A_SEQ = Field(Account, "seq")
cdef Field _W_SNAPSHOT = Field(WorkingState, "snapshot")
cdef Field _W_DIRTY_BUCKETS = Field(WorkingState, "dirty_buckets")
cdef Field _W_DIRTY_ACCOUNTS = Field(WorkingState, "dirty_accounts")
cdef Field _W_DIRTY_EVENTS = Field(WorkingState, "dirty_events")
cdef Field _S_BUCKETS = Field(Snapshot, "buckets")
cdef Field _S_ACCOUNTS = Field(Snapshot, "accounts")
cdef Field _S_EVENTS = Field(Snapshot, "events")
cdef Field _S_EXPIRED = Field(Snapshot, "expired_events")
cdef Field _E_ORIGINAL = Field(Event, "original_event_id")
cdef Field _R_BUCKETS = Field(EventRecord, "buckets")
cdef Field _R_BORN = Field(EventRecord, "born")
cdef Field _B_BORN = Field(Bucket, "born")
cdef Field _R_VERSION = Field(EventRecord, "version")
cdef Field _R_EXPIRES_AT = Field(EventRecord, "expires_at")
cdef Field _E_AMOUNT_DECIMAL = Field(Event, "amount_decimal")
cdef Field _R_TYPE = Field(EventRecord, "type")
cdef Field _R_ACCOUNT = Field(EventRecord, "account_id")
cdef Field _R_ACCEPTED = Field(EventRecord, "accepted")
cdef Field _R_AMOUNT = Field(EventRecord, "amount")
cdef Field _R_CURRENCY = Field(EventRecord, "currency")
cdef Field _R_REVERSED = Field(EventRecord, "reversed")
cdef Field _R_FINGERPRINT = Field(EventRecord, "fingerprint")
cdef Field _R_VERDICT = Field(EventRecord, "verdict")
cdef Field _E_LEGACY = Field(Event, "legacy_fingerprint")
cdef Field _C_FAST = None
"""``_CompiledRule.fast``, set by the first ``FastCore`` (handlers.decide imports this
module before it defines the class)."""


def slot_fields():
    """Whether every attribute of this module is read and written in its slot (for a
    test: a change of msgspec or of a class that left one to ``getattr`` would only be
    slower)."""
    fields = [_E_TYPE, _E_ID, _E_ACCOUNT, _E_AMOUNT, _E_CURRENCY, _E_OCCURRED_AT, _E_EPOCH,
              _E_FIELDS, _E_FINGERPRINT, _B_COUNT, _B_AMOUNT, _B_PERIOD_END, _A_SEQ,
              _W_SNAPSHOT, _W_DIRTY_BUCKETS, _W_DIRTY_ACCOUNTS, _W_DIRTY_EVENTS, _S_BUCKETS,
              _S_ACCOUNTS, _S_EVENTS, _S_EXPIRED, _C_FAST, _E_ORIGINAL, _K_BUCKETS,
              _K_ACCOUNTS, _K_EVENTS, _B_VERSION, _A_VERSION, _R_VERSION, _WR_BUCKETS,
              _WR_ACCOUNTS, _WR_EVENTS, _B_EXPIRES_AT, _B_BORN, _R_OCCURRED, _R_EXPIRES_AT,
              _R_BORN, _R_BUCKETS, _E_AMOUNT_DECIMAL, _R_TYPE, _R_ACCOUNT, _R_ACCEPTED,
              _R_AMOUNT, _R_CURRENCY, _R_REVERSED, _R_FINGERPRINT, _R_VERDICT, _E_LEGACY]
    return {
        f"{f.owner_type.__name__}.{f.name}": f.offset >= 0 for f in fields if f is not None
    }


def json_number(long long value, int exponent, bint quoted):
    """What the verdict writer writes for ``value`` (for a test: ``format_minor`` or
    ``str`` of it, quoted or not)."""
    cdef _Out out = _Out()
    if quoted:
        out.minor(value, exponent)
    else:
        out.integer(value)
    return out.take()


cdef object _PAYMENT = EventType.PAYMENT
cdef object _TRANSACTION = Window.TRANSACTION
cdef object _ACCEPT = Decision.ACCEPT
cdef object _REJECT = Decision.REJECT
cdef object _LIMIT_EXCEEDED = Reason.LIMIT_EXCEEDED
cdef object _ORIGINAL_NOT_FOUND = Reason.ORIGINAL_NOT_FOUND
cdef object _ORIGINAL_NOT_ACCEPTED = Reason.ORIGINAL_NOT_ACCEPTED
cdef object _ALREADY_REVERSED = Reason.ALREADY_REVERSED
cdef object _REVERSAL_EXCEEDS = Reason.REVERSAL_EXCEEDS_ORIGINAL
cdef object _REVERSAL = EventType.REVERSAL
cdef dict _REASONS = {reason.value.encode(): reason for reason in Reason}
cdef object _json_text = msgspec.json.encode

cdef const char* _PAIRS = (
    b"00010203040506070809101112131415161718192021222324252627282930313233343536373839"
    b"40414243444546474849505152535455565758596061626364656667686970717273747576777879"
    b"8081828384858687888990919293949596979899"
)
"""Every two-digit number, in order: the digits of ``n`` at ``2 * n``."""

cdef long long _SMALL = 1LL << 62
"""Python ints the compiled path takes lie in [0, _SMALL); a larger one (possible only
for a bucket of a rule without max_amount) goes to the Python path."""
cdef long long _NO_MINUTE = -(1LL << 62)


cdef inline object _tuple4(object cls, object a, object b, object c, object d):
    cdef object t = lf_tuple_of(cls, 4)
    _put(t, 0, a)
    _put(t, 1, b)
    _put(t, 2, c)
    _put(t, 3, d)
    return t


cdef class _Out:
    """A growing byte buffer for one verdict."""

    cdef char* buf
    cdef Py_ssize_t size
    cdef Py_ssize_t cap

    def __cinit__(self):
        self.cap = 2048
        self.size = 0
        self.buf = <char*>malloc(self.cap)
        if self.buf == NULL:
            raise MemoryError()

    def __dealloc__(self):
        free(self.buf)

    cdef inline int raw(self, const char* data, Py_ssize_t n) except -1:
        memcpy(self.reserve(n), data, n)
        self.size += n
        return 0

    cdef inline int put(self, bytes data) except -1:
        return self.raw(<const char*>data, len(data))

    cdef inline int quoted(self, str data) except -1:
        """A JSON string exactly as msgspec writes it."""
        cdef Py_ssize_t n = 0
        cdef const char* p = lf_json_ascii(data, &n)
        if p == NULL:
            return self.put(_json_text(data))  # escapes, or other scripts: msgspec's own
        self.raw(b'"', 1)
        self.raw(p, n)
        return self.raw(b'"', 1)

    cdef inline char* reserve(self, Py_ssize_t n) except NULL:
        """Room for ``n`` more bytes at the end; the caller writes them and adds what it
        wrote to ``size``."""
        cdef Py_ssize_t cap = self.cap
        cdef char* grown
        if self.size + n > cap:
            while self.size + n > cap:
                cap *= 2
            grown = <char*>realloc(self.buf, cap)
            if grown == NULL:
                raise MemoryError()
            self.buf, self.cap = grown, cap
        return self.buf + self.size

    cdef inline int integer(self, long long value) except -1:
        """A JSON integer; ``value`` > LLONG_MIN."""
        return self._number(value, 0, False)

    cdef inline int minor(self, long long value, int exponent) except -1:
        """``format_minor(value, exponent)`` as a JSON string; ``value`` > LLONG_MIN,
        0 <= ``exponent`` <= 18."""
        return self._number(value, exponent, True)

    cdef inline int _number(self, long long value, int exponent, bint quoted) except -1:
        """``value`` in decimal, the point before its last ``exponent`` digits (at least
        one digit before it), between quotes when ``quoted``; the digits two at a time."""
        cdef char digits[24]
        cdef int n = 0, i
        cdef bint negative = value < 0
        cdef unsigned long long u = <unsigned long long>(-value if negative else value)
        cdef unsigned long long q
        cdef unsigned int pair
        cdef char* at
        cdef Py_ssize_t w = 0
        # right to left
        while u >= 100:
            q = u // 100
            pair = <unsigned int>(u - q * 100) * 2
            digits[22 - n] = _PAIRS[pair]
            digits[23 - n] = _PAIRS[pair + 1]
            n += 2
            u = q
        if u >= 10:
            pair = <unsigned int>u * 2
            digits[22 - n] = _PAIRS[pair]
            digits[23 - n] = _PAIRS[pair + 1]
            n += 2
        else:
            digits[23 - n] = <char>(48 + u)
            n += 1
        while n <= exponent:
            digits[23 - n] = b'0'
            n += 1
        at = self.reserve(n + 4)  # quotes, minus, point
        if quoted:
            at[w] = b'"'
            w += 1
        if negative:
            at[w] = b'-'
            w += 1
        for i in range(24 - n, 24 - exponent):
            at[w] = digits[i]
            w += 1
        if exponent:
            at[w] = b'.'
            w += 1
            for i in range(24 - exponent, 24):
                at[w] = digits[i]
                w += 1
        if quoted:
            at[w] = b'"'
            w += 1
        self.size += w
        return 0

    cdef inline int extend(self, _Out other) except -1:
        return self.raw(other.buf, other.size)

    cdef inline bytes take(self):
        """The bytes so far; the buffer starts again empty."""
        cdef bytes data = PyBytes_FromStringAndSize(self.buf, self.size)
        self.size = 0
        return data


cdef class _Rule:
    """What the compiled path needs of one ``_CompiledRule``."""

    cdef readonly object compiled
    """The ``_CompiledRule`` itself, which ``Applied.rule`` holds."""
    cdef object currency
    cdef object simple_scope
    cdef object absent_as
    cdef tuple scope_fields
    cdef tuple match
    cdef object window
    cdef bint transaction
    cdef object fixed_period
    cdef str prefix
    cdef int clock
    """Index of the rule's zone in ``FastCore.clocks``."""
    cdef long long minute
    cdef object minute_period
    cdef object minute_end
    """The epoch minute whose period of the rule's window is ``minute_period``, ending
    at ``minute_end``, or _NO_MINUTE: kept while events stay in one minute (as
    ``FastCore._periods`` keeps the zone's periods), which saves looking the window up
    in them for every event."""
    cdef object last_period
    cdef str last_head
    """``prefix + last_period + "|"``: the start of its bucket keys in that period."""
    cdef bint has_count
    cdef long long max_count
    cdef bint has_amount
    cdef long long max_amount
    cdef int exponent
    """The rule currency's minor unit, -1 without a currency."""
    cdef bytes limit_head
    cdef object limit_period
    cdef bytes limit_start
    """``limit_head``, ``limit_period`` as JSON and the name after it: how every
    ``LimitState`` of the rule in that period starts, kept while events stay in it."""
    cdef bytes count_middle
    """What follows a ``LimitState``'s ``count_used`` up to its ``amount_used``, when
    its ``count_remaining`` is not written between (``has_count``: up to that)."""
    cdef bytes amount_middle
    """What follows its ``amount_used`` up to its ``amount_remaining`` (without an
    amount currency: from its ``amount_used``, null, to its end)."""
    cdef bytes count_head
    cdef bytes amount_head
    cdef bytes count_limit
    cdef bytes amount_limit
    """``amount_limit`` of the rule's ``LimitState``: null without one."""
    cdef bytes violation_limit
    """``limit`` of an amount violation (the Python path writes "" without one)."""
    cdef bint usable
    """Whether its limits fit the compiled path's integers (always, for valid rules)."""

    def __init__(self, compiled, int clock):
        rule = compiled.rule
        self.compiled = compiled
        self.currency = compiled.currency
        self.simple_scope = compiled.simple_scope
        self.absent_as = compiled.absent_as
        self.scope_fields = compiled.scope_fields
        self.match = compiled.match
        self.window = compiled.window
        self.transaction = compiled.window is _TRANSACTION
        self.fixed_period = compiled.fixed_period
        self.prefix = compiled.prefix
        self.clock = clock
        self.minute = _NO_MINUTE
        self.minute_period = None
        self.minute_end = None
        self.last_period = None
        self.last_head = None
        self.has_count = compiled.max_count is not None
        self.has_amount = compiled.max_amount is not None
        self.exponent = -1 if compiled.amount_exp is None else compiled.amount_exp
        self.usable = (
            (not self.has_count or 0 <= compiled.max_count < _SMALL)
            and (not self.has_amount or 0 <= compiled.max_amount < _SMALL)
            and self.exponent <= 18
        )
        if self.usable:
            self.max_count = compiled.max_count if self.has_count else 0
            self.max_amount = compiled.max_amount if self.has_amount else 0
        head = b'{"rule_id":' + _json_text(rule.id)
        self.limit_head = head + b',"window":' + _json_text(self.window.value) + b',"period":'
        self.limit_period = None
        self.limit_start = None
        self.count_head = head + b',"metric":"count","period":'
        self.amount_head = head + b',"metric":"amount","period":'
        self.count_limit = _json_text(compiled.count_limit_text or "")
        self.amount_limit = (
            b"null" if compiled.max_amount_text is None
            else _json_text(compiled.max_amount_text)
        )
        self.violation_limit = _json_text(compiled.max_amount_text or "")
        if self.has_count and self.usable:
            self.count_middle = (
                b',"count_limit":' + str(self.max_count).encode() + b',"count_remaining":'
            )
        else:
            self.count_middle = b',"count_limit":null,"count_remaining":null,"amount_used":'
        if self.exponent < 0:
            self.amount_middle = (
                b'null,"amount_limit":' + self.amount_limit + b',"amount_remaining":null}'
            )
        else:
            self.amount_middle = b',"amount_limit":' + self.amount_limit + b',"amount_remaining":'


cdef object _stored_reason(object verdict, object reason_in):
    """``reason_in(verdict)``, read where a verdict of this module or of msgspec has it:
    right after ``"decision":"accept"`` or ``"reject"`` near its start (a JSON string
    cannot hold those quotes unescaped, so the first such place is the verdict's own).
    Anything else is left to ``reason_in``, which decodes the whole document."""
    cdef const char* data
    cdef const char* at
    cdef const char* end
    cdef const char* word
    cdef Py_ssize_t n
    if type(verdict) is not bytes:
        return reason_in(verdict)
    data = PyBytes_AS_STRING(verdict)
    n = PyBytes_GET_SIZE(verdict)
    if n < 13 or memcmp(data, b'{"event_id":"', 13) != 0:
        return reason_in(verdict)
    end = data + n
    at = data + 13
    while end - at >= 40 and memcmp(at, b'"decision":"', 12) != 0:
        at += 1
    if end - at < 40:
        return reason_in(verdict)
    at += 12
    if memcmp(at, b'accept",', 8) != 0 and memcmp(at, b'reject",', 8) != 0:
        return reason_in(verdict)
    at += 8
    if memcmp(at, b'"reason":', 9) != 0:
        return reason_in(verdict)
    at += 9
    if memcmp(at, b'null,"seq":', 11) == 0:
        return None
    if at[0] != b'"':
        return reason_in(verdict)
    word = at + 1
    at = word
    while at < end and (b'a' <= at[0] <= b'z' or at[0] == b'_'):
        at += 1
    if end - at < 8 or memcmp(at, b'","seq":', 8) != 0:
        return reason_in(verdict)
    found = _REASONS.get(PyBytes_FromStringAndSize(word, at - word))
    return reason_in(verdict) if found is None else found


cdef inline object _next_seq(object snapshot, object state, object account_id):
    """The account's next verdict sequence number, its record marked to be written
    (``WorkingState.account_for_update``)."""
    cdef dict accounts = _S_ACCOUNTS.get(snapshot)
    account = accounts.get(account_id)
    if account is None:
        account = accounts[account_id] = Account()
    PyDict_SetItem(<dict?>_W_DIRTY_ACCOUNTS.get(state), account_id, account)
    seq = _A_SEQ.get(account) + 1
    _A_SEQ.set(account, seq)
    return seq


cdef inline int _open_verdict(_Out out, object event_id, object account_id, bytes middle,
                              object seq) except -1:
    """A verdict's JSON up to its ``seq``: ``middle`` is what comes between its
    ``account_id`` and that (type, decision and reason)."""
    out.size = 0
    out.raw(b'{"event_id":', 12)
    out.quoted(event_id)
    out.raw(b',"account_id":', 14)
    out.quoted(account_id)
    out.put(middle)
    if type(seq) is int and 0 <= seq < _SMALL:
        return out.integer(seq)
    # what a damaged store may hold: as msgspec writes it (inf as null, …)
    return out.put(_json_text(seq))


cdef inline bytes _close_verdict(_Out out, bytes version, _Out limits):
    """A verdict's JSON from its ``rules_version`` (``version``, as JSON) to its end, and
    the whole of it."""
    out.put(b',"rules_version":')
    out.put(version)
    out.put(b',"limits":[')
    out.extend(limits)
    out.raw(b"]}", 2)
    return out.take()


cdef inline int _put_event(object snapshot, object state, object event_id,
                           object record) except -1:
    """``WorkingState.put_event``: a new idempotency record, in place of the expired one
    (its version and expiry) if one was read."""
    expired = (<dict?>_S_EXPIRED.get(snapshot)).get(event_id)
    if expired is not None:
        _R_VERSION.set(record, expired.version)
        _R_EXPIRES_AT.set(record, expired.expires_at)
    PyDict_SetItem(<dict?>_S_EVENTS.get(snapshot), event_id, record)
    PyDict_SetItem(<dict?>_W_DIRTY_EVENTS.get(state), event_id, record)
    return 0


cdef inline object _outcome(object outcome_type, object kind, object verdict,
                            object decision, object reason):
    """An ``Outcome`` (its error and detail None), as its tuple type makes it."""
    cdef object outcome = lf_tuple_of(outcome_type, 6)
    _put(outcome, 0, kind)
    _put(outcome, 1, verdict)
    _put(outcome, 2, decision)
    _put(outcome, 3, reason)
    _put(outcome, 4, None)
    _put(outcome, 5, None)
    return outcome


def stored_reason(verdict, reason_in):
    """``_stored_reason``, for a test."""
    return _stored_reason(verdict, reason_in)


cdef class FastCore:
    """``Decider.plan`` and ``Decider.decide`` for one rule set, compiled where they can
    be, the Python path's (``python_plan``, ``python_decide``, ``python_payment``)
    elsewhere.

    Like the ``WorkingState`` it changes, not for several threads at once: it keeps the
    buffers of the verdict being written from one payment to the next."""

    cdef tuple rules
    cdef dict by_id
    """Each rule's ``_Rule`` by its id: what a reversal's released buckets explain."""
    cdef dict by_currency
    cdef list clocks
    cdef long long* minutes
    """Per clock: the epoch minute whose periods ``periods`` holds, or _NO_MINUTE."""
    cdef list periods
    cdef bytes version
    cdef object applied_type
    cdef object outcome_type
    cdef object verdict_kind
    cdef object escape
    cdef Py_ssize_t short_key
    cdef long long ceiling
    cdef object python_plan
    cdef object python_decide
    cdef object python_payment
    cdef object duplicate_kind
    cdef object reason_in
    """``OutcomeKind.DUPLICATE``, and what gives the reason a stored verdict names; None:
    resends take the Python path."""
    cdef object index_for
    """What gives the ``RuleIndex`` (of every rule) for a currency's candidates, or None
    to test them in turn (``Decider._index_for``)."""
    cdef _Out head
    cdef _Out violations
    cdef _Out limits
    """Buffers for one verdict's parts, kept from one payment to the next."""

    def __cinit__(self, *args, **kwargs):
        self.minutes = NULL

    def __dealloc__(self):
        free(self.minutes)

    def __init__(self, compiled_rules, version, applied_type, outcome_type, verdict_kind,
                 escape, short_key, ceiling, python_plan, python_decide, python_payment,
                 duplicate_kind=None, reason_in=None, index_for=None):
        global _C_FAST
        cdef Py_ssize_t i
        self.clocks = []
        rules = []
        for c in compiled_rules:
            if _C_FAST is None:
                _C_FAST = Field(type(c), "fast")
            if not any(c.clock is known for known in self.clocks):
                self.clocks.append(c.clock)
            index = next(i for i, known in enumerate(self.clocks) if c.clock is known)
            rule = _Rule(c, index)
            c.fast = rule
            rules.append(rule)
        self.rules = tuple(rules)
        self.by_id = {(<_Rule>r).compiled.rule.id: r for r in rules}
        self.minutes = <long long*>malloc(sizeof(long long) * (len(self.clocks) + 1))
        if self.minutes == NULL:
            raise MemoryError()
        for i in range(len(self.clocks)):
            self.minutes[i] = _NO_MINUTE
        self.periods = [None] * len(self.clocks)
        self.by_currency = {}
        self.version = _json_text(version)
        self.applied_type = applied_type
        self.outcome_type = outcome_type
        self.verdict_kind = verdict_kind
        self.escape = escape
        self.short_key = short_key
        self.ceiling = ceiling
        self.python_plan = python_plan
        self.python_decide = python_decide
        self.python_payment = python_payment
        self.duplicate_kind = duplicate_kind
        self.reason_in = reason_in
        self.index_for = index_for
        self.head, self.violations, self.limits = _Out(), _Out(), _Out()

    cdef tuple _candidates(self, object currency):
        """The rules that can apply to events of a currency, and what the ``RuleIndex``
        holds (``always``, ``tables``, ``scoped``) when their events' candidates are
        found by it, or None."""
        cdef object key = currency or ""
        cdef PyObject* found = PyDict_GetItem(self.by_currency, key)
        if found != NULL:
            return <tuple>found
        chosen = tuple(r for r in self.rules if (<_Rule>r).currency in (None, currency))
        index = (
            None if self.index_for is None or currency is None
            else self.index_for(tuple((<_Rule>r).compiled for r in chosen))
        )
        entry = (chosen, None if index is None else (index.always, index.tables, index.scoped))
        self.by_currency[key] = entry
        return entry

    cdef object _chosen(self, tuple index, dict fields, object currency):
        """``RuleIndex.select`` as the rules themselves, in order; None, for the Python
        path, when a field the rules scope or are indexed by is not a string."""
        cdef object name, value
        cdef PyObject* found_in
        cdef PyObject* filed
        cdef list found
        cdef tuple entry
        cdef dict always = <dict>index[0]
        for name in <tuple>index[2]:
            value = fields.get(name)
            if value is not None and type(value) is not str:
                return None
        found = list(always.get(None, ()))
        found.extend(always.get(currency, ()))
        for entry in <tuple>index[1]:
            value = fields.get(entry[0], entry[1])
            if value is None:
                continue
            if type(value) is not str:
                return None
            for key in (None, currency):
                found_in = PyDict_GetItem(<dict>entry[2], key)
                if found_in != NULL:
                    filed = PyDict_GetItem(<dict>found_in, value)
                    if filed != NULL:
                        found.extend(<tuple>filed)
        found.sort()
        return tuple([self.rules[<Py_ssize_t>position] for position in found])

    cdef tuple _periods(self, int clock, long long epoch):
        """The period keys of ``epoch`` in a clock's zone and their ends
        (``PeriodClock.periods``), kept while events stay in one minute."""
        cdef long long minute = epoch // 60
        if self.minutes[clock] == minute:
            return self.periods[clock]
        zone = self.clocks[clock]
        found = zone.minute_periods(minute)
        if found is None:  # its instants differ: not kept
            self.minutes[clock] = _NO_MINUTE
            return zone.periods(epoch)
        self.minutes[clock] = minute
        self.periods[clock] = found
        return found

    def plan(self, event):
        """``Decider.plan``: here for a payment whose scope and match values are strings
        and whose keys are short, by the Python path for anything else."""
        if _E_TYPE.get(event) is not _PAYMENT:
            return ()
        applied = self._plan(event)
        return self.python_plan(event) if applied is None else applied

    cdef object _plan(self, event):
        """The applied rules of a payment; None, for the Python path, when a scope or
        match value is not a string or a key is long."""
        cdef dict fields = _E_FIELDS.get(event)
        cdef list applied = []
        cdef _Rule r
        cdef object raw, value, tail, period, key, end
        cdef long long epoch, minute
        cdef tuple entry, rules
        cdef object chosen, currency
        cdef list parts
        cdef bint skip
        epoch = _E_EPOCH.get(event)
        minute = epoch // 60
        currency = _E_CURRENCY.get(event)
        entry = self._candidates(currency)
        rules = <tuple>entry[0]
        if entry[1] is not None:
            chosen = self._chosen(<tuple>entry[1], fields, currency)
            if chosen is None:
                return None
            rules = <tuple>chosen
        for r in rules:
            if r.simple_scope is not None:
                raw = fields.get(r.simple_scope, r.absent_as)
                if raw is None:
                    continue
                if type(raw) is not str:
                    return None
                tail = raw if lf_plain(raw) else self.escape(raw)
            else:
                parts = []
                for entry in r.scope_fields:
                    raw = fields.get(entry[0], entry[1])
                    if raw is None:
                        break
                    if type(raw) is not str:
                        return None
                    parts.append(raw if lf_plain(raw) else self.escape(raw))
                else:
                    tail = "|".join(parts)
                    parts = None
                if parts is not None:
                    continue
            if r.match:
                skip = False
                for entry in r.match:
                    value = fields.get(entry[0], entry[2])
                    if value is None:  # matches nothing (the Python path says so too)
                        skip = True
                        break
                    if type(value) is not str:
                        return None
                    if value not in <frozenset>entry[1]:
                        skip = True
                        break
                if skip:
                    continue
            period = r.fixed_period
            end = None  # lifetime: never ends; transaction: no bucket
            if period is None:
                if r.minute == minute:
                    period = r.minute_period
                    end = r.minute_end
                else:
                    found = self._periods(r.clock, epoch)
                    period = (<dict>found[0])[r.window]
                    end = (<dict>found[1])[r.window]
                    if self.minutes[r.clock] == minute:  # the minute's periods: kept
                        r.minute, r.minute_period, r.minute_end = minute, period, end
            if r.transaction:
                applied.append(_tuple4(self.applied_type, r.compiled, period, None, None))
            else:
                if period is not r.last_period:
                    r.last_head = r.prefix + period + "|"
                    r.last_period = period
                key = lf_join(r.last_head, tail)
                if len(key) > self.short_key:
                    return None
                applied.append(_tuple4(self.applied_type, r.compiled, period, key, end))
        return tuple(applied)

    def decide(self, event, tuple applied, state):
        """``Decider.decide``: a new payment or reversal, or a resend of one, here; what
        the compiled path does not take (an event id sent again with another payload)
        by the Python path."""
        cdef PyObject* seen = PyDict_GetItem(
            <dict?>_S_EVENTS.get(_W_SNAPSHOT.get(state)), _E_ID.get(event)
        )
        if seen != NULL:
            if self.reason_in is not None:
                fingerprint = _R_FINGERPRINT.get(<object>seen)
                if (
                    fingerprint == _E_FINGERPRINT.get(event)
                    or fingerprint == _E_LEGACY.get(event)
                ):
                    return self._duplicate(<object>seen)
            return self.python_decide(event, applied, state)
        kind = _E_TYPE.get(event)
        if kind is _PAYMENT:
            outcome = self._payment(event, applied, state)
            if outcome is None:
                return self.python_payment(event, applied, state)
            return outcome
        outcome = self._reversal(event, state) if kind is _REVERSAL else None
        if outcome is None:
            return self.python_decide(event, applied, state)
        return outcome

    cdef object _payment(self, event, tuple applied, state):
        """``Decider._payment``; None, with nothing changed, for what the compiled path
        does not take."""
        cdef Py_ssize_t n = len(applied), i
        cdef object amount_py = _E_AMOUNT.get(event)
        cdef long long amount, count, used
        cdef object snapshot = _W_SNAPSHOT.get(state)
        cdef dict buckets = _S_BUCKETS.get(snapshot)
        cdef _Rule r
        cdef tuple a
        cdef object bucket, key, end, value
        cdef PyObject** found
        """Per applied rule, its bucket as read (NULL: none), then its ``_Rule``: borrowed,
        as the snapshot's dict and the plan hold them (a bucket is only ever added to the
        dict here, never replaced, and a rule outlives every plan)."""
        cdef list keys
        cdef long long* counts
        cdef long long* useds
        cdef bint accepted = True
        cdef _Out out = self.violations
        if type(amount_py) is not int or not (0 <= amount_py < _SMALL):
            return None
        amount = amount_py
        counts = <long long*>malloc(sizeof(long long) * (2 * n + 1))
        if counts == NULL:
            raise MemoryError()
        found = <PyObject**>malloc(sizeof(PyObject*) * (2 * n + 1))
        if found == NULL:
            free(counts)
            raise MemoryError()
        useds = counts + n
        out.size = 0
        try:
            # what each applied rule's bucket holds, and every limit the event breaks
            for i in range(n):
                a = <tuple>applied[i]
                r = <_Rule>_C_FAST.get(a[0])
                if not r.usable:
                    return None
                found[n + i] = <PyObject*>r
                if a[2] is None:
                    counts[i] = 0
                    useds[i] = 0
                    found[i] = NULL
                    if r.has_amount and amount > r.max_amount:
                        self._violation(out, accepted, r.amount_head, a[1], r.violation_limit)
                        accepted = False
                        out.minor(0, r.exponent if r.exponent >= 0 else 0)
                        out.raw(b"}", 1)
                    continue
                bucket = buckets.get(a[2])
                if bucket is None:
                    count = used = 0
                else:
                    value = _B_COUNT.get(bucket)
                    if type(value) is not int or not (0 <= value < _SMALL):
                        return None
                    count = value
                    value = _B_AMOUNT.get(bucket)
                    if type(value) is not int or not (0 <= value <= self.ceiling):
                        return None
                    used = value
                counts[i] = count
                useds[i] = used
                found[i] = NULL if bucket is None else <PyObject*>bucket
                if r.has_count and count >= r.max_count:
                    self._violation(out, accepted, r.count_head, a[1], r.count_limit)
                    accepted = False
                    out.raw(b'"', 1)
                    out.integer(count)
                    out.raw(b'"}', 2)
                if r.has_amount and used > r.max_amount - amount:
                    self._violation(out, accepted, r.amount_head, a[1], r.violation_limit)
                    accepted = False
                    out.minor(used, r.exponent if r.exponent >= 0 else 0)
                    out.raw(b"}", 1)

            # every applied rule's bucket after the decision
            out = self.limits
            out.size = 0
            keys = []
            if accepted:
                dirty = <dict?>_W_DIRTY_BUCKETS.get(state)
                for i in range(n):
                    a = <tuple>applied[i]
                    r = <_Rule>found[n + i]
                    key = a[2]
                    if key is None:
                        count, used = 1, amount
                    else:
                        count = counts[i] + 1
                        used = useds[i]
                        used = self.ceiling if used > self.ceiling - amount else used + amount
                        bucket = None if found[i] == NULL else <object>found[i]
                        end = a[3]
                        if bucket is None:
                            bucket = Bucket(count, used, 0, end)
                            buckets[key] = bucket
                        else:
                            _B_COUNT.set(bucket, count)
                            _B_AMOUNT.set(bucket, used)
                            if end is not None:  # (an expired bucket reads with none)
                                held = _B_PERIOD_END.get(bucket)
                                if held is None or held < end:
                                    _B_PERIOD_END.set(bucket, end)
                        PyDict_SetItem(dirty, key, bucket)
                        keys.append(key)
                    self._limit(out, r, a[1], count, used, i)
                decision, reason = _ACCEPT, None
            else:
                for i in range(n):
                    a = <tuple>applied[i]
                    r = <_Rule>found[n + i]
                    if a[2] is None:
                        self._limit(out, r, a[1], 1, amount, i)
                    else:
                        self._limit(out, r, a[1], counts[i], useds[i], i)
                decision, reason = _REJECT, _LIMIT_EXCEEDED
        finally:
            free(counts)
            free(found)

        event_id = _E_ID.get(event)
        account_id = _E_ACCOUNT.get(event)
        seq = _next_seq(snapshot, state, account_id)
        currency = _E_CURRENCY.get(event)
        out = self.head
        _open_verdict(
            out,
            event_id,
            account_id,
            b',"type":"payment","decision":"accept","reason":null,"seq":' if accepted
            else b',"type":"payment","decision":"reject","reason":"limit_exceeded","seq":',
            seq,
        )
        out.put(b',"violations":[')
        out.extend(self.violations)
        out.put(b'],"occurred_at":')
        out.quoted(_E_OCCURRED_AT.get(event))
        out.put(b',"amount":')
        out.minor(amount, MINOR_UNITS[currency])
        out.put(b',"currency":')
        out.quoted(currency)
        out.put(b',"original_event_id":null')
        encoded = _close_verdict(out, self.version, self.limits)

        record = EventRecord(
            _E_FINGERPRINT.get(event),
            account_id,
            _PAYMENT,
            accepted,
            seq,
            encoded,
            amount_py if accepted else 0,
            currency,
            0,
            tuple(keys),
            _E_EPOCH.get(event),
            0,
            None,
            None if keys else (),
        )
        _put_event(snapshot, state, event_id, record)
        return _outcome(self.outcome_type, self.verdict_kind, encoded, decision, reason)

    cdef object _duplicate(self, record):
        """The outcome of a resend of the event of ``record``: its verdict again."""
        verdict = _R_VERDICT.get(record)
        return _outcome(
            self.outcome_type,
            self.duplicate_kind,
            verdict,
            _ACCEPT if _R_ACCEPTED.get(record) else _REJECT,
            _stored_reason(verdict, self.reason_in),
        )

    cdef object _reversal(self, event, state):
        """``Decider._reversal`` of a new reversal; None, with nothing changed, for what
        the Python path decides: an amount sent without a currency where it must be read
        in the original's (or a dead letter), a currency that differs from the
        original's, a released bucket absent, expired, emptied or of another life, a
        rule removed since the payment, a number past 62 bits."""
        cdef object snapshot = _W_SNAPSHOT.get(state)
        cdef dict events = _S_EVENTS.get(snapshot)
        cdef dict buckets = _S_BUCKETS.get(snapshot)
        cdef object original_id = _E_ORIGINAL.get(event)
        cdef object account_id = _E_ACCOUNT.get(event)
        cdef object currency = _E_CURRENCY.get(event)
        cdef object amount_py = _E_AMOUNT.get(event)
        cdef object reason = None
        cdef object original, held, r, value
        cdef tuple keys, parts
        cdef object born
        cdef list periods, rules, released
        cdef long long amount = 0, left = 0, reversed_before = 0, count, used
        cdef Py_ssize_t n = 0, i
        cdef bint known = amount_py is not None
        cdef bint fully = False
        cdef _Out out
        if original_id is None or not (amount_py is None or _small(amount_py)):
            return None
        if known:
            amount = amount_py
        original = events.get(original_id)
        if (
            original is None
            or _R_TYPE.get(original) is not _PAYMENT
            or _R_ACCOUNT.get(original) != account_id
        ):
            reason = _ORIGINAL_NOT_FOUND
            if known and currency is None:
                return None
        elif not _R_ACCEPTED.get(original):
            if _E_AMOUNT_DECIMAL.get(event) is not None:
                return None  # read in the original's currency (or a dead letter)
            reason = _ORIGINAL_NOT_ACCEPTED
            if currency is None:
                currency = _R_CURRENCY.get(original)
            if known and currency is None:
                return None
        else:
            if currency is not None and currency != _R_CURRENCY.get(original):
                return None  # a dead letter
            currency = _R_CURRENCY.get(original)
            value = _R_AMOUNT.get(original)
            held = _R_REVERSED.get(original)
            if currency is None or not _small(value) or not _small(held):
                return None
            reversed_before = held
            left = <long long>value - reversed_before
            if not known:
                if _E_AMOUNT_DECIMAL.get(event) is not None:
                    return None  # read in the original's currency
                if left < 0:
                    return None
                amount, known = left, True
            if left <= 0:
                reason = _ALREADY_REVERSED
            elif amount > left:
                reason = _REVERSAL_EXCEEDS

        if reason is None:
            # every bucket first, nothing changed until each is one the compiled path
            # releases from as the Python path would
            keys = tuple(_R_BUCKETS.get(original))
            born = _R_BORN.get(original) or ()
            n = len(keys)
            if n > 1 and len(set(keys)) != n:
                return None
            periods, rules = [], []
            for i in range(n):
                if type(keys[i]) is not str:
                    return None
                held = buckets.get(keys[i])
                if held is None:
                    return None
                value = _B_COUNT.get(held)
                if not _small(value):
                    return None
                count = value
                value = _B_AMOUNT.get(held)
                if not _small(value):
                    return None
                used = value
                if (count == 0 and used == 0) or (
                    i < len(born) and born[i] and _B_BORN.get(held) != born[i]
                ):
                    return None
                parts = tuple((<str>keys[i]).split("|", 2))
                if len(parts) != 3:
                    return None
                r = self.by_id.get(parts[0])
                if r is None or not (<_Rule>r).usable:
                    return None
                if window_of(parts[1]) is not (<_Rule>r).window:
                    return None  # its rule changed window since: Decider._released_state
                periods.append(parts[1])
                rules.append(r)

            # released
            fully = amount >= left  # what it had reversed and this reach its amount
            _R_REVERSED.set(original, reversed_before + amount)
            PyDict_SetItem(<dict?>_W_DIRTY_EVENTS.get(state), original_id, original)
            dirty = <dict?>_W_DIRTY_BUCKETS.get(state)
            released = []
            out = self.limits
            out.size = 0
            for i in range(n):
                key = keys[i]
                held = buckets[key]
                PyDict_SetItem(dirty, key, held)
                released.append(key)
                used = <long long>_B_AMOUNT.get(held) - amount
                if used < 0:
                    used = 0
                _B_AMOUNT.set(held, used)
                count = _B_COUNT.get(held)
                if fully:
                    count = count - 1 if count > 0 else 0
                    _B_COUNT.set(held, count)
                self._limit(out, <_Rule>rules[i], periods[i], count, used, i)
        else:
            released = []
            self.limits.size = 0

        accepted = reason is None
        seq = _next_seq(snapshot, state, account_id)
        event_id = _E_ID.get(event)
        out = self.head
        _open_verdict(
            out,
            event_id,
            account_id,
            b',"type":"reversal","decision":"accept","reason":null,"seq":' if accepted
            else b',"type":"reversal","decision":"reject","reason":' + _json_text(reason)
            + b',"seq":',
            seq,
        )
        out.put(b',"violations":[],"occurred_at":')
        out.quoted(_E_OCCURRED_AT.get(event))
        out.put(b',"amount":')
        if known and currency is not None:
            out.minor(amount, MINOR_UNITS[currency])
        else:
            value = _E_AMOUNT_DECIMAL.get(event)
            out.put(b"null" if value is None else _json_text(str(value)))
        out.put(b',"currency":')
        if currency is None:
            out.raw(b"null", 4)
        else:
            out.quoted(currency)
        out.put(b',"original_event_id":')
        out.quoted(original_id)
        encoded = _close_verdict(out, self.version, self.limits)

        record = EventRecord(
            _E_FINGERPRINT.get(event),
            account_id,
            _REVERSAL,
            accepted,
            seq,
            encoded,
            0,
            currency,
            0,
            tuple(released),
            _E_EPOCH.get(event),
        )
        _put_event(snapshot, state, event_id, record)
        return _outcome(
            self.outcome_type, self.verdict_kind, encoded, _ACCEPT if accepted else _REJECT, reason
        )

    cdef int _violation(self, _Out out, bint first, bytes head, object period,
                        bytes limit) except -1:
        """Open one violation, up to its ``used`` (``first``: none was written yet)."""
        if not first:
            out.raw(b",", 1)
        out.put(head)
        out.quoted(period)
        out.put(b',"limit":')
        out.put(limit)
        out.put(b',"used":')
        return 0

    cdef int _limit(self, _Out out, _Rule r, object period, long long count, long long used,
                    Py_ssize_t index) except -1:
        """One ``LimitState``: a rule's bucket after the decision."""
        if index:
            out.raw(b",", 1)
        if period is not r.limit_period:
            r.limit_start = r.limit_head + _json_text(period) + b',"count_used":'
            r.limit_period = period
        # the rule's constant parts are each written at once (count_middle, amount_middle)
        out.put(r.limit_start)
        out.integer(count)
        out.put(r.count_middle)
        if r.has_count:
            out.integer(r.max_count - count if count < r.max_count else 0)
            out.raw(b',"amount_used":', 15)
        if r.exponent < 0:  # no amount currency: amount_middle runs to the end
            return out.put(r.amount_middle)
        out.minor(used, r.exponent)
        out.put(r.amount_middle)
        if not r.has_amount:
            return out.raw(b"null}", 5)
        out.minor(r.max_amount - used if used < r.max_amount else 0, r.exponent)
        return out.raw(b"}", 1)


cdef Field _K_BUCKETS = Field(Keys, "buckets")
cdef Field _K_ACCOUNTS = Field(Keys, "accounts")
cdef Field _K_EVENTS = Field(Keys, "events")
cdef Field _B_VERSION = Field(Bucket, "version")
cdef Field _A_VERSION = Field(Account, "version")
cdef Field _WR_BUCKETS = Field(Writes, "buckets")
cdef Field _WR_ACCOUNTS = Field(Writes, "accounts")
cdef Field _WR_EVENTS = Field(Writes, "events")


def keys(events, plans):
    """``Decider.keys``: every record the events need, except the buckets of reversed
    originals."""
    found = Keys()
    cdef set buckets = _K_BUCKETS.get(found)
    cdef set accounts = _K_ACCOUNTS.get(found)
    cdef set ids = _K_EVENTS.get(found)
    cdef Py_ssize_t n = len(events), i
    cdef tuple applied
    if len(plans) != n:  # zip(strict=True)'s error
        raise ValueError("zip() argument 2 is shorter or longer than argument 1")
    for i in range(n):
        event = events[i]
        PySet_Add(accounts, _E_ACCOUNT.get(event))
        PySet_Add(ids, _E_ID.get(event))
        original = _E_ORIGINAL.get(event)
        if original is not None:
            PySet_Add(ids, original)
        applied = plans[i]
        for a in applied:
            # Applied.key, read in its tuple (a[2] of a NamedTuple went through the
            # type's sequence slot: ~750 instructions, 5 times an event)
            if PyTuple_Check(a) and PyTuple_GET_SIZE(a) > 2:
                key = <object>PyTuple_GET_ITEM(a, 2)
            else:
                key = a[2]
            if key is not None:
                PySet_Add(buckets, key)
    return found


def take_writes(state):
    """``WorkingState.take_writes``: every changed record, its version advanced by one,
    handed over in the state's dicts, which start again empty."""
    cdef dict buckets = _W_DIRTY_BUCKETS.get(state)
    cdef dict accounts = _W_DIRTY_ACCOUNTS.get(state)
    cdef dict events = _W_DIRTY_EVENTS.get(state)
    _advance(buckets, _B_VERSION)
    _advance(accounts, _A_VERSION)
    _advance(events, _R_VERSION)
    writes = Writes.__new__(Writes)
    _WR_BUCKETS.set(writes, buckets)
    _WR_ACCOUNTS.set(writes, accounts)
    _WR_EVENTS.set(writes, events)
    _W_DIRTY_BUCKETS.set(state, {})
    _W_DIRTY_ACCOUNTS.set(state, {})
    _W_DIRTY_EVENTS.set(state, {})
    return writes


cdef int _advance(dict records, Field version) except -1:
    for record in records.values():
        version.set(record, version.get(record) + 1)
    return 0


cdef Field _B_EXPIRES_AT = Field(Bucket, "expires_at")
cdef Field _R_OCCURRED = Field(EventRecord, "occurred")


cdef inline bint _small(object value):
    """Whether ``value`` is an int the C arithmetic below takes (0 <= value < 2**62)."""
    cdef int overflow = 0
    cdef long long v
    if type(value) is not int:
        return False
    v = PyLong_AsLongLongAndOverflow(value, &overflow)
    return overflow == 0 and 0 <= v < _SMALL


def stamp(writes, now, bucket_seconds, event_seconds, latest):
    """``stores.base.stamp``: the expiries as read, then each record's new expiry and
    life stamps set, for ``Store.commit`` (a record kept the bucket retention past the
    buckets it counted in). Integers past 62 bits (what a damaged store may hold) are
    worked out with Python's, as there."""
    cdef dict buckets = _WR_BUCKETS.get(writes)
    cdef dict events = _WR_EVENTS.get(writes)
    cdef dict held_buckets = lf_dict_of(len(buckets))
    cdef dict held_events = lf_dict_of(len(events))
    cdef bint fast = (
        _small(now) and _small(bucket_seconds) and _small(event_seconds) and _small(latest)
    )
    cdef long long c_now = now if fast else 0
    cdef long long c_bucket = bucket_seconds if fast else 0
    cdef long long c_event = event_seconds if fast else 0
    cdef long long c_latest = latest if fast else 0
    cdef long long at
    for key, bucket in buckets.items():
        held_buckets[key] = _B_EXPIRES_AT.get(bucket)
        period_end = _B_PERIOD_END.get(bucket)
        if period_end is None:
            _B_EXPIRES_AT.set(bucket, None)
        elif fast and _small(period_end):
            at = (<long long>period_end if <long long>period_end > c_now else c_now) + c_bucket
            _B_EXPIRES_AT.set(bucket, at if at < c_latest else c_latest)
        else:
            expires_at = (period_end if period_end > now else now) + bucket_seconds
            _B_EXPIRES_AT.set(bucket, expires_at if expires_at < latest else latest)
        if not _B_BORN.get(bucket):  # a new life: new, expired when read, or stored before
            _B_BORN.set(bucket, now)
    for key, record in events.items():
        held = _R_EXPIRES_AT.get(record)
        held_events[key] = held
        occurred = _R_OCCURRED.get(record)
        if fast and _small(occurred):
            at = (<long long>occurred if <long long>occurred > c_now else c_now) + c_event
            until = at if at < c_latest else c_latest
        else:
            expires_at = (occurred if occurred > now else now) + event_seconds
            until = expires_at if expires_at < latest else latest
        if held is None and _R_VERSION.get(record) > 1:
            until = None  # stored before to never expire: it stays so
        else:
            # kept the bucket retention past each bucket it counted in or released
            # from, as this commit writes it (a lifetime bucket: never expires)
            for bucket_key in _R_BUCKETS.get(record):
                counted = buckets.get(bucket_key)
                if counted is None or until is None:
                    continue
                counted_until = _B_EXPIRES_AT.get(counted)
                if counted_until is None:
                    until = None
                    continue
                if fast and _small(counted_until):
                    at = <long long>counted_until + c_bucket
                    kept = at if at < c_latest else c_latest
                else:
                    kept = counted_until + bucket_seconds
                    if kept > latest:
                        kept = latest
                if kept > until:
                    until = kept
            # never earlier than stored (a reversal after its original's buckets expired)
            if held is not None and until is not None and held > until:
                until = held if held < latest else latest
        _R_EXPIRES_AT.set(record, until)
        if _R_BORN.get(record) is None:  # a new payment: its buckets are in this commit
            born = []
            for bucket_key in _R_BUCKETS.get(record):
                found = buckets.get(bucket_key)
                born.append(0 if found is None else _B_BORN.get(found))
            _R_BORN.set(record, tuple(born))
    return held_buckets, held_events


def expire(snapshot, now):
    """``stores.base.expire``: what has expired by ``now`` read as a store holds it."""
    cdef dict buckets = _S_BUCKETS.get(snapshot)
    cdef dict events = _S_EVENTS.get(snapshot)
    cdef dict expired_events = _S_EXPIRED.get(snapshot)
    cdef list expired = []
    for key, bucket in buckets.items():
        expires_at = _B_EXPIRES_AT.get(bucket)
        if expires_at is not None and expires_at <= now:
            expired.append(key)
    for key in expired:  # (replaced after the walk, as a dict changes only then)
        bucket = buckets[key]
        buckets[key] = type(bucket)(
            version=_B_VERSION.get(bucket), expires_at=_B_EXPIRES_AT.get(bucket)
        )
    expired = []
    for key, record in events.items():
        expires_at = _R_EXPIRES_AT.get(record)
        if expires_at is not None and expires_at <= now:
            expired.append(key)
    for key in expired:
        expired_events[key] = events.pop(key)
