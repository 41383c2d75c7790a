"""Where the worker's side lived before crossover_monitor.measure: plugin backends written against earlier releases
import crossover_monitor.bench.contract, .common and .timing, which are the same modules under their old names."""

from __future__ import annotations

import importlib
import sys

for _old, _new in (("contract", "contract"), ("common", "common"), ("timing", "timing")):
    _module = importlib.import_module(f"crossover_monitor.measure.{_new}")
    sys.modules[f"{__name__}.{_old}"] = _module
    setattr(sys.modules[__name__], _old, _module)
