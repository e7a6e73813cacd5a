"""Strict run configs (train/config.py) and the `draftsmith config` command (train/cli.py).

Unknown keys and wrong types fail with messages that name the key and the fix; dotted overrides
parse like YAML; every shipped run YAML validates; the real console script runs.
"""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from draftsmith.train import cli
from draftsmith.train.config import (
    ConfigError,
    RunConfig,
    config_to_dict,
    dump_config,
    load_config,
    parse_overrides,
    write_resolved,
)

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted((ROOT / "configs" / "runs").glob("*.yaml"))
REFERENCE = ROOT / "configs" / "runs" / "smollm2-eagle3.yaml"  # a recipe that names its target


def _yaml(tmp_path, text: str) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return path


def test_defaults_validate():
    cfg = load_config(None)
    assert isinstance(cfg, RunConfig) and cfg.name == "run" and cfg.model.dtype == "float32"


# model-neutral recipes: the user names the target
NEUTRAL = ("eagle3", "eagle1", "medusa", "draft", "dflash", "peagle", "dspark")


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_every_shipped_config_validates(path, tmp_path):
    cfg = load_config(path, ["model.target=acme/tiny"] if path.stem in NEUTRAL else [])
    assert cfg.name == path.stem
    # what `draftsmith config` prints is itself a valid config, equal to the original
    printed = tmp_path / "printed.yaml"
    printed.write_text(dump_config(cfg))
    assert config_to_dict(load_config(printed)) == config_to_dict(cfg)


@pytest.mark.parametrize("path", [p for p in SHIPPED if p.stem.endswith("-quick")], ids=lambda p: p.name)
def test_quick_recipes_train_a_fixed_number_of_steps(path):
    """Tests, bars and the quickstart use the quick recipes: a time budget would train a different drafter on
    every host and load (measured: 6 steps of 50 on a busy host, alpha 0), so they stop on steps, never on
    minutes."""
    cfg = load_config(path)
    assert cfg.train.max_minutes is None and cfg.train.max_steps, (path.name, cfg.train.max_minutes)


@pytest.mark.parametrize("name", NEUTRAL)
def test_a_neutral_recipe_needs_the_target_and_sizes_from_the_data(name):
    with pytest.raises(ConfigError, match=r"model.target is required.*model.target=ORG/NAME"):
        load_config(name)
    cfg = load_config(name, ["model.target=acme/tiny"])
    assert (cfg.data.train, cfg.data.max_length, cfg.data.val_fraction) == ([], "auto", "auto")
    assert cfg.drafter.lookup_datastore == [] and cfg.train.max_minutes is None and cfg.train.epochs == 1


@pytest.mark.parametrize("name", ["smollm2-eagle3", "smollm2-eagle1", "smollm2-medusa", "smollm2-draft",
                                  "smollm2-dflash", "smollm2-peagle"])
def test_the_reference_recipes_are_layers_over_the_neutral_ones(name):
    from draftsmith.train.config import read_recipe, recipe_path

    bases = yaml.safe_load(recipe_path(name).read_text())["base"]
    assert bases[0] in NEUTRAL and bases[1] == "smollm2", bases
    assert read_recipe(recipe_path(name))["model"]["target"] == "smollm2-135m-instruct"


def test_shipped_configs_exist():
    assert SHIPPED, "configs/runs/ holds no YAML"


@pytest.mark.parametrize("text, key, valid", [
    ("train:\n  nope: 1\n", "nope", ["lr", "batch_size", "grad_accum"]),
    ("nope:\n  x: 1\n", "nope", ["model", "data", "drafter", "train", "eval"]),
    ("data:\n  regenerate:\n    nope: 1\n", "nope", ["prompts", "limit", "max_new_tokens"]),
])
def test_unknown_key_names_it_and_lists_valid_keys(tmp_path, text, key, valid):
    with pytest.raises(ConfigError) as err:
        load_config(_yaml(tmp_path, text))
    msg = str(err.value)
    assert f"'{key}'" in msg and "valid keys" in msg
    for name in valid:
        assert name in msg


def test_unknown_key_lists_only_its_own_section(tmp_path):
    msg = str(pytest.raises(ConfigError, load_config, _yaml(tmp_path, "log:\n  wandbb: true\n")).value)
    assert "log.wandbb" in msg and "wandb" in msg and "lr" not in msg


@pytest.mark.parametrize("override, field, expected", [
    ("train.lr=fast", "train.lr", "float"),
    ("train.batch_size=1.5", "train.batch_size", "int"),
    ("train.batch_size=true", "train.batch_size", "int"),  # a bool is not an int
    ("log.wandb=1", "log.wandb", "bool"),
    ("model.dtype=fp8", "model.dtype", "'auto' | 'float32' | 'bfloat16' | 'float16'"),
    ("eval.limit=many", "eval.limit", "int | null"),
    ("eval.categories=qa", "eval.categories", "list[str]"),
    ("extract.layers=[1,x]", "extract.layers[1]", "int"),
    ("eval.dtype=int8", "eval.dtype", "'auto' | 'float32' | 'bfloat16' | 'float16' | null"),
    ("model.target=[a]", "model.target", "str"),
    ("train=5", "train", "TrainConfig"),
])
def test_wrong_type_names_field_and_expected_type(override, field, expected):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    msg = str(err.value)
    assert msg.startswith(f"{field}:") and expected in msg, msg


