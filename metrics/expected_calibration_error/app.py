"""The Space's page: a table of JSON cells in, the metric's result out (hf_calibration.integrations.spaces)."""

import evaluate

from hf_calibration.integrations.spaces import launch_metric_space

EXAMPLES = [["0.9", "1"], ["0.8", "0"], ["0.3", "1"], ["1.0", "1"], ["0.6", "0"]]

if __name__ == "__main__":
    launch_metric_space(evaluate.load("expected_calibration_error.py"), examples=EXAMPLES)
