# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""The common-event fast path of ``schemas.events``, compiled: ``CommonEvent.event``.

``schemas.events._common_event`` is the reference and the fallback; this module is its
twin, used by ``event_from_dict`` when the extension is built. ``schemas.events`` makes
the one ``CommonEvent`` with its own Event class, limits, encoder and hash: this module
imports nothing from it, so that either can be imported first.

It reads the timestamp and the amount itself, in C on the ASCII text, instead of a
regular expression, ``datetime.fromisoformat``, timedelta arithmetic and string slicing,
and returns the same Event, field for field, or None. The fingerprint is the same by
construction: the same tuple, encoded by the same msgspec encoder, hashed by a copy of
the same BLAKE2b.

Where it cannot be sure it returns None, and the general path (``_checked_event``)
decides, the same way as ever: a ``dict`` subclass, a key that is not a ``str``, an
offset of 60 minutes or more (Python 3.11's ``fromisoformat`` reads +08:60 as +09:00;
not sure that every Python does), an hour 24 (3.11 refuses it; later ones may not), a
currency's minor unit beyond 18. ``tests/unit/test_events_fast.py`` gives both the same
objects and compares every field.
"""

from cpython.dict cimport PyDict_Next, PyDict_SetItem
from cpython.long cimport PyLong_AsLongLongAndOverflow
from cpython.object cimport PyObject
from cpython.set cimport PySet_Contains

cdef extern from *:
    """
    /* The bytes of a str that holds only ASCII, or NULL. */
    static const char* lf_ascii(PyObject* s, Py_ssize_t* n) {
    #if PY_VERSION_HEX < 0x030C0000
        if (!PyUnicode_IS_READY(s)) return NULL;  /* a legacy str, never from JSON */
    #endif
        if (!PyUnicode_IS_ASCII(s)) return NULL;
        *n = PyUnicode_GET_LENGTH(s);
        return (const char*)PyUnicode_1BYTE_DATA(s);
    }

    static int lf_digit(char c) { return c >= '0' && c <= '9'; }

    /* The members of the object that JSON text ``s`` is (valid JSON, decoded already):
       the colons outside strings at depth 1. Each member has one; an object with a name
       twice has more of them than its decoded dict has keys. */
    static Py_ssize_t lf_members(const char* s, Py_ssize_t n) {
        Py_ssize_t i, members = 0;
        int depth = 0;
        for (i = 0; i < n; i++) {
            char c = s[i];
            if (c == '"') {
                for (i++; i < n && s[i] != '"'; i++) {
                    if (s[i] == 0x5C) i++;  /* a backslash: the next byte is escaped */
                }
            } else if (c == '{' || c == '[') {
                depth++;
            } else if (c == '}' || c == ']') {
                depth--;
            } else if (c == ':' && depth == 1) {
                members++;
            }
        }
        return members;
    }
    static int lf_two(const char* p) { return (p[0] - '0') * 10 + (p[1] - '0'); }

    /* Days from 1970-01-01 to a date of the proleptic Gregorian calendar (year >= 1). */
    static long long lf_days(long long y, int m, int d) {
        long long era, yoe, doy, doe;
        y -= m <= 2;
        era = y / 400;  /* y >= 0 here */
        yoe = y - era * 400;
        doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;
        doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
        return era * 146097 + doe - 719468;
    }

    static int lf_month_days(int y, int m) {
        static const int days[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
        if (m == 2 && (y % 4 == 0 && (y % 100 != 0 || y % 400 == 0))) return 29;
        return days[m - 1];
    }

    /* Microseconds since the Unix epoch of a timestamp that _COMMON_TIME fully matches,
       as datetime.fromisoformat (3.11) reads it: 1 and *micros, or 0 where it does not
       match, where fromisoformat would refuse it, and where this cannot be sure. */
    static int lf_common_time(const char* s, Py_ssize_t n, long long* micros) {
        Py_ssize_t i;
        int year, month, day, hour, minute, second, fraction = 0, scale = 100000;
        long long offset = 0;
        /* YYYY-MM-DD[Tt ]HH:MM:[0-5]D */
        if (n < 20) return 0;
        for (i = 0; i < 19; i++) {
            char c = s[i];
            if (i == 4 || i == 7) { if (c != '-') return 0; }
            else if (i == 10) { if (c != 'T' && c != 't' && c != ' ') return 0; }
            else if (i == 13 || i == 16) { if (c != ':') return 0; }
            else if (!lf_digit(c)) return 0;
        }
        if (s[17] > '5') return 0;
        i = 19;
        if (s[i] == '.') {  /* (?:\\.[0-9]+)? : the first six digits, the rest dropped */
            i++;
            if (i >= n || !lf_digit(s[i])) return 0;
            while (i < n && lf_digit(s[i])) {
                if (scale) { fraction += (s[i] - '0') * scale; scale /= 10; }
                i++;
            }
        }
        /* (?:Z|[+-][0-9]{2}:[0-9]{2}) and the end */
        if (i + 1 == n && s[i] == 'Z') {
            offset = 0;
        } else if (i + 6 == n && (s[i] == '+' || s[i] == '-') && lf_digit(s[i + 1])
                   && lf_digit(s[i + 2]) && s[i + 3] == ':' && lf_digit(s[i + 4])
                   && lf_digit(s[i + 5])) {
            int oh = lf_two(s + i + 1), om = lf_two(s + i + 4);
            if (om >= 60) return 0;  /* 3.11 takes +08:60 as +09:00; not sure elsewhere */
            if (oh >= 24) return 0;  /* fromisoformat: not strictly inside a day */
            offset = (long long)(oh * 3600 + om * 60);
            if (s[i] == '-') offset = -offset;
        } else {
            return 0;
        }
        year = lf_two(s) * 100 + lf_two(s + 2);
        month = lf_two(s + 5);
        day = lf_two(s + 8);
        hour = lf_two(s + 11);
        minute = lf_two(s + 14);
        second = lf_two(s + 17);
        if (year < 1 || month < 1 || month > 12 || day < 1) return 0;
        if (day > lf_month_days(year, month)) return 0;
        if (hour > 23 || minute > 59) return 0;  /* hour 24: refused by 3.11, not sure later */
        *micros = (((lf_days(year, month, day) * 24 + hour) * 60 + minute) * 60 + second
                   - offset) * 1000000LL + fraction;
        return 1;
    }

    /* The minor units of an amount string of the form _common_event takes (ASCII digits,
       1 to 30 of them, then optionally "." and 1 to 30 more), with no more fraction digits
       than ``exponent`` once its trailing zeros are dropped, and at most ``max_minor``:
       1 and *minor, or 0 (then *minor is unset). */
    static int lf_minor(const char* s, Py_ssize_t n, int exponent, long long max_minor,
                        long long* minor) {
        Py_ssize_t i, dot = -1, whole, fraction, used, significant = 0;
        unsigned long long value = 0;
        int k;
        for (i = 0; i < n; i++) {
            if (s[i] == '.') { dot = i; break; }
        }
        whole = dot < 0 ? n : dot;
        if (whole < 1 || whole > 30) return 0;
        for (i = 0; i < whole; i++) if (!lf_digit(s[i])) return 0;
        fraction = 0;
        if (dot >= 0) {
            fraction = n - dot - 1;
            if (fraction < 1 || fraction > 30) return 0;
            for (i = dot + 1; i < n; i++) if (!lf_digit(s[i])) return 0;
        }
        used = fraction;  /* fraction digits without trailing zeros */
        while (used > 0 && s[dot + used] == '0') used--;
        if (used > exponent) return 0;
        /* whole * 10**exponent + the used fraction digits, padded to ``exponent`` */
        for (i = 0; i < whole && s[i] == '0'; i++) {}
        significant = whole - i;
        if (significant + exponent > 18) return 0;  /* >= 10**18: past any max_minor */
        for (; i < whole; i++) value = value * 10 + (unsigned long long)(s[i] - '0');
        for (k = 0; k < exponent; k++) {
            value *= 10;
            if (k < used) value += (unsigned long long)(s[dot + 1 + k] - '0');
        }
        if (value == 0 || value > (unsigned long long)max_minor) return 0;
        *minor = (long long)value;
        return 1;
    }

    /* Whether an amount lf_minor took is written as its value's one text (``amount_text``):
       no zero before another whole digit, no zero at the end of a fraction. */
    static int lf_amount_text(const char* s, Py_ssize_t n) {
        Py_ssize_t i;
        if (n > 1 && s[0] == '0' && s[1] != '.') return 0;
        for (i = 0; i < n; i++) if (s[i] == '.') return s[n - 1] != '0';
        return 1;
    }
    """
    const char* lf_ascii(object s, Py_ssize_t* n)
    Py_ssize_t lf_members(const char* s, Py_ssize_t n)
    bint lf_common_time(const char* s, Py_ssize_t n, long long* micros)
    bint lf_minor(const char* s, Py_ssize_t n, int exponent, long long max_minor,
                  long long* minor)
    bint lf_amount_text(const char* s, Py_ssize_t n)


cdef str _PAYMENT_TEXT = "payment"
cdef str _REVERSAL_TEXT = "reversal"

# the fields an event has beyond its extras (``schemas.events._CORE_FIELDS``)
cdef str _K_EVENT_ID = "event_id"
cdef str _K_TYPE = "type"
cdef str _K_ACCOUNT_ID = "account_id"
cdef str _K_AMOUNT = "amount"
cdef str _K_CURRENCY = "currency"
cdef str _K_OCCURRED_AT = "occurred_at"
cdef str _K_ORIGINAL = "original_event_id"
cdef frozenset _CORE = frozenset(
    {_K_EVENT_ID, _K_TYPE, _K_ACCOUNT_ID, _K_AMOUNT, _K_CURRENCY, _K_OCCURRED_AT, _K_ORIGINAL}
)
"""One hash lookup per key (a str keeps its hash), not up to seven comparisons."""


cdef str _amount_text(long long minor, int exponent):
    """``schemas.amounts.amount_text``: the amount's value as rules scope and match by it."""
    cdef str digits = str(minor)
    cdef Py_ssize_t whole
    if exponent == 0:
        return digits
    if len(digits) <= exponent:
        digits = "0" * (exponent + 1 - len(digits)) + digits
    whole = len(digits) - exponent
    fraction = digits[whole:].rstrip("0")
    return digits[:whole] + "." + fraction if fraction else digits[:whole]


cdef class CommonEvent:
    """``schemas.events._common_event`` for the names and limits of ``schemas.events``,
    given here (this module imports nothing of it, so that it can import this one)."""

    cdef object payment
    cdef object reversal
    cdef dict minor_units
    cdef object encode
    cdef object blake
    cdef object event_type
    cdef Py_ssize_t max_id
    cdef long long first_micros
    cdef long long end_micros
    cdef long long longest_int
    cdef long long max_minor
    cdef object decode

    def __init__(self, event_type, payment, reversal, dict minor_units, encoder, blake,
                 Py_ssize_t max_id, long long first_micros, long long end_micros,
                 long long longest_int, long long max_minor, decode=None):
        self.decode = decode
        self.event_type = event_type
        self.payment = payment
        self.reversal = reversal
        self.minor_units = minor_units
        self.encode = encoder.encode
        self.blake = blake
        self.max_id = max_id
        self.first_micros = first_micros
        self.end_micros = end_micros
        self.longest_int = longest_int
        self.max_minor = max_minor

    cdef bint _is_id(self, object value):
        return type(value) is str and 1 <= len(<str>value) <= self.max_id

    def parse(self, raw):
        """The first steps of ``schemas.events.parse_event(raw)`` for bytes: the same
        Event for a usual event; the decoded object, when it is a JSON object but not
        one ``event`` takes (``_checked_event`` then checks it all); None for anything
        else (not bytes, not valid JSON, not an object, a member name given twice), which
        ``parse_event`` decodes again to say why. (Its two Python frames were ~1% of a replay.)"""
        if type(raw) is not bytes or self.decode is None:
            return None
        try:
            doc = self.decode(raw)
        except Exception:  # DecodeError, UnicodeDecodeError, RecursionError: said there
            return None
        if type(doc) is not dict:
            return None
        if lf_members(<const char*>raw, len(<bytes>raw)) != len(<dict>doc):
            return None  # a name given twice: the general path says which
        event = self.event(doc)
        return doc if event is None else event

    def event(self, doc):
        """``schemas.events._common_event(doc)``: the same Event, or None."""
        cdef Py_ssize_t n = 0, pos = 0
        cdef const char* text
        cdef long long micros = 0, minor = 0, small = 0
        cdef int overflow = 0
        cdef PyObject* key_p
        cdef PyObject* item_p
        cdef dict fields, extras
        cdef object kind, amount, original_event_id, exponent, item, digest
        if type(doc) is not dict:
            return None  # a subclass's get and copy may differ: the general path decides
        fields = <dict>doc
        event_id = fields.get(_K_EVENT_ID)
        account_id = fields.get(_K_ACCOUNT_ID)
        if not self._is_id(event_id) or not self._is_id(account_id):
            return None
        kind_text = fields.get(_K_TYPE, _PAYMENT_TEXT)
        if type(kind_text) is not str:
            return None
        if <str>kind_text == _PAYMENT_TEXT:
            kind = self.payment
        elif <str>kind_text == _REVERSAL_TEXT:
            kind = self.reversal
        else:
            return None
        value = fields.get(_K_OCCURRED_AT)
        if type(value) is not str or len(<str>value) > 64:
            return None
        text = lf_ascii(value, &n)
        if text == NULL or not lf_common_time(text, n, &micros):
            return None
        if not self.first_micros <= micros < self.end_micros:
            return None

        original = fields.get(_K_ORIGINAL)
        if original is not None and not self._is_id(original):
            return None
        currency = fields.get(_K_CURRENCY)
        raw_amount = fields.get(_K_AMOUNT)
        if kind is self.payment:
            original_event_id = None
        elif original is None:
            return None
        else:
            original_event_id = original
        if currency is None:
            if raw_amount is not None or kind is self.payment:
                return None
            amount = None
        elif type(currency) is not str or type(raw_amount) is not str:
            return None
        else:
            exponent = self.minor_units.get(currency)
            if type(exponent) is not int or not 0 <= exponent <= 18:
                return None  # not a currency (or a minor unit this code does not take)
            text = lf_ascii(raw_amount, &n)
            if text == NULL or not lf_minor(text, n, <int>exponent, self.max_minor, &minor):
                return None
            amount = minor
            if not lf_amount_text(text, n):  # "100.00": rules scope by the value, "100"
                fields[_K_AMOUNT] = _amount_text(minor, <int>exponent)

        extras = {}
        while PyDict_Next(fields, &pos, &key_p, &item_p):
            if type(<object>key_p) is not str:
                return None  # what equals a field's name here is not sure: the general path
            if PySet_Contains(_CORE, <object>key_p):
                continue
            item = <object>item_p
            if type(item) is not str and type(item) is not bool and item is not None:
                if type(item) is not int:
                    return None  # numbers to compare by value, or containers to measure
                small = PyLong_AsLongLongAndOverflow(item, &overflow)
                if overflow or not -self.longest_int < small < self.longest_int:
                    return None
            PyDict_SetItem(extras, <object>key_p, item)
        digest = self.blake.copy()
        digest.update(
            self.encode(
                (event_id, kind_text, account_id, amount, currency, micros, original, extras)
            )
        )
        return self.event_type(
            event_id,
            kind,
            account_id,
            amount,
            None,
            currency,
            value,
            micros // 1_000_000,
            original_event_id,
            doc,
            digest.hexdigest(),
            None,
        )
