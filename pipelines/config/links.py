"""A host link's rate: what a cell's ``network`` names (``unshaped``, ``1gbit``, ``250mbit``) and the
``tc tbf`` parameters that shape an emulated link to it (``pipelines.cluster.emulated``: why these).
Imports nothing of the project: the config and the what-if model parse rates with it."""

from __future__ import annotations

import re
from dataclasses import dataclass

_RATE = re.compile(r"^(\d+(?:\.\d+)?)(mbit|gbit)$")
# tc tbf below 1 Mbit/s rounds toward 0 and crawls (a cell with no timeout holding the host lock);
# above 100 Gbit/s a veth pair is the limit, not the shaping
MIN_RATE, MAX_RATE = 10**6, 100 * 10**9
_ALLOWED = ("'unshaped', '10gbit', '1gbit', '100mbit', or a rate '<number>mbit' / '<number>gbit' "
            "from 1mbit to 100gbit (e.g. '250mbit', '2gbit')")


@dataclass(frozen=True)
class NetworkSpec:
    """A host link's bandwidth: ``bits_per_second`` None means unshaped (veth speed)."""

    text: str
    bits_per_second: int | None

    @classmethod
    def parse(cls, value: str | NetworkSpec) -> NetworkSpec:
        if isinstance(value, NetworkSpec):
            return value
        text = str(value).strip().lower()
        if text == "unshaped":
            return cls(text, None)
        match = _RATE.match(text)
        if not match or float(match.group(1)) <= 0:
            raise ValueError(f"network must be {_ALLOWED}; got {value!r}")
        scale = 10**6 if match.group(2) == "mbit" else 10**9
        rate = round(float(match.group(1)) * scale)
        if not MIN_RATE <= rate <= MAX_RATE:
            raise ValueError(f"network {value!r}: the rate must be from 1mbit to 100gbit; got {rate / 10**6:g} Mbit/s")
        return cls(text, rate)

    def tbf_args(self) -> list[str]:
        """``tc ... tbf`` parameters for this rate (``pipelines.cluster.emulated``'s docstring says why these)."""
        if self.bits_per_second is None:
            return []
        burst = max(64 * 1024, self.bits_per_second // 8 // 1000)
        return ["rate", f"{self.bits_per_second}bit", "burst", str(burst), "latency", "50ms"]
