"""GPU test settings: each test hands its cached CUDA memory back when it ends, so that several
pytest-xdist workers (benchmarks/h200_kernels.sh TESTS_N) can share one GPU; a worker's
allocator otherwise keeps its largest test's memory for the rest of the session.

A test file computes each case's errors once per process (errors_of, cached) and checks one
quantity per test, so the tests of one case go to one worker (an xdist_group per module and
case; effective under `--dist loadgroup`, which h200_kernels.sh passes): spread over the
workers, every worker would run the case again, at its memory (the fp64 reference of a
T = 32,768 MesaNet case holds about 48 GB) and time."""

import pytest
import torch


def pytest_collection_modifyitems(items: list) -> None:
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and "case" in callspec.params:
            item.add_marker(pytest.mark.xdist_group(f"{item.module.__name__}:{callspec.params['case']}"))


@pytest.fixture(autouse=True)
def release_cuda_cache():
    yield
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
