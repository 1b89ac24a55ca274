"""Records to token ids and loss weights, with a Hugging Face tokenizer the user has on disk.

A record is one of (the field names TRL and Hugging Face datasets use):

- `{"text": ...}`: every token is learned (pretraining text; a line of a .txt file);
- `{"prompt": ..., "completion": ...}`: the prompt's tokens, then the completion's and EOS;
- `{"messages": [{"role": ..., "content": ...}, ...]}`: a chat, rendered by the tokenizer's chat
  template; each assistant turn is the span its template adds after the generation prompt.

With `completion_only=True`, only completions (assistant turns) carry loss; prompts, system and
user turns and the template's markup around them are read by the model but not learned. With
None (TRL's defaults: `completion_only_loss=None`, `assistant_only_loss=False`) a prompt is not
learned and a chat is learned whole; with False every token is learned.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from fitjax._optional import require

KINDS = ("text", "prompt/completion", "messages")
# a saved Hugging Face tokenizer's vocabulary, one of them at least (fast, sentencepiece, BPE,
# WordPiece): without one transformers guesses a class and fails naming sentencepiece
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "spiece.model", "sentencepiece.bpe.model",
                   "vocab.txt")


def load_tokenizer(tokenizer: Any) -> Any:
    """A transformers tokenizer from a local folder (`save_pretrained`'s), or `tokenizer` itself
    when it is a transformers tokenizer or a `tokenizers.Tokenizer`."""
    if isinstance(tokenizer, (str, os.PathLike)):
        path = os.path.expanduser(os.fspath(tokenizer))
        if not os.path.isdir(path):
            raise FileNotFoundError(
                f"`tokenizer={tokenizer!r}` is not a folder; pass the folder a tokenizer was saved in "
                "(`tokenizer.save_pretrained(folder)`, a Hugging Face model folder), or a tokenizer object.")
        require("transformers", "tokenizers", feature=f"`tokenizer={tokenizer!r}` (a saved Hugging Face tokenizer)")
        if not any(os.path.isfile(os.path.join(path, name)) for name in TOKENIZER_FILES):
            held = sorted(os.listdir(path))
            raise FileNotFoundError(
                f"`tokenizer={tokenizer!r}` holds no tokenizer: none of {list(TOKENIZER_FILES)} is in the folder "
                f"(it holds {held[:8] + ['...'] if len(held) > 8 else held}). Pass the folder a tokenizer was saved "
                "in (`tokenizer.save_pretrained(folder)`), or download the model's with `huggingface-cli download "
                "NAME --local-dir DIR`.")
        from transformers import AutoTokenizer  # noqa: PLC0415 - only for text data

        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    if callable(getattr(tokenizer, "encode", None)):
        return tokenizer
    raise TypeError(f"`tokenizer` must be a folder holding a saved Hugging Face tokenizer, a transformers "
                    f"tokenizer or a tokenizers.Tokenizer; received {tokenizer!r}.")


class Encoder:
    """Turns records into `(ids, weights)`: int32 token ids and 1/0 for tokens that carry loss."""

    def __init__(self, tokenizer: Any, *, completion_only: bool | None) -> None:
        self.tokenizer = tokenizer
        self.completion_only = completion_only
        self._prompt_learned = completion_only is False  # None: TRL's default, the completion alone
        self._chat_masked = completion_only is True
        self._fast = not hasattr(tokenizer, "apply_chat_template")  # a bare `tokenizers.Tokenizer`
        if not self._fast and getattr(tokenizer, "chat_template", None):  # rendered by transformers with jinja2
            require("jinja2", feature="the tokenizer's chat template")
        self.eos_id = None if self._fast else tokenizer.eos_token_id
        if self._fast:
            eos = next((t for t in ("</s>", "<|endoftext|>", "<eos>") if tokenizer.token_to_id(t) is not None), None)
            self.eos_id = None if eos is None else tokenizer.token_to_id(eos)

    def ids(self, text: str, *, special: bool) -> list[int]:
        if self._fast:
            return list(self.tokenizer.encode(text, add_special_tokens=special).ids)
        return list(self.tokenizer(text, add_special_tokens=special)["input_ids"])

    def __call__(self, record: Any, where: str) -> tuple[np.ndarray, np.ndarray]:
        if not isinstance(record, dict):
            raise ValueError(f"{where} is {record!r}; a record is an object with 'text', 'prompt' and "
                             "'completion', or 'messages'.")
        if "messages" in record:
            ids, weights = self._chat(record["messages"], where)
        elif "prompt" in record and "completion" in record:
            prompt = self.ids(str(record["prompt"]), special=True)
            completion = self.ids(str(record["completion"]), special=False) + self._eos()
            ids = prompt + completion
            weights = [int(self._prompt_learned)] * len(prompt) + [1] * len(completion)
        elif "text" in record:
            ids = self.ids(str(record["text"]), special=True)
            if self.eos_id is not None and (not ids or ids[-1] != self.eos_id):
                ids = ids + [self.eos_id]  # a document ends: the model learns to stop
            weights = [1] * len(ids)
        else:
            raise ValueError(f"{where} has the fields {sorted(record)}; a record needs 'text', 'prompt' and "
                             "'completion', or 'messages' (a list of {'role', 'content'}). Rename the fields "
                             "when writing the file.")
        return np.asarray(ids, np.int32), np.asarray(weights, np.float32)

    def _eos(self) -> list[int]:
        return [] if self.eos_id is None else [self.eos_id]

    def _render(self, messages: list, **options: Any) -> list[int]:
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, **options)
        return self.ids(text, special=False)  # the template writes its own BOS

    def _chat(self, messages: Any, where: str) -> tuple[list[int], list[int]]:
        if self._fast or not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(
                f"{where} is a chat ('messages'), but the tokenizer has no chat template to render it. Use "
                "a tokenizer saved with one (an instruct model's), set `tokenizer.chat_template = ...` "
                "before passing it, or write the records as 'prompt'/'completion'.")
        if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m for m in messages):
            raise ValueError(f"{where}['messages'] is {messages!r}; it must be a list of "
                             "{'role': ..., 'content': ...} dicts.")
        ids = self._render(messages)
        weights = [0 if self._chat_masked else 1] * len(ids)
        if not self._chat_masked:
            return ids, weights
        for turn, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            # the turn is what the template adds between the generation prompt and the turn's end
            start = len(self._render(messages[:turn], add_generation_prompt=True)) if turn else 0
            end_ids = self._render(messages[: turn + 1])
            if ids[: len(end_ids)] != end_ids:
                raise ValueError(
                    f"{where}: the tokenizer's chat template renders the chat up to turn {turn} differently "
                    "from the start of the whole chat, so the assistant's tokens cannot be located; "
                    "completion_only=True needs a template whose earlier turns do not change as turns are "
                    "added. Use completion_only=False, or write the records as 'prompt'/'completion'.")
            weights[start: len(end_ids)] = [1] * (len(end_ids) - start)
        return ids, weights
