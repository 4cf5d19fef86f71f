import evaluate
from evaluate.utils import launch_gradio_widget

module = evaluate.load("calibration_brier_score.py")
launch_gradio_widget(module)
