"""A table of name -> "package.module:Class", each class imported only where it is used (as verl's rollout
registry): mle_jax/executor/registry.py's sandbox backends, mle_jax/sampling/registry.py's samplers.

The table imports nothing, so settings check a configured name against it without loading the backend; `resolve`
imports the class on use. Every class carries its `name`, the key it is registered under (`resolve` checks it).
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Mapping

_IMPORT_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")


class ClassRegistry:
    """Named classes of one kind. field: the config field that names one ("executor.backend"), for messages."""

    def __init__(self, field: str, paths: Mapping[str, str]) -> None:
        self.field = field
        self._paths: dict[str, str] = {}
        for name, path in paths.items():
            self.register(name, path)

    def register(self, name: str, path: str) -> None:
        """Adds `name` -> `path` ("package.module:Class"); nothing is imported until `resolve(name)`.
        ValueError: a path of another form, or a name registered already to another path."""
        if not _IMPORT_PATH.match(path):
            raise ValueError(f"{self.field} {name!r}: {path!r} is not an import path 'package.module:Class'")
        if self._paths.get(name, path) != path:
            raise ValueError(f"{self.field} {name!r} is registered already, as {self._paths[name]}")
        self._paths[name] = path

    def unregister(self, name: str) -> None:
        """Removes `name` (KeyError if it is not registered)."""
        del self._paths[name]

    def names(self) -> tuple[str, ...]:
        """The registered names, in registration order."""
        return tuple(self._paths)

    def paths(self) -> dict[str, str]:
        """A copy of the table: name -> "package.module:Class"."""
        return dict(self._paths)

    def check(self, name: str) -> None:
        """ValueError in one line listing the registered names when `name` is not one of them."""
        if name not in self._paths:
            raise ValueError(f"{self.field}={name!r} is unknown: use one of {', '.join(self._paths)}")

    def resolve(self, name: str) -> type:
        """The class registered as `name`, imported now. ValueError: an unknown name; TypeError: a class whose
        `name` is not its key."""
        self.check(name)
        module, _, attr = self._paths[name].partition(":")
        cls = getattr(importlib.import_module(module), attr)
        if getattr(cls, "name", None) != name:
            raise TypeError(
                f"{self._paths[name]} is registered as {self.field}={name!r} but its name is "
                f"{getattr(cls, 'name', None)!r}"
            )
        return cls
