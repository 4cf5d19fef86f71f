import evaluate
from evaluate.utils import launch_gradio_widget

module = evaluate.load("confidence_auroc.py")
launch_gradio_widget(module)
