import evaluate
from evaluate.utils import launch_gradio_widget

module = evaluate.load("expected_calibration_error.py")
launch_gradio_widget(module)
