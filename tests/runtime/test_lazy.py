"""``runtime.lazy``: the one home of the lazy ``__getattr__`` of ``hf_calibration.jobs``, ``gateway``, ``modeling`` and
``secl``. Checked in a fresh interpreter, where nothing was imported before."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import sys
import hf_calibration.gateway as gateway
import hf_calibration.jobs as jobs
import hf_calibration.modeling as modeling
import hf_calibration.secl as secl
# importing the packages imports none of their lazy modules
assert not any(m in sys.modules for m in ("hf_calibration.jobs.serve", "hf_calibration.gateway.app",
                                           "hf_calibration.modeling.scoring", "hf_calibration.secl.mixin",
                                           "fastapi")), sorted(m for m in sys.modules if "hf_calibration." in m)
from hf_calibration.jobs.serve import ServeConfig
assert "ServeConfig" not in vars(jobs)
assert jobs.ServeConfig is ServeConfig and vars(jobs)["ServeConfig"] is ServeConfig  # kept after the first access
from hf_calibration.gateway.config import GatewayConfig
assert gateway.GatewayConfig is GatewayConfig
from hf_calibration.modeling.scoring import score_mcqa
assert modeling.score_mcqa is score_mcqa and "score_mcqa" in modeling.__all__
assert secl.SECLModel.__module__ == "hf_calibration.secl.mixin" and vars(secl)["SECLModel"] is secl.SECLModel
for package in (jobs, gateway, modeling, secl):
    try:
        package.not_a_name
    except AttributeError as err:
        assert str(err) == f"module {package.__name__!r} has no attribute 'not_a_name'", err
    else:
        raise AssertionError("an unknown name must raise AttributeError")
assert "run_serve" in jobs.__all__ and jobs.__all__ == sorted(jobs.__all__)
assert gateway.__all__ == ["GatewayConfig", "StreamStepper", "StreamStore", "create_app", "learn_then_test"]
namespace = {}
exec("from hf_calibration.gateway import *", namespace)
assert namespace["create_app"].__module__ == "hf_calibration.gateway.app"
print("ok")
"""


def test_jobs_and_gateway_import_their_names_on_first_use():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, cwd=REPO, timeout=600,
                         env={"PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
