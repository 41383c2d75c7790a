"""Where the worker's side lived before ``crossover_monitor.measure``: plugin backends and scripts written against
earlier releases import ``crossover_monitor.bench.contract`` (the backend protocol and its errors), ``.common``,
``.timing`` and the other modules the README listed there. Each old name is the same module object as its new
home, imported only when asked for (a backend's old name imports its framework then, as it did)."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType

_MEASURE = ("contract", "timing", "common", "nogpu", "runner", "worker", "registry")
_GUARD = ("guard", "rule", "nvml", "podresources", "hostinfo", "hostprobe")
_BACKENDS = ("tensorflow_backend", "torch_backend", "jax_backend")
MOVED = {
    **{name: f"crossover_monitor.measure.{name}" for name in _MEASURE},
    **{name: f"crossover_monitor.measure.guard.{name}" for name in _GUARD},
    **{name: f"crossover_monitor.measure.backends.{name}" for name in _BACKENDS},
}


class _OldNames(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``crossover_monitor.bench.NAME`` as the module that moved, the same object under both names."""

    def find_spec(
        self,
        fullname: str,
        path: object = None,  # noqa: ARG002 - the finder protocol's
        target: ModuleType | None = None,  # noqa: ARG002
    ) -> importlib.machinery.ModuleSpec | None:
        package, _, name = fullname.rpartition(".")
        if package != __name__ or name not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(MOVED[spec.name.rpartition(".")[2]])

    def exec_module(self, module: ModuleType) -> None:
        """Nothing: the module was run once, under its new name."""


if not any(isinstance(finder, _OldNames) for finder in sys.meta_path):
    sys.meta_path.insert(0, _OldNames())
