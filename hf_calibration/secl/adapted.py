"""``AdaptedModel``: a ``peft.PeftModel`` used like the transformers model it adapts (the base class of
``mixin.SECLModel``)."""

from __future__ import annotations


class AdaptedModel:
    """A ``peft.PeftModel`` used like the model it adapts.

    ``generate`` is the PeftModel's (plain generation with the adapter on). Calling the object runs the adapted
    transformers model (``peft_model.get_base_model()``, into which PEFT injected the LoRA layers in place: for
    LoRA the PeftModel's forward is that call), and every attribute this class does not define (``config``,
    ``generation_config``, ``named_parameters``, ``training``, hooks, …) is looked up on it. ``eval``, ``train`` and
    ``to`` act on the whole PeftModel and return this object, so chained calls keep it.
    """

    def __init__(self, peft_model):
        from peft import PeftModel

        if not isinstance(peft_model, PeftModel):
            raise TypeError(f"peft_model: must be a peft.PeftModel, got {type(peft_model).__name__}")
        self.peft_model = peft_model

    def __getattr__(self, name):
        if name == "peft_model":  # not set yet: no recursion while the object is being built
            raise AttributeError(name)
        return getattr(self.peft_model.get_base_model(), name)

    def __call__(self, *args, **kwargs):
        return self.peft_model.get_base_model()(*args, **kwargs)

    def generate(self, *args, **kwargs):
        return self.peft_model.generate(*args, **kwargs)

    def eval(self):
        self.peft_model.eval()
        return self

    def train(self, mode: bool = True):
        self.peft_model.train(mode)
        return self

    def to(self, *args, **kwargs):
        self.peft_model.to(*args, **kwargs)
        return self
