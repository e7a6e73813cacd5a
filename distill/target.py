"""The frozen target model: `Target` wraps an unmodified HF causal LM with what drafters need.

First stop of the flow. Everything downstream (regeneration, feature extraction, online training,
the tree-verification decoder) talks to the target through `Target`, which wraps an unmodified
Hugging Face causal LM and adds what drafters need:

- `forward(ids, layers=[...])` returns logits `[B, T, V]` and the hidden states of the requested
  decoder layers `{layer: [B, T, H]}`. Layer `i` means the *output of decoder layer i* (0-based,
  before the final norm), captured by forward hooks on the model's own layers, so it works for any
  architecture whose decoder exposes `.layers` (Llama, Qwen2/3, Mistral, Gemma) — no forked
  modeling file. For i < N-1 this equals `output_hidden_states[i + 1]`; for the last layer HF's
  tuple holds the *normed* state, hooks give the raw one that EAGLE needs. The key `"final"`
  returns the last hidden state after the final norm (what Medusa heads read), also by a hook.
- `generate(prompts, ...)`: HF `generate` on a left-padded batch, each answer cut after its first
  end-of-sequence token — the one wrapper every caller uses (eval's HF peer, bench, regeneration,
  the `draftsmith target` demo); `left_pad` is the one left-padding helper (our decoder and the
  on-policy sampler pad with it too).
- loading (`load_target`: which model a name means, its device, dtype and placement) is distill/loading.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from draftsmith.distill.data import render_chat
from draftsmith.distill.hf_compat import cache_kwargs


@dataclass
class TargetOutput:
    logits: torch.Tensor  # [B, T, V] (or [B, k, V] with logits_to_keep=k)
    hidden: dict[int | str, torch.Tensor] = field(default_factory=dict)  # layer (or "final") -> [B, T, H]
    past_key_values: object | None = None


FINAL = "final"  # feature key: the last hidden state after the final norm (what Medusa heads read)

# The documented template for base models without one (model.chat_template: plain, or no template at all):
# the tokenizer's bos token first (a base model such as Gemma writes nothing sensible without it: Gemma-3-270M
# only repeats "Answer:"), a system turn as a paragraph, "Question: ..." and "Answer: ..." lines, the answer
# ended by the eos token. The generation prompt ends at "Answer:" and the model writes the space itself, so an
# answer that already starts with whitespace (one the model wrote) gets no second space: training renders the
# tokens the model generated.
PLAIN_TEMPLATE = (
    "{% if bos_token %}{{ bos_token }}{% endif %}{% for m in messages %}{% if m['role'] == 'system' %}{{ "
    "m['content'] }}\n\n{% elif m['role'] == 'user' %}Question: {{ m['content'] }}\n{% else %}Answer:{% if "
    "m['content'][:1] not in [' ', '\\n'] %} {% endif %}{{ m['content'] }}{{ eos_token }}\n\n{% endif %}{% "
    "endfor %}{% if add_generation_prompt %}Answer:{% endif %}")


def _is_file(choice: str) -> bool:
    """Does model.chat_template name a file? (An inline template longer than a file name can be is not.)"""
    try:
        return Path(choice).expanduser().is_file()
    except OSError:
        return False


def apply_chat_template(tokenizer, choice: str | None, name: str, kwargs: dict | None = None) -> None:
    """Set the template every stage renders with: the tokenizer's own, or `choice`; a tokenizer with none
    gets PLAIN_TEMPLATE and a one-line warning (a base model). `kwargs` (model.chat_template_kwargs) are the
    template variables every render passes (distill/data.py render_chat)."""
    import warnings

    if kwargs is not None and not isinstance(kwargs, dict):
        raise ValueError(f"model.chat_template_kwargs must be a mapping of template variables (e.g. "
                         f"{{enable_thinking: true}}), got {kwargs!r}")
    tokenizer.draftsmith_template_kwargs = dict(kwargs or {})
    if choice == "plain":
        tokenizer.chat_template = PLAIN_TEMPLATE
    elif choice and _is_file(choice):
        tokenizer.chat_template = Path(choice).expanduser().read_text()
    elif choice:
        tokenizer.chat_template = choice
    elif getattr(tokenizer, "chat_template", None) is None:
        warnings.warn(f"{name} has no chat template (a base model?): prompts are rendered with draftsmith's "
                      "plain template (Question:/Answer:, distill/target.py PLAIN_TEMPLATE); set "
                      "model.chat_template to choose",
                      stacklevel=2)
        tokenizer.chat_template = PLAIN_TEMPLATE


def left_pad(rows: list[list[int]], pad_id: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Token rows -> ids and attention mask `[B, P]`, left-padded so every row's last token is column P-1."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, width - len(row):] = torch.as_tensor(row, dtype=torch.long)
        mask[i, width - len(row):] = 1
    return ids.to(device), mask.to(device)


def cut_at_eos(tokens: list[int], eos: set[int]) -> tuple[list[int], bool]:
    """Tokens up to and including the first end-of-sequence token, and whether one ended them."""
    end = next((j for j, tok in enumerate(tokens) if tok in eos), None)
    return (tokens, False) if end is None else (tokens[: end + 1], True)


def decoder_of(model: torch.nn.Module) -> torch.nn.Module:
    """The decoder stack of an HF causal LM (Llama, Qwen, Mistral, Gemma, ... and peft wrappers)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.get_decoder() if hasattr(base, "get_decoder") else getattr(base, "model", base)


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The decoder blocks of an HF causal LM."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    layers = getattr(decoder_of(model), "layers", None)
    if layers is None:
        raise ValueError(f"{type(base).__name__} "
                         f"({getattr(getattr(model, 'config', None), 'model_type', '?')}): no decoder layers "
                         "where draftsmith reads them (.get_decoder().layers, as Llama, Qwen, Mistral and "
                         "Gemma have); it is not a decoder-only causal LM draftsmith supports: use a model "
                         "of those families as the target")
    return layers


