# cython: language_level=3
"""Attributes read and written straight in their slots, for the compiled modules."""

from cpython.object cimport Py_TYPE, PyObject, PyTypeObject

cdef extern from *:
    """
    #include <structmember.h>
    /* The offset of an object slot: a member descriptor of a __slots__ name or of a
       msgspec struct field; -1 for any other attribute. */
    static Py_ssize_t lf_slot_offset(PyObject* descr) {
        PyMemberDef* member;
        if (descr == NULL || !Py_IS_TYPE(descr, &PyMemberDescr_Type)) return -1;
        member = ((PyMemberDescrObject*)descr)->d_member;
        if (member->type != T_OBJECT_EX || (member->flags & READONLY)) return -1;
        return member->offset;
    }
    /* What a slot holds (a borrowed reference), NULL when it is unset. */
    static inline PyObject* lf_slot(PyObject* obj, Py_ssize_t offset) {
        return *(PyObject**)((char*)obj + offset);
    }
    /* Put a new reference to value in a slot, releasing what it held. */
    static inline void lf_set_slot(PyObject* obj, Py_ssize_t offset, PyObject* value) {
        PyObject** slot = (PyObject**)((char*)obj + offset);
        PyObject* old = *slot;
        Py_INCREF(value);
        *slot = value;
        Py_XDECREF(old);
    }
    """
    Py_ssize_t lf_slot_offset(PyObject* descr)
    PyObject* lf_slot(object obj, Py_ssize_t offset)
    void lf_set_slot(object obj, Py_ssize_t offset, object value)


cdef class Field:
    """One attribute of instances of exactly one class, read and written straight in its
    slot (as ``member_descriptor`` does, without the attribute lookup); an instance of
    any other class, an unset slot or an attribute that is not a plain object slot takes
    ``getattr``/``setattr``. (Made in ``_slots.pyx``.)"""

    cdef readonly object owner_type
    cdef PyTypeObject* owner
    cdef readonly Py_ssize_t offset
    cdef readonly str name

    cdef inline object get(self, object obj):
        cdef PyObject* found
        if self.offset >= 0 and Py_TYPE(obj) == self.owner:
            found = lf_slot(obj, self.offset)
            if found != NULL:
                return <object>found
        return getattr(obj, self.name)

    cdef inline int set(self, object obj, object value) except -1:
        if self.offset >= 0 and Py_TYPE(obj) == self.owner:
            lf_set_slot(obj, self.offset, value)
        else:
            setattr(obj, self.name, value)
        return 0
