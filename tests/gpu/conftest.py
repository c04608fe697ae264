"""GPU test settings: each test hands its cached CUDA memory back when it ends, so that several
pytest-xdist workers (benchmarks/h200_kernels.sh TESTS_N) can share one GPU; a worker's
allocator otherwise keeps its largest test's memory for the rest of the session."""

import pytest
import torch


@pytest.fixture(autouse=True)
def release_cuda_cache():
    yield
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
