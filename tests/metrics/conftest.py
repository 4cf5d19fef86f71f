import atexit
import os
import shutil
import tempfile

# Without this a Hub lookup spends ~47 s retrying before failing (SPEC §4).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# evaluate copies the modules it loads into a cache; keep that out of the user's home.
if "HF_MODULES_CACHE" not in os.environ:
    os.environ["HF_MODULES_CACHE"] = tempfile.mkdtemp(prefix="hf_modules_")
    atexit.register(shutil.rmtree, os.environ["HF_MODULES_CACHE"], ignore_errors=True)

import pytest  # noqa: E402

from tests.metrics.data import make_binary, make_multiclass  # noqa: E402


@pytest.fixture
def multiclass():
    return make_multiclass(3002, 4, seed=0)


@pytest.fixture
def binary():
    return make_binary(3002, seed=1)
