"""Inert stand-in modules for a peer's heavy runtime, so that its loss code can be imported and
run here (tests/python/test_verl.py, test_trl.py). Nothing on a loss's path is replaced: the
stand-ins only satisfy imports of packages the losses never call.

    sys.meta_path.insert(0, StandIns({"ray", "transformers"}))
"""
import importlib.abc
import importlib.machinery
import types


class Inert(type):
    """A stand-in class: any attribute is another stand-in (of the same kind); calling it with one
    callable returns that callable (decorators such as ray.remote), otherwise the class itself.
    With ``available = False`` an ``is_*_available()`` check returns False (optional
    integrations stay off)."""

    available = True

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return type(cls)(name, (), {})

    def __call__(cls, *args, **kwargs):
        if not type(cls).available and cls.__name__.startswith("is_") and cls.__name__.endswith("_available"):
            return False
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]
        return cls


class InertModule(types.ModuleType):
    inert = Inert

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return self.inert(name, (), {})


class StandIns(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves an inert module for every import under ``roots`` (top-level names) and under the
    dotted ``prefixes``. ``inert`` is the stand-in class kind; ``prepare(module)`` may add real
    attributes (a version, a base class) to a module it serves."""

    def __init__(self, roots, prefixes=(), inert=Inert, prepare=None):
        self.roots, self.prefixes, self.inert, self.prepare = set(roots), tuple(prefixes), inert, prepare

    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in self.roots or any(name == p or name.startswith(p + ".") for p in self.prefixes):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = InertModule(spec.name)
        module.inert = self.inert
        return module

    def exec_module(self, module):
        module.__path__ = []
        if self.prepare is not None:
            self.prepare(module)


def _find_peer_or_skip(package, test, require_env):
    """The import spec of an installed peer ``package``. Without it the test is skipped (exit code
    0, with a message) unless the environment variable ``require_env`` is set (an error)."""
    import importlib.util
    import os
    import sys

    spec = importlib.util.find_spec(package)
    if spec is None:
        if os.environ.get(require_env):
            raise SystemExit(f"{test}: {package} is not installed ({require_env} is set)")
        print(f"{test}: {package} is not installed; skipped")
        sys.exit(0)
    return spec


def import_peer_or_skip(package, modules, standins, test, require_env):
    """Imports ``modules`` (dotted names) of an installed peer ``package`` behind ``standins`` and
    returns them (skipped as _find_peer_or_skip says)."""
    import importlib
    import sys

    _find_peer_or_skip(package, test, require_env)
    sys.meta_path.insert(0, standins)
    return [importlib.import_module(m) for m in modules]


def load_peer_module_or_skip(package, subpackage, module, standins, test, require_env):
    """Imports ``package.subpackage.module`` of an installed peer behind ``standins`` without
    running the ``__init__`` files of ``package`` and ``package.subpackage`` (bare package modules
    stand in their place, so only the module and what it imports run: the loss code without the
    trainers and kernels the package's ``__init__`` pulls in). Skipped as _find_peer_or_skip says."""
    import importlib
    import os
    import sys
    import types

    root = _find_peer_or_skip(package, test, require_env).submodule_search_locations[0]
    sys.meta_path.insert(0, standins)
    for name, path in ((package, root), (f"{package}.{subpackage}", os.path.join(root, subpackage))):
        bare = types.ModuleType(name)
        bare.__path__ = [path]
        sys.modules[name] = bare
    return importlib.import_module(f"{package}.{subpackage}.{module}")
