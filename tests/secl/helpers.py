"""Tokenizers that lack the tokens the confidence signals read (for the bad-input tests)."""

from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast


def tokenizer_from_words(corpus: str) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.train_from_iterator([corpus], trainer=trainers.WordLevelTrainer(special_tokens=["<unk>", "<pad>"]))
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>")