def test_section_validation_becomes_config_error():
    with pytest.raises(ConfigError, match="drafter.kind 'nope' unknown; valid kinds: .*prompt-lookup"):
        load_config(None, ["drafter.kind=nope"])
    with pytest.raises(ConfigError, match="val_fraction"):
        load_config(None, ["data.val_fraction=1.5"])


def test_overrides_parse_like_yaml():
    cfg = load_config(None, ["train.lr=3e-4", "train.weight_decay=1", "eval.categories=[qa,rag]",
                             "eval.limit=null", "eval.dtype=bfloat16", "log.wandb=true",
                             "data.regenerate.limit=5", "data.system_prompt=null", "name=my-run",
                             "extract.layers=[2, -1]", "data.regenerate.out="])
    assert cfg.train.lr == 3e-4 and isinstance(cfg.train.lr, float)
    assert cfg.train.weight_decay == 1.0 and isinstance(cfg.train.weight_decay, float)  # ints widen
    assert cfg.eval.categories == ["qa", "rag"] and cfg.eval.limit is None and cfg.eval.dtype == "bfloat16"
    assert cfg.log.wandb is True and cfg.data.regenerate.limit == 5 and cfg.data.system_prompt is None
    assert cfg.name == "my-run" and cfg.extract.layers == [2, -1] and cfg.data.regenerate.out == ""


def test_overrides_merge_into_the_file(tmp_path):
    path = _yaml(tmp_path, "model:\n  target: some/folder\n  dtype: bfloat16\ntrain:\n  lr: 1.0e-3\n")
    cfg = load_config(path, ["model.dtype=float32", "train.epochs=2"])
    assert (cfg.model.target, cfg.model.dtype, cfg.train.lr, cfg.train.epochs) == ("some/folder", "float32",
                                                                                   1e-3, 2.0)
    assert cfg.name == "run"  # the file's stem


def test_yaml_scientific_notation_without_dot_is_a_float(tmp_path):
    # YAML 1.1 reads `3e-4` as a string; float fields accept it anyway
    assert load_config(_yaml(tmp_path, "train:\n  lr: 3e-4\n")).train.lr == 3e-4


@pytest.mark.parametrize("override", ["name.x=1", "train.lr.x=1", "model.dtype.deeper.still=1"])
def test_override_of_a_non_section_fails(override):
    with pytest.raises(ConfigError, match="is a value, not a section"):
        load_config(None, [override])


def test_override_syntax_errors():
    with pytest.raises(ConfigError, match="section.key=value"):
        parse_overrides(["train.lr"])
    with pytest.raises(ConfigError, match="is a value, not a section"):
        parse_overrides(["train.lr=1", "train.lr.x=2"])
    assert parse_overrides(["a.b.c=[1, 2]", "a.d=x=y"]) == {"a": {"b": {"c": [1, 2]}, "d": "x=y"}}


def test_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="mapping of sections"):
        load_config(_yaml(tmp_path, "- a\n- b\n"))
    with pytest.raises(ConfigError, match="train: expected TrainConfig, got int 3"):
        load_config(_yaml(tmp_path, "train: 3\n"))


def test_empty_file_and_empty_section_mean_defaults(tmp_path):
    assert load_config(_yaml(tmp_path, "")).train.lr == RunConfig().train.lr
    cfg = load_config(_yaml(tmp_path, "train:\n  # lr: 1.0\neval:\n"))
    assert config_to_dict(cfg.train) == config_to_dict(RunConfig().train) and cfg.eval.limit == 40


def test_literal_does_not_accept_lookalikes():
    from typing import Literal

    from draftsmith.train.config import _coerce

    assert _coerce(1, Literal[1, 2], "x") == 1
    with pytest.raises(ConfigError):
        _coerce(True, Literal[1, 2], "x")


def test_write_resolved_round_trips(tmp_path):
    cfg = load_config(None, ["train.lr=3e-4", "eval.categories=[a]"])
    out = write_resolved(cfg, tmp_path / "runs" / "x")
    assert out == tmp_path / "runs" / "x" / "config.resolved.yaml"
    assert config_to_dict(load_config(out)) == config_to_dict(cfg)


# --- the CLI --------------------------------------------------------------------------------------

