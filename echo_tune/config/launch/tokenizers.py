"""Vocabulary sizes of the tokenizers real Megatron-LM launch lines name instead of ``--vocab-size``.

Megatron builds the tokenizer (megatron/core/tokenizers/utils/build_tokenizer.py at d98e8a64ddf3) and
pads ``tokenizer.vocab_size`` to a multiple of ``--make-vocab-size-divisible-by`` x TP
(training/vocab_utils.py); echo-tune needs the unpadded size without the tokenizer files, so it looks
it up here. Each size is the tokenizer's own length, with its source:

- ``GPT2BPETokenizer``: 50,257 tokens (GPT-2's vocab.json; Radford et al. 2019), Megatron's GPT examples.
- ``Llama2Tokenizer``: 32,000 (Llama 2 tokenizer.model; Touvron et al. 2023, arXiv 2307.09288).
- ``TikTokenizer``: 131,072 when ``--vocab-size`` is not given (Megatron's DEFAULT_TIKTOKEN_MAX_VOCAB =
  2**17 in core/tokenizers/text/libraries/tiktoken_tokenizer.py).
- ``HuggingFaceTokenizer`` / ``SentencePieceTokenizer`` / ``GPTSentencePieceTokenizer`` with a known
  ``--tokenizer-model`` (matched by the last path components, case-insensitive):
  Llama 3 / 3.1 / 3.2 / 3.3: 128,256 (Llama Team 2024, arXiv 2407.21783, sec. 3.1);
  Mistral 7B and Mixtral 8x7B / 8x22B v0.1: 32,000 (their tokenizer.model; Jiang et al. 2023/2024);
  Mistral NeMo (Tekken): 131,072 (its tokenizer.json); Qwen2 / Qwen2.5: 151,665 = 151,643 BPE tokens +
  22 special tokens (Qwen2 technical report arXiv 2407.10671 and tokenizer_config.json);
  Nemotron-4 (nemotron_2_256k.model): 256,000 (Nemotron-4 15B report, arXiv 2402.16819).

Anything else (e.g. DeepSeek, whose tokenizer length differs from its padded embedding size) is not
guessed: one line asks for ``--vocab-size``.
"""

from __future__ import annotations

from echo_tune.errors import ConfigError

FIXED_VOCAB = {"GPT2BPETokenizer": 50257, "Llama2Tokenizer": 32000, "TikTokenizer": 131072}
MODEL_FILE_VOCAB = (  # (substring of the lower-cased --tokenizer-model, vocabulary size)
    ("llama-3", 128256), ("llama3", 128256),
    ("mixtral-8x", 32000), ("mistral-7b", 32000), ("mistral-nemo", 131072),
    ("qwen2", 151665),
    ("nemotron_2_256k", 256000),
)
VOCAB_SIZE_TOKENIZERS = ("NullTokenizer", "TikTokenizer")
"""The tokenizers Megatron sizes from --vocab-size (build_tokenizer.py); the others bring their own length."""
MODEL_FILE_TOKENIZERS = ("HuggingFaceTokenizer", "SentencePieceTokenizer", "GPTSentencePieceTokenizer")


def tokenizer_vocab_size(tokenizer_type: str | None, tokenizer_model: str | None) -> int:
    """The unpadded vocabulary of a tokenizer a launch line names, or a one-line ConfigError."""
    if tokenizer_type in FIXED_VOCAB:
        return FIXED_VOCAB[tokenizer_type]
    if tokenizer_type in MODEL_FILE_TOKENIZERS and tokenizer_model:
        name = tokenizer_model.lower()
        for fragment, size in MODEL_FILE_VOCAB:
            if fragment in name:
                return size
    what = f"--tokenizer-type {tokenizer_type}" + (f" --tokenizer-model {tokenizer_model}" if tokenizer_model else "")
    raise ConfigError(f"the vocabulary size of ({what}) is not known to echo-tune; add --vocab-size N "
                      f"(the tokenizer's length before padding)")
