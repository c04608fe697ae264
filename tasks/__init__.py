"""Tasks (docs/design.md §5): each takes a mixer, a config and a device and returns a result."""

from tasks.base import RunContext, Task, TaskConfig, TaskResult
from tasks.registry import UnknownTaskError, get_task, register_task, task_names

__all__ = ["RunContext", "Task", "TaskConfig", "TaskResult", "UnknownTaskError", "get_task", "register_task", "task_names"]
