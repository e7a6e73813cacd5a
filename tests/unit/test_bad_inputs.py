"""Bad inputs a user meets first, each refused with one message naming the problem and the fix (issue 39 item
3): a non-causal model folder, wandb without a login, a drafter on a target other than its own (architecture,
layer count, special tokens, feature layers), relative data paths in a recipe, and another library's message
cut short."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from helpers import build_tiny_model_dir, write_pattern_conversations

from draftsmith.distill.cache import brief
from draftsmith.distill.loading import load_target
from draftsmith.eval.serving import build_proposer
from draftsmith.heads.files import target_signature
from draftsmith.heads.registry import DrafterConfig, build_drafter
from draftsmith.train import cli
from draftsmith.train.config import ConfigError, load_config
from draftsmith.train.runtime import ConfigurationError, check_wandb


def test_a_bert_folder_is_not_a_causal_lm(tmp_path, capsys):
    from transformers import BertConfig, BertForMaskedLM

    BertForMaskedLM(BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                               intermediate_size=32)).save_pretrained(tmp_path / "bert")
    with pytest.raises(ValueError, match=r"\(bert, BertForMaskedLM\) is not a decoder-only causal LM.*Point "
                                         r"model.target"):
        load_target(str(tmp_path / "bert"))
    capsys.readouterr()  # save_pretrained's progress bar
    assert cli.main(["target", "--target", str(tmp_path / "bert")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a decoder-only causal LM" in err and "Traceback" not in err


def test_wandb_without_a_login_names_the_fixes(tmp_path, monkeypatch):
    for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    with pytest.raises(ConfigurationError,
                       match=r"no login for api.wandb.ai .*`wandb login`.*WANDB_MODE=offline.*"
                             r"log.wandb=false"):
        check_wandb()
    (tmp_path / "netrc").write_text("machine api.wandb.ai login user password k\n")
    check_wandb()  # `wandb login` wrote this
    (tmp_path / "netrc").unlink()
    monkeypatch.setenv("WANDB_MODE", "offline")
    check_wandb()


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
    """Same sizes, other targets: the tiny Llama (2 and 4 layers) and a tiny Qwen2 with the same tokenizer."""
    root = tmp_path_factory.mktemp("others")
    return {name: load_target(str(build_tiny_model_dir(root, family, layers=layers)), dtype="float32",
                              device="cpu")
            for name, family, layers in [("llama", "llama", 2), ("llama4", "llama", 4), ("qwen", "qwen2", 2)]}


def drafter_for(kind: str, target, root, **settings) -> DrafterConfig:
    cfg = DrafterConfig(kind=kind, **settings)
    torch.manual_seed(0)
    drafter = build_drafter(cfg, target.model, torch.ones(target.vocab_size))
    folder = drafter.save_pretrained(root / kind, target=target.name, tokenizer=target.tokenizer,
                                     signature=target_signature(target.model, target.tokenizer))
    return dataclasses.replace(cfg, path=str(folder))


def test_a_drafter_is_refused_on_another_architecture_of_the_same_sizes(targets, tmp_path):
    cfg = drafter_for("medusa", targets["llama"], tmp_path)
    with pytest.raises(ValueError,
                       match=r"was trained for '.*tiny-llama-L2-s0' and cannot serve .*tiny-qwen2-L2-s0: "
                             r"architecture LlamaForCausalLM differs from the target's Qwen2ForCausalLM"):
        build_proposer(cfg, targets["qwen"])
    build_proposer(cfg, targets["llama"])  # its own target serves


def test_a_drafter_is_refused_on_another_layer_count_or_special_tokens(targets, tmp_path):
    cfg = drafter_for("medusa", targets["llama4"], tmp_path)
    with pytest.raises(ValueError, match="layer count 4 differs from the target's 2"):
        build_proposer(cfg, targets["llama"])
    meta_path = tmp_path / "medusa" / "draftsmith.json"
    meta = json.loads(meta_path.read_text())
    meta["target_signature"]["special_ids"]["eos"] = 0
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"special token ids \{'bos': 1, 'eos': 0\} differ from the target's "
                                         r"\{'bos': 1, 'eos': 2\}"):
        build_proposer(cfg, targets["llama4"])


def test_feature_layers_out_of_range_say_what_the_drafter_was_trained_for(targets, tmp_path):
    """A folder written before the layer count was recorded: its feature layers name the deeper target."""
    cfg = drafter_for("eagle3", targets["llama4"], tmp_path, num_speculative_tokens=2)
    meta_path = tmp_path / "eagle3" / "draftsmith.json"
    meta = json.loads(meta_path.read_text())
    meta["feature_layers"], meta["target_signature"]["num_layers"] = [1, 2, 3], None
    meta["target_signature"]["architectures"] = None
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(ValueError,
                       match=r"trained for '.*tiny-llama-L4-s0'.*reads target layers 2, 3, out of range for "
                             r"the target's 2 layers \(0 to 1\): it was trained for a deeper target"):
        build_proposer(cfg, targets["llama"])


def test_relative_data_paths_are_read_beside_the_recipe_then_in_the_working_folder(tmp_path, monkeypatch):
    (tmp_path / "recipes").mkdir()
    data = write_pattern_conversations(tmp_path / "recipes" / "mine.jsonl", 2)
    recipe = tmp_path / "recipes" / "r.yaml"
    recipe.write_text("data:\n  train: [mine.jsonl, smollm2-selfdistill-4k]\n")
    monkeypatch.chdir(tmp_path)  # not the recipe's folder
    assert load_config(recipe).data.train == [str(data), "smollm2-selfdistill-4k"]
    (tmp_path / "elsewhere.jsonl").write_text("")
    recipe.write_text("data:\n  train: [elsewhere.jsonl]\n")
    assert load_config(recipe).data.train == ["elsewhere.jsonl"]  # the working folder, as before
    recipe.write_text("data:\n  train: [missing.jsonl]\n")
    with pytest.raises(ConfigError,
                       match=rf"data.train\[0\]: 'missing.jsonl' not found; looked beside the recipe "
                             rf"\({tmp_path}/recipes/missing.jsonl\) and in the working folder "
                             rf"\({tmp_path}/missing.jsonl\)"):
        load_config(recipe)
    # overrides: the shell's folder
    assert load_config(None, ["data.train=[mine.jsonl]"]).data.train == ["mine.jsonl"]


def test_another_librarys_message_is_cut_at_a_sentence_or_a_word():
    hub = ("Cannot find an appropriate cached snapshot folder for the specified revision on the local disk "
           "and outgoing traffic has been disabled. To enable repo look-ups and downloads online, pass "
           "'local_files_only=False' as input.")
    assert brief(hub, 200) == hub.split(" To enable")[0]
    words = "word " * 100
    cut = brief(words, 50)
    assert cut.endswith(" ...") and cut[:-4].split(" ")[-1] == "word"
    assert brief("short\nsecond line") == "short"
