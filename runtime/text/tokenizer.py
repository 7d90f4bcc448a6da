"""A model's tokenizer: tokenizer.json through the `tokenizers` library, plus the chat template,
special tokens and stop ids from the files beside it, read the way transformers 5 reads them.

- Text <-> ids is tokenizer.json (normalizer, pre-tokenizer, model, post-processor, decoder),
  which is what transformers' fast tokenizers run, with tokenizer_config.json's added tokens
  applied over it as transformers 5 applies them (`_apply_config_added_tokens`: a flag such as
  rstrip or special set there, a named special token marked special). As in transformers 5,
  the post-processor decides whether `add_special_tokens=True` adds a BOS; tokenizer_config.json's
  `add_bos_token` is only compared with it.
- The chat template comes from, in order: a template override (a Modelfile TEMPLATE),
  chat_template.jinja plus additional_chat_templates/*.jinja, tokenizer_config.json's
  `chat_template` (a string, or a list of named templates).
- Special tokens (bos_token, eos_token, ... and any other `*_token`) are tokenizer_config.json's,
  or special_tokens_map.json's for configs without `added_tokens_decoder`; they are the variables
  a template sees.
- Stop ids are the eos token plus every `eos_token_id` of generation_config.json (an int or a
  list), or of config.json when there is no generation config.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import tokenizers

from .chat_template import ChatTemplateError, render_chat

if TYPE_CHECKING:
    from ..loading.registered import RegisteredModel

log = logging.getLogger(__name__)

STANDARD_SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
TEMPLATE_DIR = "additional_chat_templates"


class TokenizerError(ValueError):
    """A model whose tokenizer files are missing or unreadable; the message names the file."""


def _gather_files(files: Path | str | Mapping[str, Path | str]) -> dict[str, Path]:
    if isinstance(files, Mapping):
        return {str(title): Path(path) for title, path in files.items()}
    directory = Path(files)
    if not directory.is_dir():
        raise TokenizerError(f"{directory} is not a directory of model files")
    found = {p.name: p for p in directory.iterdir() if p.is_file()}
    if (directory / TEMPLATE_DIR).is_dir():
        found.update({f"{TEMPLATE_DIR}/{p.name}": p for p in (directory / TEMPLATE_DIR).glob("*.jinja")})
    return found


def _read_text(files: Mapping[str, Path], title: str, origin: str) -> str | None:
    path = files.get(title)
    if path is None:
        return None
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise TokenizerError(f"{origin}: cannot read {title}: {e}") from None


def _read_json(files: Mapping[str, Path], title: str, origin: str) -> dict[str, Any] | None:
    text = _read_text(files, title, origin)
    if text is None:
        return None
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise TokenizerError(f"{origin}: {title} is not valid JSON ({e}); re-pull the model") from None
    if not isinstance(value, dict):
        raise TokenizerError(f"{origin}: {title} must hold a JSON object, not {type(value).__name__}")
    return value


def _token_content(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken dict."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _apply_config_added_tokens(backend: tokenizers.Tokenizer, config: Mapping[str, Any], named: Iterable[str]) -> None:
    """What transformers 5 does over tokenizer.json when it loads a tokenizer: the added tokens of
    tokenizer_config.json (`added_tokens_decoder`) that tokenizer.json lacks or flags differently
    (special, lstrip, rstrip, ...) are added as the config has them, and so are the named special
    tokens (bos_token, ...) it lacks, as special. Where the two files agree, nothing changes."""
    current = {int(i): t for i, t in backend.get_added_tokens_decoder().items()}
    entries = config.get("added_tokens_decoder")
    to_add: list[tokenizers.AddedToken] = []
    numbered = [(int(k), e) for k, e in (entries.items() if isinstance(entries, Mapping) else ()) if str(k).isdigit()]
    for key, entry in sorted(numbered, key=lambda kv: kv[0]):  # by id: tokens the config alone has get ids in order
        if not isinstance(entry, Mapping) or not isinstance(entry.get("content"), str):
            continue
        special = bool(entry.get("special", False))
        token = tokenizers.AddedToken(entry["content"], single_word=bool(entry.get("single_word", False)),
                                      lstrip=bool(entry.get("lstrip", False)), rstrip=bool(entry.get("rstrip", False)),
                                      normalized=bool(entry.get("normalized", not special)), special=special)
        if not _same_added_token(current.get(key), token):
            to_add.append(token)
    names = set(named)
    pending = {t.content for t in to_add}
    for token in current.values():  # a named special token tokenizer.json does not mark special
        if token.content in names and not token.special and token.content not in pending:
            to_add.append(tokenizers.AddedToken(token.content, single_word=token.single_word, lstrip=token.lstrip,
                                                rstrip=token.rstrip, normalized=token.normalized, special=True))
    present = {t.content for t in current.values()} | {t.content for t in to_add}
    declared = {v["content"]: v for v in config.values() if isinstance(v, Mapping) and isinstance(v.get("content"), str)}
    for content in sorted(names - present):  # with the flags its AddedToken entry in the config gives
        flags = declared.get(content, {})
        to_add.append(tokenizers.AddedToken(content, special=True, normalized=bool(flags.get("normalized", False)),
                                            lstrip=bool(flags.get("lstrip", False)), rstrip=bool(flags.get("rstrip", False)),
                                            single_word=bool(flags.get("single_word", False))))
    for token in to_add:
        if token.content in names:
            token.special = True
    if to_add:
        backend.add_tokens(to_add)


def _same_added_token(a: tokenizers.AddedToken | None, b: tokenizers.AddedToken) -> bool:
    return a is not None and (a.content, a.special, a.lstrip, a.rstrip, a.normalized, a.single_word) == (
        b.content, b.special, b.lstrip, b.rstrip, b.normalized, b.single_word)


def special_tokens_from_config(config: Mapping[str, Any], special_map: Mapping[str, Any] | None) -> dict[str, str]:
    """The named special tokens a chat template sees as variables (transformers' special_tokens_map)."""
    tokens: dict[str, str] = {}

    def take(key: str, value: Any) -> None:
        content = _token_content(value)
        if key in STANDARD_SPECIAL_TOKENS or (key.endswith("_token") and content is not None):
            if content is None:
                tokens.pop(key, None)
            else:
                tokens[key] = content

    for key, value in config.items():
        take(key, value)
    if isinstance(config.get("extra_special_tokens"), Mapping):
        for key, value in config["extra_special_tokens"].items():
            if (content := _token_content(value)) is not None:
                tokens[key] = content
    # Legacy checkpoints keep their special tokens in special_tokens_map.json; transformers reads
    # it only when the config has no added_tokens_decoder, and then it wins.
    if special_map and "added_tokens_decoder" not in config:
        for key, value in special_map.items():
            if key in STANDARD_SPECIAL_TOKENS or key.endswith("_token"):
                take(key, value)
    return tokens


def _chat_templates(files: Mapping[str, Path], config: Mapping[str, Any], origin: str) -> str | dict[str, str] | None:
    from_files: dict[str, str] = {}
    if (text := _read_text(files, "chat_template.jinja", origin)) is not None:
        from_files["default"] = text
    for title in sorted(files):
        if title.startswith(TEMPLATE_DIR + "/") and title.endswith(".jinja"):
            from_files[title[len(TEMPLATE_DIR) + 1 : -len(".jinja")]] = _read_text(files, title, origin) or ""
    if from_files:  # template files take precedence over the config, as in transformers
        return from_files["default"] if list(from_files) == ["default"] else from_files
    template = config.get("chat_template")
    if template is None or isinstance(template, str):
        return template
    if isinstance(template, list) and all(isinstance(t, Mapping) and isinstance(t.get("name"), str)
                                          and isinstance(t.get("template"), str) for t in template):
        return {t["name"]: t["template"] for t in template}
    raise TokenizerError(f"{origin}: tokenizer_config.json's chat_template must be a string or a list of "
                         "{name, template} objects")


def _ids(value: Any, title: str, origin: str) -> list[int]:
    if value is None:
        return []
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        raise TokenizerError(f"{origin}: {title} eos_token_id must be a token id or a list of them, got {value!r}")
    return values


class Tokenizer:
    """Encode, decode and chat-template text for one model. Build it with `from_files`/`from_model`.

    Attributes: `eos_token_ids` (every stop id), `bos_token_id`/`eos_token_id` (None when the model
    names none), `vocab_size` (highest id + 1, added tokens included; a model's embedding may be
    padded beyond it), `add_bos_token` (whether `encode(..., add_special_tokens=True)` prepends the
    BOS), `special_tokens` (the template variables), `chat_template` (str, dict of named ones, or None).
    """

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        *,
        chat_template: str | Mapping[str, str] | None = None,
        special_tokens: Mapping[str, str] | None = None,
        eos_token_ids: Iterable[int] = (),
        config_add_bos_token: bool | None = None,
        origin: str = "tokenizer",
    ) -> None:
        self.backend = backend
        self.origin = origin
        self.chat_template = dict(chat_template) if isinstance(chat_template, Mapping) else chat_template
        self.special_tokens: dict[str, str] = dict(special_tokens or {})
        self.bos_token: str | None = self.special_tokens.get("bos_token")
        self.eos_token: str | None = self.special_tokens.get("eos_token")
        self.bos_token_id: int | None = self.token_to_id(self.bos_token) if self.bos_token else None
        self.eos_token_id: int | None = self.token_to_id(self.eos_token) if self.eos_token else None
        stops = set(eos_token_ids)
        if self.eos_token_id is not None:
            stops.add(self.eos_token_id)
        self.eos_token_ids: frozenset[int] = frozenset(stops)
        vocab = backend.get_vocab(with_added_tokens=True)
        self.vocab_size: int = max(vocab.values()) + 1 if vocab else 0
        self.add_bos_token: bool = self.bos_token_id is not None and self.encode("a", True)[:1] == [self.bos_token_id]
        if config_add_bos_token is not None and config_add_bos_token != self.add_bos_token:
            log.info("%s: tokenizer_config.json says add_bos_token=%s, tokenizer.json's post-processor %s a BOS; "
                     "following tokenizer.json as transformers does", origin, config_add_bos_token,
                     "adds" if self.add_bos_token else "does not add")

    @classmethod
    def from_files(cls, files: Path | str | Mapping[str, Path | str], *, template: str | None = None,
                   origin: str | None = None) -> Tokenizer:
        """Build from a checkpoint directory, or a mapping file title -> path (RegisteredModel.files).

        `template` overrides every chat template the files carry (a Modelfile TEMPLATE).
        """
        gathered = _gather_files(files)
        origin = origin or (str(files) if not isinstance(files, Mapping) else "model")
        path = gathered.get("tokenizer.json")
        if path is None:
            raise TokenizerError(f"{origin} has no tokenizer.json; ft needs a Hugging Face fast tokenizer "
                                 "(tokenizer.json) to encode text for this model")
        try:
            backend = tokenizers.Tokenizer.from_file(str(path))
        except Exception as e:  # the library raises plain Exception for bad files
            raise TokenizerError(f"{origin}: tokenizer.json cannot be loaded: {e}") from None
        config = _read_json(gathered, "tokenizer_config.json", origin) or {}
        special_map = _read_json(gathered, "special_tokens_map.json", origin)
        special_tokens = special_tokens_from_config(config, special_map)
        _apply_config_added_tokens(backend, config, special_tokens.values())
        generation = _read_json(gathered, "generation_config.json", origin)
        eos_ids = _ids((generation or {}).get("eos_token_id"), "generation_config.json", origin)
        if generation is None:
            eos_ids = _ids((_read_json(gathered, "config.json", origin) or {}).get("eos_token_id"), "config.json", origin)
        add_bos = config.get("add_bos_token")
        return cls(
            backend,
            chat_template=template if template is not None else _chat_templates(gathered, config, origin),
            special_tokens=special_tokens,
            eos_token_ids=eos_ids,
            config_add_bos_token=add_bos if isinstance(add_bos, bool) else None,
            origin=origin,
        )

    @classmethod
    def from_model(cls, model: RegisteredModel) -> Tokenizer:
        """Build from a registered model's files; its Modelfile TEMPLATE, if any, is the chat template."""
        from ..loading.registered import MEDIA_TEMPLATE

        override = next((model.files[d.title] for d in model.manifest.layers if d.media_type == MEDIA_TEMPLATE), None)
        template = override.read_text(encoding="utf-8") if override is not None else None
        tokenizer = cls.from_files(model.files, template=template, origin=model.name.display)
        tokenizer.check_fits(model.config.get("vocab_size"))
        return tokenizer

    def check_fits(self, model_vocab_size: object) -> None:
        """TokenizerError where the tokenizer's vocabulary has ids past the model's embedding rows
        (`model_vocab_size`; unchecked where the model does not say): its files are not this
        model's, and the first such id would index past the embedding. Added tokens past it (a
        tokenizer_config listing more than the model was trained with) are only logged: prompts
        that never use them run."""
        if not isinstance(model_vocab_size, int) or isinstance(model_vocab_size, bool) or model_vocab_size <= 0:
            return
        base_size = self.backend.get_vocab_size(with_added_tokens=False)
        if base_size > model_vocab_size:
            raise TokenizerError(
                f"{self.origin}: the tokenizer has {base_size} token ids, the model's embedding only "
                f"{model_vocab_size}: its tokenizer files belong to another model; use the checkpoint's own "
                "tokenizer.json and tokenizer_config.json")
        if self.vocab_size > model_vocab_size:
            log.warning("%s: added tokens reach id %d, past the model's %d embedding rows; a prompt that uses them "
                        "fails", self.origin, self.vocab_size - 1, model_vocab_size)

    def token_to_id(self, token: str) -> int | None:
        """The id of one vocabulary entry (e.g. a special token), None if there is none."""
        return self.backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        """The vocabulary entry of one id, as the model sees it (byte-level pieces for BPE)."""
        return self.backend.id_to_token(token_id)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of `text`; `add_special_tokens` runs the post-processor (a BOS, for some models)."""
        if not isinstance(text, str):
            raise TypeError(f"encode takes a str, got {type(text).__name__}")
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """Text of `ids`; ids the vocabulary does not have decode to nothing."""
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def select_chat_template(self, tools: Sequence[Any] | None = None) -> str:
        """The template transformers would use: "tool_use" when tools are given and it exists, else "default"."""
        templates = self.chat_template
        if templates is None:
            raise ChatTemplateError(
                f"{self.origin} has no chat template (no chat_template in tokenizer_config.json, no "
                "chat_template.jinja); give one with TEMPLATE in a Modelfile, or send a raw prompt")
        if isinstance(templates, str):
            return templates
        if tools is not None and "tool_use" in templates:
            return templates["tool_use"]
        if "default" in templates:
            return templates["default"]
        raise ChatTemplateError(f"{self.origin} has several chat templates ({', '.join(sorted(templates))}) "
                                "and none is named default")

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None,
                            add_generation_prompt: bool = True, **kwargs: Any) -> str:
        """The prompt text, as transformers' `apply_chat_template(..., tokenize=False)` renders it.

        `kwargs` are template variables (enable_thinking, documents, continue_final_message, ...).
        """
        return render_chat(self.select_chat_template(tools), messages, tools=tools,
                           add_generation_prompt=add_generation_prompt, special_tokens=self.special_tokens, **kwargs)

    def encode_chat(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None,
                    add_generation_prompt: bool = True, **kwargs: Any) -> list[int]:
        """Prompt ids, as `apply_chat_template(tokenize=True)` gives them: the template writes any BOS
        itself, so the post-processor does not run."""
        return self.encode(self.apply_chat_template(messages, tools, add_generation_prompt, **kwargs))
