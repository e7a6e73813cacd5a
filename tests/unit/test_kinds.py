"""Every drafter kind in `KINDS`, picked up from the table (the test-only `bigram` kind included):
its row names real hooks; an untrained drafter of the kind, built with its defaults, decodes exactly
the target's greedy output; every export format of the kind round-trips (the export decodes what the
drafter folder decodes, step for step); the folder reader decides the kind and refuses a drafter
made for another target, naming the mismatch."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from helpers import build_tiny_model_dir, prompts

from draftsmith.distill.loading import load_target
from draftsmith.eval.decode.decoder import SpeculativeDecoder, hf_generate
from draftsmith.eval.serving import build_proposer
from draftsmith.heads.export import FORMATS, export_drafter
from draftsmith.heads.files import target_signature
from draftsmith.heads.folder import read_folder
from draftsmith.heads.losses import TOKEN_LOSSES
from draftsmith.heads.registry import KINDS, DrafterConfig, build_drafter
from draftsmith.heads.settings import KindSettings

pytestmark = pytest.mark.usefixtures("one_thread")
ALL = list(KINDS)
# formats read back by our decoder (a GGUF is llama.cpp's: tests/integration/test_engine_llamacpp.py)
EXPORTS = [(kind, fmt) for kind, spec in KINDS.items() for fmt in spec.formats if FORMATS[fmt].reads_back]


def test_the_test_kind_is_in_the_table():
    assert "bigram" in ALL and ("bigram", "bigram-table") in EXPORTS


def test_the_test_kind_lives_in_one_folder():
    """Every piece of the bigram kind (row hooks, module, settings, format, proposer) is code in
    tests/bigram_kind/."""
    import inspect
    from pathlib import Path

    import bigram_kind.proposer

    folder = Path(__file__).resolve().parents[1] / "bigram_kind"
    spec, fmt = KINDS["bigram"], FORMATS["bigram-table"]
    pieces = [spec.proposer, spec.module, spec.settings, fmt.write, fmt.read, fmt.detect]
    pieces.append(bigram_kind.proposer.BigramProposer)  # what the row's proposer hook builds
    homes = {Path(inspect.getsourcefile(p)).resolve().parent for p in pieces}
    assert homes == {folder}, homes


@pytest.mark.parametrize("kind", ALL)
def test_every_row_names_real_hooks(kind):
    spec = KINDS[kind]
    assert issubclass(spec.settings, KindSettings) and dataclasses.is_dataclass(spec.settings())
    assert callable(spec.proposer)
    assert set(spec.formats) <= set(FORMATS) and set(spec.losses) <= set(TOKEN_LOSSES)
    assert spec.trainable == bool(spec.losses)
    for hook in (spec.joint, spec.post_train, spec.hf_peer):
        assert hook is None or callable(hook)
    assert [s.key for s in KINDS.values()].count(spec.key) == 1


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    """10 layers: every kind's default settings fit (EAGLE-3's layers 2/5/7, a 4-layer draft LM, 8-layer
    layer-skip)."""
    folder = build_tiny_model_dir(tmp_path_factory.mktemp("kinds"), "llama", layers=10)
    return load_target(str(folder), dtype="float32", device="cpu")


def drafter_config(kind: str, target, root) -> DrafterConfig:
    """The kind with its defaults; a trainable kind gets an untrained drafter folder (perturbed, so drafts
    vary)."""
    cfg = DrafterConfig(kind=kind, num_speculative_tokens=3)
    if not cfg.spec.trainable:
        return cfg
    torch.manual_seed(0)
    drafter = build_drafter(cfg, target.model, torch.arange(target.vocab_size).flip(0))
    with torch.no_grad():
        for p in drafter.parameters():
            if p.requires_grad:
                p.add_(0.02 * torch.randn_like(p))
    folder = drafter.save_pretrained(root / kind, target=target.name, tokenizer=target.tokenizer,
                                     signature=target_signature(target.model, target.tokenizer))
    return dataclasses.replace(cfg, path=str(folder))


@pytest.mark.parametrize("kind", ALL)
def test_untrained_drafter_of_every_kind_is_lossless(kind, target, tmp_path):
    decoder = SpeculativeDecoder(target, build_proposer(drafter_config(kind, target, tmp_path), target))
    for prompt, max_new in zip(prompts(3, seed=2), (1, 9, 24)):
        assert decoder.generate(prompt, max_new).output_ids == hf_generate(target, prompt, max_new)[0], kind


@pytest.mark.parametrize("kind,fmt", EXPORTS)
def test_every_export_decodes_what_its_drafter_folder_decodes(kind, fmt, target, tmp_path):
    cfg = drafter_config(kind, target, tmp_path)
    folder = read_folder(cfg.path)
    out = export_drafter(folder, fmt, tmp_path / "export" / fmt, dtype="float32", target_model=target.model)
    exported = read_folder(out)
    assert (exported.kind, exported.format) == (kind, fmt)
    ours = SpeculativeDecoder(target, build_proposer(cfg, target))
    theirs = SpeculativeDecoder(target, build_proposer(dataclasses.replace(cfg, path=str(out)), target))
    for prompt in prompts(3, seed=5):
        a, b = ours.generate(prompt, 20), theirs.generate(prompt, 20)
        assert (a.output_ids, a.accept_lengths) == (b.output_ids, b.accept_lengths), (kind, fmt)
        assert a.output_ids == hf_generate(target, prompt, 20)[0]


@pytest.mark.parametrize("kind,fmt", EXPORTS)
@pytest.mark.parametrize("tree",
                         [{"topk": 2, "depth": 3, "budget": 5}, {"paths": [[0], [1], [0, 0]], "label": "t3"}])
def test_an_export_serves_the_tree_its_folder_recorded(kind, fmt, tree, target, tmp_path):
    """`eval --drafter EXPORT` must decode with the folder's tree, not a default: serving_tree.json beside
    it."""
    cfg = drafter_config(kind, target, tmp_path)
    meta_path = read_folder(cfg.path).path / "draftsmith.json"
    meta_path.write_text(json.dumps(dict(json.loads(meta_path.read_text()), tree=tree)))
    folder = read_folder(cfg.path)
    out = export_drafter(folder, fmt, tmp_path / "export" / fmt, dtype="float32", target_model=target.model)
    assert read_folder(out).tree == folder.tree is not None
    (out / "serving_tree.json").unlink()
    assert read_folder(out).tree is None  # negative twin: without the file an export has no tree


@pytest.mark.parametrize("kind", [k for k in ALL if KINDS[k].trainable])
def test_a_drafter_for_another_target_is_refused_by_name(kind, target, tmp_path):
    cfg = drafter_config(kind, target, tmp_path)
    meta_path = read_folder(cfg.path).path / "draftsmith.json"
    meta = json.loads(meta_path.read_text())
    for field, value, message in (("vocab_size", 300, "vocabulary size 300 differs from the target's 259"),
                                  ("tokenizer", "0" * 16, "tokenizer differs from the target's")):
        bad = dict(meta, target_signature=dict(meta["target_signature"], **{field: value}))
        meta_path.write_text(json.dumps(bad))
        with pytest.raises(ValueError, match=message):
            build_proposer(cfg, target)
    if meta["feature_layers"]:  # kinds that read the target's features must match its width too
        meta_path.write_text(json.dumps(dict(meta, target_signature=dict(meta["target_signature"],
                                                                         hidden_size=64))))
        with pytest.raises(ValueError, match="hidden size 64 differs from the target's 32"):
            build_proposer(cfg, target)


def test_the_folder_decides_the_kind(target, tmp_path):
    cfg = drafter_config("medusa", target, tmp_path)
    # a path wins over a default
    proposer = build_proposer(dataclasses.replace(cfg, kind="prompt-lookup"), target)
    assert proposer.name == "medusa"
    with pytest.raises(ValueError, match="holds a medusa drafter, not eagle3"):
        build_proposer(dataclasses.replace(cfg, kind="eagle3"), target)
    with pytest.raises(FileNotFoundError, match="neither a drafter folder"):
        read_folder(tmp_path)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "draftsmith.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        read_folder(tmp_path / "broken")


def test_paths_in_a_folder_cannot_point_outside_it(target, tmp_path):
    cfg = drafter_config("medusa", target, tmp_path)
    meta_path = read_folder(cfg.path).path / "draftsmith.json"
    meta = json.loads(meta_path.read_text())
    for key, value in (("tree", {"file": "../../etc/passwd"}), ("serve_target", "../elsewhere")):
        meta_path.write_text(json.dumps(dict(meta, **{key: value})))
        folder = read_folder(cfg.path)
        with pytest.raises(ValueError, match="points outside the drafter folder"):
            _ = folder.tree if key == "tree" else folder.serve_target