class Target:
    """A frozen HF causal LM plus its tokenizer; hidden states of chosen layers via hooks."""

    def __init__(self, model: torch.nn.Module, tokenizer, name: str = "target"):
        self.model = model.eval().requires_grad_(False)
        self.tokenizer = tokenizer
        self.name = name
        self.config = model.config
        self.layers = decoder_layers(model)
        # "final": the decoder stack's own output (last_hidden_state, after whatever final norm the family
        # names: norm, final_layernorm, norm_f, ...), captured by a hook on the stack
        self.decoder = decoder_of(model)
        self._captured: dict[int | str, torch.Tensor] = {}

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @property
    def vocab_size(self) -> int:
        return self.model.get_output_embeddings().weight.shape[0]

    @property
    def eos_token_ids(self) -> list[int]:
        ids = self.model.generation_config.eos_token_id
        # a target without a tokenizer (random-weight benchmarks) may have no end token at all
        if ids is None:
            ids = getattr(self.tokenizer, "eos_token_id", None)
        return sorted({ids} if isinstance(ids, int) else set(ids or []))

    @property
    def pad_token_id(self) -> int:
        pad = getattr(self.tokenizer, "pad_token_id", None)
        if pad is None:
            pad = self.model.generation_config.pad_token_id
        if pad is None:
            pad = self.eos_token_ids[0] if self.eos_token_ids else 0
        return pad

    @torch.inference_mode()
    def generate(self, prompts: list[list[int]], max_new_tokens: int, temperature: float = 0.0,
                 top_p: float = 1.0, top_k: int = 0, **kwargs) -> list[tuple[list[int], bool]]:
        """HF `generate` on the left-padded prompts (greedy at temperature 0) -> per prompt (new tokens cut
        after the first end-of-sequence token, ended by one). `kwargs` go to `generate` (assistant_model,
        prompt_lookup_num_tokens, eos_token_id, ...). Sampling draws from torch's global generator."""
        ids, mask = left_pad(prompts, self.pad_token_id, self.device)
        warp = (dict(do_sample=False, temperature=None, top_p=None, top_k=None) if temperature == 0 else
                dict(do_sample=True, temperature=temperature, top_p=top_p, top_k=top_k or None))
        args = dict(attention_mask=mask, max_new_tokens=max_new_tokens, eos_token_id=self.eos_token_ids,
                    pad_token_id=self.pad_token_id, **warp)
        args.update(kwargs)
        out = self.model.generate(ids, **args)
        eos = set(args["eos_token_id"]) if isinstance(args["eos_token_id"],
                                                      (list, tuple)) else {args["eos_token_id"]}
        return [cut_at_eos(row, eos) for row in out[:, ids.shape[1]:].tolist()]

    def _capture(self, key: int | str):
        def hook(module, args, output):
            if hasattr(output, "last_hidden_state"):  # the decoder stack's output ("final")
                output = output.last_hidden_state
            self._captured[key] = output[0] if isinstance(output, tuple) else output

        return hook

    def normalize_layers(self, layers) -> list[int | str]:
        out = []
        for layer in layers:
            if layer == FINAL:
                out.append(FINAL)
                continue
            idx = layer + self.num_layers if layer < 0 else layer
            if not 0 <= idx < self.num_layers:
                raise ValueError(f"layer {layer} out of range for a target with {self.num_layers} layers "
                                 f"(valid: 0 to {self.num_layers - 1}, -{self.num_layers} to -1, or "
                                 f"'{FINAL}')")
            out.append(idx)
        return out

    def forward(self, input_ids, attention_mask=None, layers=(), **kwargs) -> TargetOutput:
        """Run the unmodified model; `layers` selects hidden states to return (see module doc)."""
        wanted = self.normalize_layers(layers)
        # Hooks live only for this call: a plain decoding step pays nothing for feature capture.
        handles = [(self.decoder if k == FINAL else self.layers[k]).register_forward_hook(self._capture(k))
                   for k in wanted]
        try:
            # transformers 5.2x names the KV cache `cache` (`past_key_values` its deprecated alias); earlier
            # 5.x releases and remote-code models only know `past_key_values`, and would silently ignore
            # `cache`.
            passed_cache = kwargs.get("cache", kwargs.get("past_key_values"))
            kwargs.setdefault("use_cache", passed_cache is not None)
            if "cache" in kwargs:
                kwargs.update(cache_kwargs(self.model, kwargs.pop("cache")))
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
            hidden = {i: self._captured[i] for i in wanted}
        finally:
            for handle in handles:
                handle.remove()
            self._captured = {}
        cache = out.get("cache" if "cache" in type(out).__dataclass_fields__ else "past_key_values")
        return TargetOutput(logits=out.logits, hidden=hidden, past_key_values=cache)

    __call__ = forward

    def chat_ids(self, messages: list[dict] | str) -> list[int]:
        """Token ids of a chat (a list of messages, or one user turn) ready for the assistant's answer."""
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        return render_chat(self.tokenizer, messages, add_generation_prompt=True)


