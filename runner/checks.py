"""The checking of config values: `Checks` collects a config's bad values as lines, `key=value: what is
allowed`, and raises them together as a ConfigError (what runner/config.py and training/config.py use)."""

from __future__ import annotations

import contextlib
import math
import re
from pathlib import Path

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

_ABSENT, _MISSING, _BAD = object(), object(), object()  # Checks._get's markers


class ConfigError(ValueError):
    """Bad config values: `lines` holds one `key=value: what is allowed` line per value."""

    def __init__(self, lines: list[str]):
        self.lines = list(lines)
        super().__init__("\n".join(self.lines))


def show(value) -> str:
    """A value as an override writes it (null, true, 3, abc, ???)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple, ListConfig)):
        return "[" + ",".join(show(v) for v in value) + "]"
    if isinstance(value, str) and (not value or value != value.strip()):
        return repr(value)
    return str(value)


def _bounds(what: str, lo, hi, lo_open: bool = False) -> str:
    if lo is not None and hi is not None:
        return f"{what} in {'(' if lo_open else '['}{lo}, {hi}]"
    if lo is not None:
        return f"{what} {'>' if lo_open else '>='} {lo}"
    return what if hi is None else f"{what} <= {hi}"


class Checks:
    """The bad values of one config, collected. Each method checks one key and returns its value, or None when
    the value is bad or null (so later checks can skip what depends on it)."""

    def __init__(self, cfg: DictConfig):
        self.cfg, self.errors = cfg, []

    def has(self, key: str) -> bool:
        return OmegaConf.select(self.cfg, key, default=_ABSENT, throw_on_missing=False) is not _ABSENT

    def value(self, key: str):
        """The resolved value of a key that may be absent (None then, and for ??? or an unresolvable value)."""
        v = self._get(key)
        return None if v in (_ABSENT, _MISSING, _BAD) else v

    def _get(self, key: str):
        try:
            return OmegaConf.select(self.cfg, key, default=_ABSENT, throw_on_missing=True)
        except MissingMandatoryValue:
            return _MISSING
        except OmegaConfBaseException as e:  # an interpolation that does not resolve
            self.errors.append(f"{key}: does not resolve ({str(e).splitlines()[0]})")
            return _BAD

    def _take(self, key: str, allowed: str, null: bool):
        """The value to check, or _BAD when there is nothing to check (null allowed, or already reported)."""
        v = self._get(key)
        if v is _ABSENT:
            self.errors.append(f"{key} is missing from the config: add +{key}=<{allowed.removeprefix('must be ')}>")
        elif v is _MISSING:
            self.bad(key, "???", f"is required: {allowed.removeprefix('must be ')}")
        elif not (v is None and null):
            return v
        return _BAD

    def bad(self, key: str, value, allowed: str) -> None:
        self.errors.append(f"{key}={show(value)}: {allowed}")

    def integer(self, key: str, lo: int | None = None, hi: int | None = None, null: bool = False) -> int | None:
        allowed = "must be " + _bounds("an integer", lo, hi) + (", or null" if null else "")
        v = self._take(key, allowed, null)
        if v is _BAD:
            return None
        if isinstance(v, int) and not isinstance(v, bool) and (lo is None or v >= lo) and (hi is None or v <= hi):
            return v
        self.bad(key, v, allowed)
        return None

    def number(self, key: str, lo: float | None = None, hi: float | None = None, lo_open: bool = False,
               null: bool = False) -> float | None:
        allowed = "must be " + _bounds("a number", lo, hi, lo_open) + (", or null" if null else "")
        v = self._take(key, allowed, null)
        if v is _BAD:
            return None
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and (
                lo is None or v > lo or (v == lo and not lo_open)) and (hi is None or v <= hi):
            return float(v)
        self.bad(key, v, allowed)
        return None

    def flag(self, key: str) -> bool | None:
        v = self._take(key, "must be true or false", False)
        if v is _BAD:
            return None
        if isinstance(v, bool):
            return v
        self.bad(key, v, "must be true or false")
        return None

    def choice(self, key: str, options, null: bool = False):
        allowed = "must be one of " + ", ".join(options) + (", or null" if null else "")
        v = self._take(key, allowed, null)
        if v is _BAD:
            return None
        if isinstance(v, str) and v in options:
            return v
        self.bad(key, v, allowed)
        return None

    def text(self, key: str, null: bool = False) -> str | None:
        allowed = "must be a non-empty string" + (", or null" if null else "")
        v = self._take(key, allowed, null)
        if v is _BAD:
            return None
        if isinstance(v, str) and v.strip():
            return v
        self.bad(key, v, allowed)
        return None

    def path(self, key: str, kind: str = "any", null: bool = False, what: str = "") -> Path | None:
        """An existing file (kind="file"), directory ("dir") or either ("any"); `what` says what it should hold."""
        what = what or {"file": "an existing file", "dir": "an existing directory",
                        "any": "an existing file or directory"}[kind]
        v = self._take(key, f"must be {what}" + (", or null" if null else ""), null)
        if v is _BAD:
            return None
        if not isinstance(v, str) or not v.strip():
            self.bad(key, v, f"must be the path of {what}")
            return None
        p = Path(v).expanduser()
        if not p.exists():
            self.bad(key, v, f"no such file or directory; pass {what}")
        elif kind == "file" and not p.is_file() or kind == "dir" and not p.is_dir():
            self.bad(key, v, f"not a {'file' if kind == 'file' else 'directory'}; pass {what}")
        else:
            return p
        return None

    def matching(self, key: str, pattern: str, allowed: str) -> str | None:
        """A string that matches a regular expression whole."""
        v = self._take(key, allowed, False)
        if v is _BAD:
            return None
        if isinstance(v, str) and re.fullmatch(pattern, v):
            return v
        self.bad(key, v, allowed)
        return None

    @contextlib.contextmanager
    def catching(self, key: str | None = None, value=None):
        """A check of the project's own (a ValueError whose message names the key) reported as one line."""
        try:
            yield
        except ValueError as e:
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            self.errors.append(first if key is None else f"{key}={show(value)}: {first}")

    def raise_if_bad(self) -> None:
        if self.errors:
            raise ConfigError(self.errors)
