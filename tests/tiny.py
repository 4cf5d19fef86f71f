"""A tiny random causal LM and a word-level tokenizer trained in memory (no files, no network).

The vocabulary holds the option letters with and without a leading space, the digits 0-10, "Yes"/"No",
"True"/"False" and a few hundred words, so every scoring path of the library can run on it in
milliseconds.
"""

import torch
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_CORPUS = [
    "Question: which option is correct ? A. B. C. D. E. Answer with the letter of the correct option only.",
    "Yes No True False yes no true false Is the proposed answer correct ? Confidence : 0 1 2 3 4 5 6 7 8 9 10",
    "the a of and to in is was for on that with as by it at from this be are or an which",
    "Knowledge : magazine started first city head office hotel company family number eggs day",
    "How many bolts fiber blue white total does it take ? The answer is 42 .",
]


def make_tiny_tokenizer(chat_template: bool = True) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])
    specials = ["<unk>", "<pad>", "<|im_start|>", "<|im_end|>", "<eos>"]
    trainer = trainers.WordLevelTrainer(special_tokens=specials, min_frequency=1)
    tok.train_from_iterator(_CORPUS * 3, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>", eos_token="<eos>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
    )
    fast.padding_side = "left"
    if chat_template:
        fast.chat_template = CHAT_TEMPLATE
    return fast


def make_tiny_model(tokenizer, seed: int = 0, **overrides) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id, **{"max_position_embeddings": 512, **overrides},
    )
    return LlamaForCausalLM(config).eval()
