"""Suite-wide settings: offline libraries and one torch thread per test process (the suite
runs as two xdist workers on two cores; more threads oversubscribe the CPU and made single
test files up to 10x slower here)."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)

# Without a GPU, Triton kernels run in the interpreter. The flag must be set before any kernel
# module is imported in this process (@triton.jit reads it at decoration time), and with xdist a
# worker may import kernels from any test file first, so it is set here for the whole session.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


# The error records of tests/util.py (KERNEL_ERRORS_JSON set, as tests/error_table.py does):
# an xdist worker hands its records to the controller through workeroutput, the controller
# merges them with its own and writes the file once every worker is down.
_WORKER_ERROR_RECORDS: list[list] = []


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    _WORKER_ERROR_RECORDS.append(getattr(node, "workeroutput", {}).get("kernel_errors", []))


def pytest_sessionfinish(session):
    from tests import util

    if not util.RECORDING:
        return
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker
        workeroutput["kernel_errors"] = util.error_records()
        return
    import json

    from benchmarks.json_record import save_text

    rows = util.merge_error_records(util.error_records(), *_WORKER_ERROR_RECORDS)
    save_text(json.dumps({"records": rows}), os.environ[util.ERRORS_ENV])
