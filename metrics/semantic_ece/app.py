import evaluate
from evaluate.utils import launch_gradio_widget

module = evaluate.load("semantic_ece.py")
launch_gradio_widget(module)
