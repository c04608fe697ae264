"""The in-repo tasks: importing a module registers it. One line per task."""

import tasks.fidelity  # noqa: F401
import tasks.kernels  # noqa: F401
import tasks.lm  # noqa: F401
import tasks.lm_eval_bridge.task  # noqa: F401
import tasks.memory  # noqa: F401
import tasks.mqar  # noqa: F401
import tasks.niah  # noqa: F401
import tasks.throughput  # noqa: F401
