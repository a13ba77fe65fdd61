"""The drafters, one module each, registered by `@eaglet.engine.drafter.register("<module>")` and selected by the
`drafter:` key of a conf/draft file. A drafter module may have a torch-free `<module>_config.py` beside it whose
`check_values(c)` checks its draft.* values before anything loads (runner/config.py). Nothing here imports torch."""

from __future__ import annotations

import importlib
import pkgutil


def drafter_modules() -> list[str]:
    """The drafter modules there are (engine/drafters/*.py but the *_config.py), found without importing them."""
    return sorted(m.name for m in pkgutil.iter_modules(__path__)
                  if not m.name.startswith("_") and not m.name.endswith("_config"))


def value_checks(module: str):
    """The torch-free `check_values(c)` of a drafter module's `<module>_config.py`, or None."""
    names = {m.name for m in pkgutil.iter_modules(__path__)}
    if f"{module}_config" not in names:
        return None
    return importlib.import_module(f"{__name__}.{module}_config").check_values
