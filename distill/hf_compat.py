"""Calling a model's own modules across transformers 5.x releases and remote-code models.

transformers 5.2x names the KV-cache argument of a model, decoder layer and attention module `cache`
(`past_key_values` stays as a deprecated alias); earlier 5.x releases (5.17 on the GPU machine, 5.19 in the
vLLM CPU environment) and most remote-code models only know `past_key_values` and swallow an unknown `cache`
into **kwargs without a word: the cache stays empty and every decoding step loses its context. Each call that
hands a cache to code we did not write goes through `cache_kwargs`, which names it the way that code reads it.
"""

from __future__ import annotations

import functools
import inspect


@functools.lru_cache(maxsize=None)
def _takes_cache(forward) -> bool:
    return "cache" in inspect.signature(forward).parameters


def cache_kwargs(module, cache) -> dict:
    """{"cache": cache} for a module whose forward names the argument `cache`, else {"past_key_values":
    cache}."""
    forward = getattr(type(module), "forward", None) or module.forward
    return {"cache" if _takes_cache(forward) else "past_key_values": cache}