def test_cli_config_prints_the_resolved_config(capsys):
    assert cli.main(["config", "-c", str(REFERENCE), "train.lr=3e-4"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["train"]["lr"] == 3e-4 and printed["name"] == REFERENCE.stem


def test_cli_config_unknown_key_fails_on_stderr(capsys):
    assert cli.main(["config", "-c", "smollm2-eagle3", "train.nope=1"]) != 0
    captured = capsys.readouterr()
    assert "nope" in captured.err and "valid keys" in captured.err and captured.out == ""


def test_cli_missing_config_file(capsys, tmp_path):
    assert cli.main(["config", "-c", str(tmp_path / "nope.yaml")]) != 0
    assert "not found" in capsys.readouterr().err


def test_console_script_runs():
    script = Path(sys.executable).parent / "draftsmith"
    cmd = [str(script)] if script.is_file() else [sys.executable, "-m", "draftsmith.train"]
    result = subprocess.run([*cmd, "config", "-c", str(REFERENCE), "eval.limit=3"], capture_output=True,
                            text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert yaml.safe_load(result.stdout)["eval"]["limit"] == 3


@pytest.mark.parametrize("key, place",
                         [("heads", "drafter.medusa.heads"), ("ttt_steps", "drafter.eagle3.ttt_steps"),
                                        ("fc_bias", "drafter.eagle.fc_bias / drafter.eagle3.fc_bias")])
def test_a_kind_setting_written_flat_names_its_section(key, place):
    with pytest.raises(ConfigError, match=f"'drafter.{key}' is a kind's own setting: write {place}"):
        load_config(None, [f"drafter.{key}=1"])


def test_kind_sections_nest_under_drafter_and_only_the_active_one_is_recorded(tmp_path):
    recipe = tmp_path / "r.yaml"  # a recipe may carry another kind's section (a base of another kind)
    recipe.write_text("drafter:\n  kind: eagle3\n  medusa:\n    heads: 3\n")
    cfg = load_config(recipe, ["drafter.eagle3.ttt_steps=2"])
    assert cfg.drafter.settings.ttt_steps == 2 and cfg.drafter.medusa.heads == 3
    recorded = config_to_dict(cfg)["drafter"]
    assert recorded["eagle3"]["ttt_steps"] == 2 and "medusa" not in recorded
    # the command line naming a section the run's kind does not read: refused, naming the one it reads
    with pytest.raises(ConfigError, match=r"override 'drafter.medusa.heads': this run's drafter.kind is "
                                          r"eagle3, which reads drafter.eagle3.\*.*drop it"):
        load_config(None, ["drafter.kind=eagle3", "drafter.medusa.heads=3"])
    with pytest.raises(ConfigError, match=r"drafter.kind is dspark.*write drafter.dspark.slot_weights"):
        load_config("smollm2-dspark-quick", ["drafter.dflash.slot_weights=acceptance"])
    assert load_config("smollm2-dspark-quick", ["drafter.dspark.slot_weights=acceptance"]
                       ).drafter.settings.slot_weights == "acceptance"
    with pytest.raises(ConfigError,
                       match=r"unknown key 'nope' in drafter.eagle3 .*valid keys: aux_layers, draft_vocab"):
        load_config(None, ["drafter.kind=eagle3", "drafter.eagle3.nope=1"])
    with pytest.raises(ConfigError, match=r"drafter.medusa.heads: expected int"):
        load_config(None, ["drafter.kind=medusa", "drafter.medusa.heads=many"])


def test_a_shipped_recipe_loads_by_name():
    for path in SHIPPED:
        named = ["model.target=acme/tiny"] if path.stem in NEUTRAL else []
        assert config_to_dict(load_config(path.stem, named)) == config_to_dict(load_config(path, named))
    with pytest.raises(ConfigError, match="neither a file nor a shipped recipe: .*smollm2-eagle3"):
        load_config("no-such-recipe")


def test_a_recipe_starts_from_another_and_overrides_a_few_keys(tmp_path):
    (tmp_path / "mine.yaml").write_text("base: smollm2-eagle3\nmodel:\n  target: org/my-model\n"
                                        "data:\n  train: [my_sharegpt.jsonl]\ntrain:\n  lr: 1.0e-4\n")
    (tmp_path / "my_sharegpt.jsonl").write_text("")  # a relative data path is read beside the recipe
    cfg, full = load_config(tmp_path / "mine.yaml"), load_config("smollm2-eagle3")
    assert cfg.name == "mine" and cfg.model.target == "org/my-model"
    assert cfg.data.train == [str(tmp_path / "my_sharegpt.jsonl")]
    assert cfg.train.lr == 1e-4 and cfg.drafter.eagle3.draft_vocab == full.drafter.eagle3.draft_vocab == 16384
    assert cfg.eval.limit == 80  # from the shared smollm2 layer, two bases down
    (tmp_path / "a.yaml").write_text("base: b.yaml\n")
    (tmp_path / "b.yaml").write_text("base: a\n")
    with pytest.raises(ConfigError, match=r"recipe bases form a cycle: a.yaml -> b.yaml -> a.yaml"):
        load_config(tmp_path / "a.yaml")
    (tmp_path / "c.yaml").write_text("base: no-such-base\n")
    with pytest.raises(ConfigError, match="neither a file nor a shipped recipe"):
        load_config(tmp_path / "c.yaml")
    (tmp_path / "d.yaml").write_text("base: smollm2\ndrafter:\n  heads: 3\n")
    with pytest.raises(ConfigError, match="write drafter.medusa.heads"):  # unknown keys still fail
        load_config(tmp_path / "d.yaml")
