# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""Verdicts kept as what differs from the first verdict of the same shape.

A verdict's shape is its text without its values: the field names, brackets, commas and
colons. Verdicts of one rules file come in few shapes (one for each set of applicable
rules and violations; 12 in 60,000 events of ``benchmarks.generate``), and most of their
values are the same from one verdict to the next: rule ids, windows, limits, the rules
version. ``Shapes.pack`` keeps a verdict as the number of its shape, a bitmap of the
values that differ from the first verdict of that shape, then those values: ~200 bytes
for ~1,300, in ~11,000 instructions, where zstd against a trained dictionary took
~36,000 for ~180 bytes (docs/benchmarks.md, 2026-11-28). A verdict is walked along the
shape of the verdict before it, else along the kept shapes whose number of values and
lengths of pieces are its own: never along all of them.

The shapes outlive the records (they expire; the shapes stay): a shape keeps no value
that follows one of the field names it is given (``blank``: those that tell of an event
or an account), so each verdict keeps those values itself.

``unpack(pack(v)) == v`` for every ``v`` by construction: a verdict is cut into pieces
that, put end to end, are the verdict, and every piece is either kept or is the very
same bytes in the shape; how the pieces are cut only decides how much is kept. The
shapes are kept in the object, never changed once made, for the life of the store that
holds it (at most ``MAX_SHAPES``; a verdict of no kept shape is not packed: None).
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from libc.stdint cimport uint64_t
from libc.string cimport memchr, memcmp, memcpy, memset

MAX_SHAPES = 256
"""Shapes one object keeps: the rest of the verdicts are not packed (None)."""
MAX_VALUES = 8192
"""Values a packed verdict may have (a verdict explains at most 200 rules, with up to 11
values each)."""

cdef Py_ssize_t _MAX_SHAPES = MAX_SHAPES
cdef Py_ssize_t _MAX_VALUES = MAX_VALUES


cdef inline Py_ssize_t _value_end(const char* s, Py_ssize_t i, Py_ssize_t n) noexcept:
    """Where the value that starts at ``s[i]`` ends (``i`` < ``n``): a string's closing
    quote, one not escaped (its own end when it has none); else the next ``,``, ``]``
    or ``}``, or ``n``."""
    cdef const char* q
    cdef Py_ssize_t j = i + 1, r
    if s[i] == b'"':
        while True:
            q = <const char*>memchr(s + j, b'"', n - j)
            if q == NULL:
                return n
            j = q - s
            r = j
            while r > i + 1 and s[r - 1] == b'\\':
                r -= 1
            if (j - r) % 2 == 0:  # an even run of backslashes before it: not escaped
                return j + 1
            j += 1
    while j < n and s[j] != b',' and s[j] != b']' and s[j] != b'}':
        j += 1
    return j


cdef Py_ssize_t _cut(const char* s, Py_ssize_t n, Py_ssize_t* spans) noexcept:
    """The values of ``s[:n]`` into ``spans`` (start and end of each, in order); -1 past
    ``MAX_VALUES`` values. A value is a string not followed by ``:`` (one that is, is a
    field name, of the shape), or a number, true, false or null."""
    cdef Py_ssize_t i = 0, j, k = 0
    cdef char c
    while i < n:
        c = s[i]
        if c == b'"':
            j = _value_end(s, i, n)
            if j < n and s[j] == b':':  # a field name
                i = j
                continue
        elif c == b'-' or b'0' <= c <= b'9' or c == b't' or c == b'f' or c == b'n':
            j = _value_end(s, i, n)
        else:
            i += 1
            continue
        if k == _MAX_VALUES:
            return -1
        spans[2 * k] = i
        spans[2 * k + 1] = j
        k += 1
        i = j
    return k


cdef uint64_t _sign(const Py_ssize_t* spans, Py_ssize_t k, Py_ssize_t n) noexcept:
    """What tells shapes apart at a glance: the number of values and the length of each
    piece between them (one ``_cut`` gave ``spans``, of ``k`` values in ``n`` bytes).
    Verdicts of one shape have the same; a few of other shapes may too."""
    cdef uint64_t sign = <uint64_t>k
    cdef Py_ssize_t i, end = 0
    for i in range(k):
        sign = sign * 1000003 + <uint64_t>(spans[2 * i] - end)
        end = spans[2 * i + 1]
    return sign * 1000003 + <uint64_t>(n - end)


cdef class _Shape:
    """The first verdict of a shape, cut into its values."""

    cdef bytes text
    cdef Py_ssize_t* spans
    cdef Py_ssize_t count
    cdef uint64_t sign

    def __dealloc__(self):
        PyMem_Free(self.spans)


cdef inline Py_ssize_t _put_size(char* at, Py_ssize_t value) noexcept:
    """``value`` as a varint (7 bits a byte, least significant first) at ``at``; how many
    bytes it took."""
    cdef Py_ssize_t n = 0
    while value >= 0x80:
        at[n] = <char>((value & 0x7F) | 0x80)
        value >>= 7
        n += 1
    at[n] = <char>value
    return n + 1


