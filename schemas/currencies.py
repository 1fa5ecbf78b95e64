"""ISO 4217 currency codes and their minor units (fraction digits)."""

from __future__ import annotations

from typing import Final

_ZERO: Final = "BIF CLP DJF GNF ISK JPY KMF KRW PYG RWF UGX UYI VND VUV XAF XOF XPF"
_THREE: Final = "BHD IQD JOD KWD LYD OMR TND"
_FOUR: Final = "CLF UYW"
_TWO: Final = (
    "AED AFN ALL AMD ANG AOA ARS AUD AWG AZN BAM BBD BDT BGN BMD BND BOB BOV BRL BSD BTN "
    "BWP BYN BZD CAD CDF CHE CHF CHW CNY COP COU CRC CUC CUP CVE CZK DKK DOP DZD EGP ERN "
    "ETB EUR FJD FKP GBP GEL GHS GIP GMD GTQ GYD HKD HNL HTG HUF IDR ILS INR IRR JMD KES "
    "KGS KHR KPW KYD KZT LAK LBP LKR LRD LSL MAD MDL MGA MKD MMK MNT MOP MRU MUR MVR MWK "
    "MXN MXV MYR MZN NAD NGN NIO NOK NPR NZD PAB PEN PGK PHP PKR PLN QAR RON RSD RUB SAR "
    "SBD SCR SDG SEK SGD SHP SLE SLL SOS SRD SSP STN SVC SYP SZL THB TJS TMT TOP TRY TTD "
    "TWD TZS UAH USD USN UYU UZS VED VES XCD XCG YER ZAR ZMW ZWG ZWL"
)

MINOR_UNITS: Final[dict[str, int]] = {
    **dict.fromkeys(_TWO.split(), 2),
    **dict.fromkeys(_ZERO.split(), 0),
    **dict.fromkeys(_THREE.split(), 3),
    **dict.fromkeys(_FOUR.split(), 4),
}
"""Currency code → number of fraction digits allowed in amounts of that currency."""

FINEST_MINOR_UNIT: Final = max(MINOR_UNITS.values())
"""The most fraction digits any currency has (4: CLF, UYW)."""
