"""Nsight number and unit normalization: "13,485" → 13485.0, (2.33, "Mbyte") → 2.33e6 bytes."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

_PREFIX: Mapping[str, float] = MappingProxyType(
    {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "p": 1e15}
)
_BINARY_PREFIX: Mapping[str, float] = MappingProxyType(
    {"ki": 2.0**10, "mi": 2.0**20, "gi": 2.0**30, "ti": 2.0**40}
)
_TIME_UNITS: Mapping[str, float] = MappingProxyType(
    {
        "nsecond": 1e-9,
        "ns": 1e-9,
        "usecond": 1e-6,
        "us": 1e-6,
        "msecond": 1e-3,
        "ms": 1e-3,
        "second": 1.0,
        "s": 1.0,
    }
)


def _simple_unit(unit: str) -> tuple[float, str]:
    """(scale, base unit) of a unit without ``/``; unknown units pass through with scale 1."""
    u = unit.strip()
    low = u.lower()
    if low in _TIME_UNITS:
        return _TIME_UNITS[low], "s"
    if low == "%":
        return 1.0, "%"
    for prefix, scale in _BINARY_PREFIX.items():
        for body in ("byte", "b"):
            if low == prefix + body:
                return scale, "byte"
    for prefix, scale in _PREFIX.items():
        if low == prefix + "byte":
            return scale, "byte"
        if low == prefix + "hz":
            return scale, "Hz"
    return 1.0, u


def to_base_unit(value: float, unit: str) -> tuple[float, str]:
    """``value`` in ``unit`` → (value, base unit): bytes, seconds, Hz, byte/s, percent.

    ncu's prefixes are decimal ("Mbyte" = 10⁶ bytes, "Ghz" = 10⁹ Hz); ``KiB``-style binary
    units are 2¹⁰ᵏ. A rate such as ``Gbyte/s`` or ``cycle/usecond`` scales numerator and
    denominator. Units that are counts (``cycle``, ``inst``, ``warp``, ``block``) are unchanged.
    """
    if "/" in unit:
        num, den = unit.split("/", 1)
        num_scale, num_base = _simple_unit(num)
        den_scale, den_base = _simple_unit(den)
        return value * num_scale / den_scale, f"{num_base}/{den_base}"
    scale, base = _simple_unit(unit)
    return value * scale, base


def parse_number(raw: str) -> float:
    """A number as Nsight writes it: ``"13,485"`` → 13485.0, ``"9,495.42"`` → 9495.42."""
    return float(raw.strip().replace(",", ""))
