"""The task registry: name -> Task class. Third parties register through the
entry-point group `harness.tasks` or by calling `register_task` directly."""

from __future__ import annotations

import difflib
from importlib.metadata import entry_points
from typing import Callable

from tasks.base import Task

_TASKS: dict[str, type[Task]] = {}
_entry_points_loaded = False


class UnknownTaskError(ValueError):
    """Raised for a task name that is not registered; carries the valid names."""

    def __init__(self, name: str, valid: list[str]):
        close = difflib.get_close_matches(name, valid, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        super().__init__(f"unknown task {name!r}; valid tasks: {', '.join(valid)}.{hint}")
        self.name, self.valid, self.closest = name, valid, (close[0] if close else None)


def register_task(name: str) -> Callable[[type[Task]], type[Task]]:
    """Class decorator registering a Task subclass under `name`."""

    def wrap(cls: type[Task]) -> type[Task]:
        if name in _TASKS and _TASKS[name] is not cls:
            raise ValueError(f"task name {name!r} is already registered to {_TASKS[name].__qualname__}")
        cls.name = name
        _TASKS[name] = cls
        return cls

    return wrap


def _ensure_loaded() -> None:
    global _entry_points_loaded
    import tasks.builtin  # noqa: F401

    if not _entry_points_loaded:
        _entry_points_loaded = True
        for ep in entry_points(group="harness.tasks"):
            if ep.name not in _TASKS:
                register_task(ep.name)(ep.load())


def task_names() -> list[str]:
    _ensure_loaded()
    return list(_TASKS)


def get_task(name: str) -> type[Task]:
    _ensure_loaded()
    if name not in _TASKS:
        raise UnknownTaskError(name, list(_TASKS))
    return _TASKS[name]
