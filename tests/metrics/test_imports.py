import subprocess
import sys

CHECK = """
import sys
import hf_calibration.metrics, hf_calibration.reporting.plotting
from hf_calibration.metrics import expected_calibration_error, calibration_report
expected_calibration_error([1, 0], [0.7, 0.4])
calibration_report([1, 0], [[0.3, 0.7], [0.6, 0.4]], n_resamples=5)
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "matplotlib", "transformers", "evaluate"))
higher = ("hf_calibration.calm", "hf_calibration.secl", "hf_calibration.modeling")
layers = sorted(m for m in sys.modules if m.startswith(higher))
print(heavy, layers)
"""


def test_metrics_import_neither_torch_nor_higher_layers():
    out = subprocess.run([sys.executable, "-c", CHECK], check=True, capture_output=True, text=True).stdout
    assert out.strip() == "[] []"
