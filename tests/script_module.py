"""Load a script of the repository (benchmarks/*.py, docs/gen_pages.py) as a module, for
tests of what it computes or prints."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load_script(path: Path, name: str | None = None, register: bool = False) -> ModuleType:
    """The module `path` defines, named `name` (default: the file's stem); `register` also
    puts it in `sys.modules` (for scripts other scripts import by that name), reusing one
    already there."""
    name = name or path.stem
    if register and name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    if register:
        sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
