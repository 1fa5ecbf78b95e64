# cython: language_level=3
"""``Field``: an attribute read and written straight in its slot (see ``_slots.pxd``),
for ``handlers._fastcore`` and ``stores._fastmemory``."""

from cpython.object cimport PyObject, PyTypeObject


cdef class Field:

    def __init__(self, owner, str name):
        if not isinstance(owner, type):
            raise TypeError(f"not a class: {owner!r}")
        self.owner_type = owner  # held, so that ``owner`` stays valid
        self.owner = <PyTypeObject*>owner
        self.name = name
        descr = owner.__dict__.get(name)
        self.offset = -1 if descr is None else lf_slot_offset(<PyObject*>descr)
