"""One torch thread for the SECL tests: their models are tiny, and on a loaded shared machine extra
threads only wait on each other (measured: 55 s of a 72 s test spent in 32-wide linear layers)."""

import pytest
import torch


@pytest.fixture(scope="package", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