cdef inline Py_ssize_t _get_size(const unsigned char* s, Py_ssize_t n, Py_ssize_t* at) except -1:
    """The varint at ``s[at[0]:]``, ``at[0]`` moved past it."""
    cdef Py_ssize_t value = 0, shift = 0, i = at[0]
    while True:
        if i >= n or shift > 56:
            raise ValueError("a packed verdict that ends too soon")
        value |= <Py_ssize_t>(s[i] & 0x7F) << shift
        i += 1
        if s[i - 1] < 0x80:
            break
        shift += 7
    at[0] = i
    return value


cdef class Shapes:
    """The shapes of the verdicts of one store (see the module's docstring)."""

    cdef list shapes
    cdef tuple blank
    """What comes before each value a shape leaves out (``__init__``)."""
    cdef Py_ssize_t* scratch
    """The values of the verdict being packed."""
    cdef char* packing
    """What ``pack`` writes, before it is made bytes."""
    cdef Py_ssize_t packing_size
    cdef Py_ssize_t last

    def __cinit__(self):
        self.shapes = []
        self.last = 0
        self.scratch = <Py_ssize_t*>PyMem_Malloc(2 * _MAX_VALUES * sizeof(Py_ssize_t))
        self.packing_size = 4096
        self.packing = <char*>PyMem_Malloc(self.packing_size)
        if self.scratch == NULL or self.packing == NULL:
            raise MemoryError()

    def __init__(self, blank=()):
        """``blank``: the ends of the pieces (``b'"account_id":'``) whose values the
        shapes leave out, so that what outlives the records tells nothing of them."""
        self.blank = tuple(bytes(end) for end in blank)

    def __dealloc__(self):
        PyMem_Free(self.scratch)
        PyMem_Free(self.packing)

    cdef bytes _template(self, const char* s, Py_ssize_t n, Py_ssize_t k, Py_ssize_t* spans):
        """``s`` (cut into ``k`` values in ``scratch``) with each value after one of the
        ``blank`` ends left out; its values' spans into ``spans``."""
        cdef Py_ssize_t i, start = 0, w = 0, size, value_start, value_end
        cdef bint left_out
        cdef bytes end, text
        cdef char* o = <char*>PyMem_Malloc(n + 1)
        if o == NULL:
            raise MemoryError()
        try:
            for i in range(k):
                value_start, value_end = self.scratch[2 * i], self.scratch[2 * i + 1]
                size = value_start - start  # the piece before the value
                memcpy(o + w, s + start, size)
                w += size
                left_out = False
                # null tells nothing: kept, it need not be kept again with each verdict
                if value_end - value_start != 4 or memcmp(s + value_start, b"null", 4) != 0:
                    for end in self.blank:
                        size = PyBytes_GET_SIZE(end)
                        if value_start - start >= size and memcmp(
                            s + value_start - size, PyBytes_AS_STRING(end), size
                        ) == 0:
                            left_out = True
                            break
                spans[2 * i] = w
                if not left_out:
                    memcpy(o + w, s + value_start, value_end - value_start)
                    w += value_end - value_start
                spans[2 * i + 1] = w
                start = value_end
            memcpy(o + w, s + start, n - start)
            w += n - start
            text = PyBytes_FromStringAndSize(o, w)
        finally:
            PyMem_Free(o)
        return text

    def __len__(self):
        return len(self.shapes)

    @property
    def texts(self):
        """The text of each shape kept, in order: what outlives every record."""
        return [(<_Shape>shape).text for shape in self.shapes]

    cdef bint _fits(self, _Shape shape, const char* s, Py_ssize_t n) noexcept:
        """Whether ``s[:n]`` is of ``shape``: its pieces between values the same bytes;
        the values into ``scratch``."""
        cdef Py_ssize_t i, at = 0, start = 0, size
        cdef const char* t = PyBytes_AS_STRING(shape.text)
        cdef Py_ssize_t* spans = self.scratch
        for i in range(shape.count):
            size = shape.spans[2 * i] - start  # the piece before value i
            if size > n - at or memcmp(s + at, t + start, size) != 0:
                return False
            at += size
            if at >= n:
                return False
            spans[2 * i] = at
            at = _value_end(s, at, n)
            spans[2 * i + 1] = at
            start = shape.spans[2 * i + 1]
        size = PyBytes_GET_SIZE(shape.text) - start
        return size == n - at and memcmp(s + at, t + start, size) == 0

    def pack(self, bytes verdict):
        """``verdict`` as its shape's number, the bitmap of its values that differ from
        that shape's, and those values (each after its length); None when its shape is
        not kept and no more can be."""
        cdef const char* s = PyBytes_AS_STRING(verdict)
        cdef Py_ssize_t n = PyBytes_GET_SIZE(verdict), i, size, w, index, bitmap, most, k
        cdef Py_ssize_t count = len(self.shapes)
        cdef Py_ssize_t* spans = self.scratch
        cdef _Shape shape = None
        cdef const char* t
        cdef char* o
        cdef uint64_t sign
        # the shape of the last verdict, first; else the kept shapes that look the same
        # at a glance (a verdict of a new shape is not walked along every kept one)
        index = self.last
        if count and self._fits(<_Shape>self.shapes[index], s, n):
            shape = <_Shape>self.shapes[index]
        else:
            k = _cut(s, n, spans)
            if k < 0:
                return None
            sign = _sign(spans, k, n)
            for index in range(count):
                if index != self.last and (<_Shape>self.shapes[index]).sign == sign:
                    if self._fits(<_Shape>self.shapes[index], s, n):
                        shape = <_Shape>self.shapes[index]
                        break
            if shape is None:  # a new shape: this verdict is its first
                if count >= _MAX_SHAPES:
                    return None
                shape = _Shape()  # made before the cut: nothing runs between it and its copy
                k = _cut(s, n, spans)  # again: a shape tried since wrote over the first
                shape.count = k
                shape.sign = sign
                shape.spans = <Py_ssize_t*>PyMem_Malloc((2 * k + 1) * sizeof(Py_ssize_t))
                if shape.spans == NULL:
                    raise MemoryError()
                shape.text = self._template(s, n, k, shape.spans)
                index = count
                self.shapes.append(shape)
        self.last = index
        k = shape.count
        t = PyBytes_AS_STRING(shape.text)
        # at most: the number, the bitmap, and every value with its length
        most = 10 + (k + 7) // 8 + n + 10 * k
        if most > self.packing_size:
            o = <char*>PyMem_Malloc(most)
            if o == NULL:
                raise MemoryError()
            PyMem_Free(self.packing)
            self.packing, self.packing_size = o, most
        o = self.packing
        w = _put_size(o, index)
        memset(o + w, 0, (k + 7) // 8)
        bitmap = w
        w += (k + 7) // 8
        for i in range(k):
            size = spans[2 * i + 1] - spans[2 * i]
            if (
                size == shape.spans[2 * i + 1] - shape.spans[2 * i]
                and memcmp(s + spans[2 * i], t + shape.spans[2 * i], size) == 0
            ):
                continue
            o[bitmap + i // 8] |= <char>(1 << (i % 8))
            w += _put_size(o + w, size)
            memcpy(o + w, s + spans[2 * i], size)
            w += size
        return PyBytes_FromStringAndSize(o, w)

    def unpack(self, bytes packed):
        """The verdict ``pack`` gave ``packed`` for (ValueError when it cannot be one)."""
        cdef Py_ssize_t n = PyBytes_GET_SIZE(packed), at = 0, index, k, i, size, total, bitmap, w
        cdef Py_ssize_t start
        cdef const unsigned char* s = <const unsigned char*>PyBytes_AS_STRING(packed)
        cdef _Shape shape
        cdef const char* t
        cdef bytes out
        cdef char* o
        index = _get_size(s, n, &at)
        if index >= len(self.shapes):
            raise ValueError("a packed verdict of a shape this store does not keep")
        shape = <_Shape>self.shapes[index]
        k = shape.count
        t = PyBytes_AS_STRING(shape.text)
        bitmap = at
        if bitmap + (k + 7) // 8 > n:
            raise ValueError("a packed verdict that ends too soon")
        # first the size: the shape's text, with each kept value instead of the shape's
        total = PyBytes_GET_SIZE(shape.text)
        at = bitmap + (k + 7) // 8
        for i in range(k):
            if s[bitmap + i // 8] & (1 << (i % 8)):
                size = _get_size(s, n, &at)
                if size > n - at:
                    raise ValueError("a packed verdict that ends too soon")
                at += size
                total += size - (shape.spans[2 * i + 1] - shape.spans[2 * i])
        if at != n:
            raise ValueError("a packed verdict with bytes after its values")
        out = PyBytes_FromStringAndSize(NULL, total)
        o = PyBytes_AS_STRING(out)
        w = start = 0
        at = bitmap + (k + 7) // 8
        for i in range(k):
            size = shape.spans[2 * i] - start  # the piece before the value
            memcpy(o + w, t + start, size)
            w += size
            start = shape.spans[2 * i + 1]
            if s[bitmap + i // 8] & (1 << (i % 8)):
                size = _get_size(s, n, &at)
                memcpy(o + w, s + at, size)
                at += size
            else:
                size = start - shape.spans[2 * i]
                memcpy(o + w, t + shape.spans[2 * i], size)
            w += size
        memcpy(o + w, t + start, PyBytes_GET_SIZE(shape.text) - start)
        return out
