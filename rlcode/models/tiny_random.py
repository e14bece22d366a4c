"""A tiny random-weight causal LM for unit tests and smoke configs, built offline in about a second.

2 layers, 64 wide, Qwen2 architecture, weights drawn from a fixed seed; its tokenizer is a
byte-level BPE trained on a small built-in corpus of Python, so any text round-trips and code
tokenizes into a few hundred ids. It has a ChatML template and distinct eos / pad tokens, like the
instruct models it stands in for.
"""

from __future__ import annotations

from pathlib import Path

from rlcode.models.aliases import TINY_RANDOM_ALIAS, TINY_RANDOM_LARGE_VOCABULARY_ALIAS, alias_folder
from rlcode.models.atomic_folder import build_folder_once
from rlcode.models.embedded_smollm2 import smollm2_folder

SEED = 0
VOCAB_SIZE = 512
PAD_TOKEN = "<|endoftext|>"
BOS_TOKEN = "<|im_start|>"
EOS_TOKEN = "<|im_end|>"
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Written for this module (not from any data set): enough Python to learn common merges.
_CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "def is_even(number):\n    return number % 2 == 0\n",
    "def reverse_words(text):\n    return ' '.join(reversed(text.split()))\n",
    "def count_vowels(word):\n    count = 0\n    for letter in word:\n        if letter in 'aeiou':\n"
    "            count += 1\n    return count\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n"
    "        self.items.append(item)\n\n    def pop(self):\n        return self.items.pop()\n",
    "import math\n\ndef area_of_circle(radius):\n    return math.pi * radius ** 2\n",
    "def find_max(values):\n    best = values[0]\n    for value in values[1:]:\n        if value > best:\n"
    "            best = value\n    return best\n",
    "assert add(2, 3) == 5\nassert is_even(4) is True\nassert find_max([1, 7, 3]) == 7\n",
    "```python\ndef square(x):\n    return x * x\n```\n",
    "You are an expert Python programmer. Write a function that returns the sum of a list.\n",
    "while index < len(items):\n    total = total + items[index]\n    index = index + 1\n",
    "result = {key: value for key, value in pairs if value is not None}\nprint(result)\n",
]


def tiny_random_folder() -> Path:
    """Return the cached Hugging Face folder of the tiny random model, building it if missing."""
    return build_folder_once(alias_folder(TINY_RANDOM_ALIAS), _build_into)


def build_tiny_tokenizer():
    """Train the byte-level BPE tokenizer (deterministic) and wrap it for transformers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[PAD_TOKEN, BOS_TOKEN, EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(_CORPUS, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        padding_side="left",
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


def tiny_random_large_vocabulary_folder() -> Path:
    """The same tiny model with SmolLM2's 49k-token tokenizer (the TRL step-throughput peer's model).

    A large vocabulary makes the output projection and sampling weigh as they do in real models.
    Needs the embedded SmolLM2 (its tokenizer), which it builds first if missing.
    """

    def build(folder: Path) -> None:
        from transformers import AutoTokenizer

        _build_into(folder, AutoTokenizer.from_pretrained(smollm2_folder()))

    return build_folder_once(alias_folder(TINY_RANDOM_LARGE_VOCABULARY_ALIAS), build)


def _build_into(folder: Path, tokenizer=None) -> None:
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    tokenizer = tokenizer if tokenizer is not None else build_tiny_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        # Far above the usual 0.02 so the untrained model's greedy output varies with the prompt
        # (at 0.02 every prompt decodes to one repeated token, which tests cannot tell apart).
        initializer_range=0.3,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(SEED)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
