"""Exact decimal amounts as integers of minor units.

Amounts never pass through ``float``: JSON numbers are decoded as their literal text,
so ``0.1`` stays one tenth and limits compare exactly.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Final

_PLAIN = re.compile(r"(\d{1,30})(?:\.(\d{1,30}))?", re.ASCII)
JSON_BLANKS: Final = " \t\n\r"
"""JSON's four blanks (RFC 8259): what may surround a decimal string, which the parser
and a JSON Schema validator agree on (``str.strip()`` also takes ``\\x1c`` and ``\\x85``,
a validator's ``\\s`` also ``\\ufeff``), and all that a blank input line may hold."""
_DECIMAL = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?", re.ASCII)

MAX_DIGITS = 15
"""Most digits an amount may have in minor units: up to 9,999,999,999,999.99 CNY. Every
store keeps amounts as 64-bit integers; with this bound no amount, limit or limited
bucket comes near that, and an absurd amount is an invalid event instead of a crash."""
MAX_MINOR = 10**MAX_DIGITS - 1


class AmountError(ValueError):
    """The text is not a usable amount; the message says why."""


def to_decimal(value: object) -> Decimal:
    """Parse a decimal string, an int or a decoded JSON number literal into a Decimal.

    Strings are ASCII decimals (``12.50``, ``-3``, ``1e5``; surrounding blanks ignored):
    not ``1_000`` nor other scripts' digits, which ``Decimal`` itself would take.
    """
    if isinstance(value, bool):
        raise AmountError("must be a decimal string or number, not a boolean")
    if isinstance(value, int):
        number = Decimal(value)
    elif isinstance(value, Decimal):
        number = value
    elif isinstance(value, str):
        text = value.strip(JSON_BLANKS)
        if not _DECIMAL.fullmatch(text):
            raise AmountError(f"{value!r} is not a decimal number")
        try:
            number = Decimal(text)
        except InvalidOperation:  # an exponent of 10**18 or more: no Decimal holds it
            if text.lower().rpartition("e")[2].startswith("-"):
                raise _too_fine(value) from None
            raise _too_large(value) from None
    else:
        raise AmountError(f"must be a decimal string or number, got {type(value).__name__}")
    if not number.is_finite():
        raise AmountError(f"{value!r} is not a finite decimal number")
    # no amount in any currency is this large or this fine (minor units have <= 3 digits),
    # and arithmetic on an exponent like 1e999999999 overflows Decimal's context
    if number and number.adjusted() >= MAX_DIGITS:
        raise _too_large(value)
    if number and number.adjusted() < -MAX_DIGITS:
        raise _too_fine(value)
    return number


def to_minor(value: object, exponent: int, *, allow_zero: bool = False) -> int:
    """Convert an amount to minor units, refusing sub-minor-unit precision.

    ``exponent`` is the currency's number of fraction digits. The check is on the value,
    so ``"10.50"`` and ``"10.500"`` are both 1050 cents, while ``"10.005"`` is refused.
    """
    if isinstance(value, str):
        match = _PLAIN.fullmatch(value)
        if match is not None:  # fast path for the usual "123.45"
            whole, frac = match.group(1), match.group(2) or ""
            frac_trimmed = frac.rstrip("0")
            if len(frac_trimmed) > exponent:
                raise AmountError(
                    f"{value!r} has more than {exponent} fraction digit(s) for this currency"
                )
            minor = int(whole) * 10**exponent + (int(frac_trimmed.ljust(exponent, "0") or "0"))
            return _check_sign(minor, value, allow_zero)
    number = to_decimal(value)
    if not number:  # any zero, before its exponent makes an int: 10**(10**12) for 0e999999999999
        return _check_sign(0, value, allow_zero)
    if number < 0:
        raise _not_positive(value, allow_zero)
    if number and number.adjusted() + exponent >= MAX_DIGITS:  # before building the int
        raise _too_large(value)
    # on the digits themselves: Decimal arithmetic (``scaleb``) rounds to 28 significant
    # digits, which made 1.0000000000000000000000000001 CNY pass as 1.00
    _, digits, exp = number.as_tuple()
    assert isinstance(exp, int)  # finite
    shift = exp + exponent
    if shift < 0:
        if any(digits[shift:]):
            raise AmountError(
                f"{value!r} has more than {exponent} fraction digit(s) for this currency"
            )
        # only zeros past the minor unit: drop them before building the int, which is
        # then at most MAX_DIGITS digits (int() of a string refuses over 4,300 digits)
        digits, shift = digits[:shift], 0
    minor = int("".join(map(str, digits)) or "0") * 10**shift
    return _check_sign(minor, value, allow_zero)


TEXT_DIGITS: Final = 4300
"""Most digits of a number's text (``number_text``): Python's limit on an integer's
(``sys.get_int_max_str_digits``), past which a JSON integer is refused as well."""


def number_text(number: Decimal) -> str | None:
    """The one text of a number's value, for comparing numbers as text: ``77``, ``77.0``
    and ``7.7e1`` are all ``77``; ``0.50`` is ``0.5``; ``1e64`` is a 1 and 64 zeros, as
    the JSON integer of that value is. None for a number whose text would have more than
    ``TEXT_DIGITS`` digits (``1e999999999``): it has no text to compare or count by.

    (Numbers past 64 digits were written ``1E+64``: a text equal to no integer's, and to
    the string "1E+64", which was then counted as the same card.)"""
    stripped = without_trailing_zeros(number)
    _, digits, exp = stripped.as_tuple()
    assert isinstance(exp, int)  # finite
    if max(len(digits) + exp, 1) + max(-exp, 0) > TEXT_DIGITS:
        return None
    return format(stripped, "f")


def exact_text(number: Decimal) -> str:
    """``number`` without trailing zeros, as ``Decimal.normalize()`` writes it but never
    rounded (``normalize`` rounds to 28 significant digits): equal values, equal text."""
    return str(without_trailing_zeros(number))


def without_trailing_zeros(number: Decimal) -> Decimal:
    """The same value with its coefficient's trailing zeros moved to the exponent (zero:
    plain 0), built from its digits: nothing rounded."""
    sign, digits, exp = number.as_tuple()
    assert isinstance(exp, int)  # finite
    end = len(digits)
    while end > 1 and digits[end - 1] == 0:
        end -= 1
    if end == 1 and digits[0] == 0:
        return Decimal(0)
    return Decimal((sign, digits[:end], exp + len(digits) - end))


def _check_sign(minor: int, value: object, allow_zero: bool) -> int:
    if minor < 0 or (minor == 0 and not allow_zero):
        raise _not_positive(value, allow_zero)
    if minor > MAX_MINOR:
        raise _too_large(value)
    return minor


def _not_positive(value: object, allow_zero: bool) -> AmountError:
    return AmountError(f"{value!r} must be {'>= 0' if allow_zero else '> 0'}")


def _too_large(value: object) -> AmountError:
    return AmountError(f"{value!r} is too large: at most {MAX_DIGITS} digits in minor units")


def _too_fine(value: object) -> AmountError:
    return AmountError(f"{value!r} has more fraction digits than any currency allows")


def amount_text(minor: int, exponent: int) -> str:
    """A positive amount's value as rules scope and match by it: ``number_text`` of
    ``minor / 10**exponent``, so ``"100.00"``, ``"0100.0"`` and the JSON number
    ``100.00`` are all ``100``, and ``"12.50"`` is ``12.5``."""
    digits = str(minor)
    if exponent == 0:
        return digits
    if len(digits) <= exponent:
        digits = "0" * (exponent + 1 - len(digits)) + digits
    fraction = digits[-exponent:].rstrip("0")
    return digits[:-exponent] + "." + fraction if fraction else digits[:-exponent]


def format_minor(minor: int, exponent: int) -> str:
    """Render minor units as a plain decimal string with exactly ``exponent`` digits."""
    if exponent == 0:
        return str(minor)
    if minor < 0:
        return "-" + format_minor(-minor, exponent)
    digits = str(minor)
    if len(digits) <= exponent:
        digits = "0" * (exponent + 1 - len(digits)) + digits
    return digits[:-exponent] + "." + digits[-exponent:]
