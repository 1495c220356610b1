"""Reading a device profile's JSON fields (`topoprof.model.compute.profile.profile_from_dict`), each
checked, with one-line errors: FILE: SECTION[i]: what is wrong."""
from __future__ import annotations

import math
from typing import Any

from topoprof.errors import InputError
from topoprof.model.compute.profile_records import FreshPages, Machine, OptimizerRate


class Reader:
    """Field checks with one-line errors: FILE: SECTION[i]: what is wrong."""

    def __init__(self, where: str):
        self.where = where

    def fail(self, what: str) -> InputError:
        return InputError(f"{self.where}: {what}")

    def obj(self, value: Any, name: str) -> dict:
        if not isinstance(value, dict):
            raise self.fail(f"{name} must be an object")
        return value

    def entries(self, value: Any, name: str):
        if not isinstance(value, list):
            raise self.fail(f"{name} must be a list")
        for i, entry in enumerate(value):
            yield f"{name}[{i}]", self.obj(entry, f"{name}[{i}]")

    def _get(self, entry: dict, key: str, where: str) -> Any:
        if key not in entry:
            raise self.fail(f"{where}: missing {key!r}")
        return entry[key]

    def positive(self, entry: dict, key: str, where: str) -> float:
        value = self._get(entry, key, where)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or math.isinf(value):
            raise self.fail(f"{where}: {key} must be a positive number, got {value!r}")
        return float(value)

    def count(self, entry: dict, key: str, where: str) -> int:
        value = self._get(entry, key, where)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise self.fail(f"{where}: {key} must be a positive integer, got {value!r}")
        return value

    def text(self, entry: dict, key: str, where: str) -> str:
        value = self._get(entry, key, where)
        if not isinstance(value, str) or not value:
            raise self.fail(f"{where}: {key} must be a non-empty string, got {value!r}")
        return value

    def span(self, value: Any, where: str) -> tuple[float, float]:
        ok = isinstance(value, list) and len(value) == 2 and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 and not math.isinf(v) for v in value)
        if not ok or value[0] > value[1]:
            raise self.fail(f"{where}: must be [low, high] with 0 < low <= high, got {value!r}")
        return float(value[0]), float(value[1])

    def flag(self, entry: dict, key: str, where: str) -> bool:
        value = self._get(entry, key, where)
        if not isinstance(value, bool):
            raise self.fail(f"{where}: {key} must be true or false, got {value!r}")
        return value

    def machine(self, value: Any) -> Machine:
        m = self.obj(value, "machine")
        known = {f for f in Machine.__dataclass_fields__}
        fields = {k: v for k, v in m.items() if k in known}
        self.text(m, "kind", "machine")
        self.text(m, "device", "machine")
        fields["missing"] = {str(k): str(v) for k, v in self.obj(m.get("missing", {}), "machine.missing").items()}
        return Machine(**fields)

    def optimizer(self, value: Any) -> OptimizerRate:
        o, w = self.obj(value, "optimizer"), "optimizer"
        return OptimizerRate(self.text(o, "name", w), self.count(o, "params", w), self.count(o, "bytes_per_step", w),
                             self.positive(o, "seconds", w), self.positive(o, "bytes_per_s", w))

    def pages(self, value: Any) -> FreshPages:
        c, w = self.obj(value, "cpu"), "cpu"
        rate = self._get(c, "fresh_page_s_per_byte", w)
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or rate < 0:
            raise self.fail(f"cpu: fresh_page_s_per_byte must be a number >= 0, got {rate!r}")
        return FreshPages(float(rate), self.count(c, "fresh_page_min_bytes", w), str(c.get("how", "")))
