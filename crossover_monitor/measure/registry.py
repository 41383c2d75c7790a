"""Backend names to factories; imported lazily so that only the chosen framework is loaded."""

from __future__ import annotations

import importlib

from crossover_monitor.errors import BackendUnavailable
from crossover_monitor.measure.contract import Backend, BackendFactory, BackendOptions
from crossover_monitor.model import BACKENDS, BUILTIN_BACKENDS

BUILTIN = {name: f"crossover_monitor.measure.backends.{name}_backend:create" for name in BACKENDS}


def load_backend(name: str, options: BackendOptions) -> Backend:
    """Import and create the backend ``name`` (a built-in name or ``package.module:attribute``)."""
    target = BUILTIN.get(name, name)
    module_name, _, attribute = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        builtin = BUILTIN_BACKENDS.get(name)
        hint = f" (install it: pip install '{builtin.install}')" if builtin is not None else ""
        raise BackendUnavailable(name, f"cannot import {exc.name or module_name}: {exc}{hint}") from None
    factory: BackendFactory | None = getattr(module, attribute, None)
    if factory is None:
        raise BackendUnavailable(name, f"{module_name} has no attribute {attribute!r}")
    return factory(options)
