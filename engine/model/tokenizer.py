"""Tokenizers from the model folder, without remote code.

LLaDA ships a `tokenizer.json` (a plain fast tokenizer, loaded as `PreTrainedTokenizerFast`, which is
what `AutoTokenizer` resolves it to, without AutoTokenizer's look at config.json's remote auto_map).
Dream ships `vocab.json` + `merges.txt` and names a remote `DreamTokenizer`; it is a byte-level BPE
identical to Qwen2's, so it loads as transformers' Qwen2 tokenizer with the added tokens registered
from `tokenizer_config.json` / `added_tokens.json`.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import transformers

from engine.model.config import ModelConfig

logger = logging.getLogger(__name__)


class TokenizerError(RuntimeError):
    pass


def load_tokenizer(folder: str | Path, cfg: ModelConfig):
    """Returns a transformers tokenizer for the checkpoint in `folder`."""
    folder = Path(folder)
    tok_cfg_path = folder / "tokenizer_config.json"
    tok_cfg = json.loads(tok_cfg_path.read_text()) if tok_cfg_path.exists() else {}
    cls_name = tok_cfg.get("tokenizer_class", "")
    try:
        if (folder / "tokenizer.json").exists() and cls_name != "DreamTokenizer":
            tok = transformers.PreTrainedTokenizerFast.from_pretrained(str(folder))
        elif (folder / "vocab.json").exists() and (folder / "merges.txt").exists():
            qwen2 = getattr(transformers, "Qwen2TokenizerFast", None) or transformers.Qwen2Tokenizer
            tok = qwen2.from_pretrained(str(folder))
        else:
            raise TokenizerError(f"{folder} has neither tokenizer.json nor vocab.json + merges.txt")
    except (OSError, ValueError) as exc:
        raise TokenizerError(f"cannot load the tokenizer from {folder}: {exc}") from exc
    if tok.convert_tokens_to_ids(tok.convert_ids_to_tokens(cfg.mask_token_id)) != cfg.mask_token_id:
        raise TokenizerError(f"{folder}: the tokenizer does not know the mask token id "
                             f"{cfg.mask_token_id}")
    return tok


def encode_prompt(tokenizer, prompt_or_messages: str | list[dict[str, str]],
                  use_chat_template: bool = True) -> list[int]:
    """Token ids of a plain prompt, or of chat messages rendered with the model's template."""
    if isinstance(prompt_or_messages, str):
        if use_chat_template and tokenizer.chat_template:
            prompt_or_messages = [{"role": "user", "content": prompt_or_messages}]
        else:
            return tokenizer(prompt_or_messages, add_special_tokens=False)["input_ids"]
    if not tokenizer.chat_template:
        raise TokenizerError("this model has no chat template; pass a plain string prompt")
    text = tokenizer.apply_chat_template(prompt_or_messages, tokenize=False,
                                         add_generation_prompt=True)
    # The template already holds any BOS; the tokenizer must not add another.
    return tokenizer(text, add_special_tokens=False)["input_ids"]
