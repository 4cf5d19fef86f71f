import evaluate
from evaluate.utils import launch_gradio_widget

module = evaluate.load("negative_log_likelihood.py")
launch_gradio_widget(module)
