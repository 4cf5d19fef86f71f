"""The Space's page: a table of JSON cells in, the metric's result out (hf_calibration.integrations.spaces)."""

import evaluate

from hf_calibration.integrations.spaces import launch_metric_space

EXAMPLES = [['["Paris", "paris", "Lyon", "Paris"]', '["Paris"]'], ['["4", "4.0", "5", "6"]', '["5"]']]

if __name__ == "__main__":
    launch_metric_space(evaluate.load("semantic_ece.py"), examples=EXAMPLES)
