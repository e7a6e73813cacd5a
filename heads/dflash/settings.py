"""DFlash's settings (`drafter.dflash`) and the aux-layer check its module and its export share."""

from __future__ import annotations

from dataclasses import dataclass, field

from draftsmith.heads.eagle.eagle3 import default_feature_layers
from draftsmith.heads.settings import KindSettings

SLOT_WEIGHTS = ("decay", "acceptance", "dpace")


@dataclass
class DFlashConfig(KindSettings):
    """`drafter.dflash`: fused target layers, draft depth, block size, mask token, anchors per sequence."""

    # entering decoder layers l (vLLM's ids); [] = 2, N//2, N-3
    aux_layers: list[int] = field(default_factory=list)
    num_layers: int = 2  # draft decoder layers
    block_size: int = 0  # mask slots per training block; 0 = drafter.num_speculative_tokens
    # the id vLLM feeds the mask slots (its embedding is the trained one); -1 = the last id
    mask_token_id: int = -1
    anchors: int = 128  # blocks per training sequence (random anchors; every candidate when there are fewer)
    # the lm_head's rows: most frequent training labels; 0 or >= the target's = all of them
    draft_vocab: int = 32000
    # each slot's loss weight: decay = drafter.head_decay^(i-1); acceptance = the slot's share of the block's
    # expected accepted length, from its exact acceptance (heads/losses.py chain_weights; no gradient);
    # dpace = D-PACE's weights from the same acceptance, softened, over the count of slots (dpace_weights)
    slot_weights: str = "decay"

    def __post_init__(self):
        if self.slot_weights not in SLOT_WEIGHTS:
            raise ValueError(f"drafter.dflash.slot_weights '{self.slot_weights}' unknown; valid: "
                             f"{', '.join(SLOT_WEIGHTS)}")
        if self.num_layers < 1 or self.block_size < 0 or self.anchors < 1 or self.draft_vocab < 0:
            raise ValueError("drafter.dflash.num_layers and drafter.dflash.anchors must be >= 1, "
                             "drafter.dflash.block_size and drafter.dflash.draft_vocab >= 0 (block_size 0 = "
                             "drafter.num_speculative_tokens; draft_vocab 0 = the target's vocabulary)")

    def feature_layers(self, target_config) -> list:
        layers = self.aux_layers or default_feature_layers(target_config.num_hidden_layers)
        return [layer - 1 for layer in check_layers(layers, target_config.num_hidden_layers)]

    def serving_candidates(self, folder_config: dict) -> list[dict]:
        """Chains up to the trained block (one drafter forward each), one beside a prompt-lookup branch."""
        block = mask_slots(folder_config, 4)
        chains = [{"tree": f"chain-{n}",
                   "num_speculative_tokens": n} for n in sorted({1, 2, 3, 4, 6, 8, block})
                  if n <= block]
        return chains + [{"tree": f"chain-{block}", "num_speculative_tokens": block, "lookup_branch": 4}]


def mask_slots(config: dict, default: int) -> int:
    """The tokens a dflash folder's config.json drafts per block: speculators writes `sample_from_anchor`
    beside a `block_size` that counts the anchor (false: block_size - 1 drafted, speculators 0.9.0 wheel,
    speculators/models/dflash/core.py:255-258; our dspark export writes it so too); draftsmith's own dflash
    export and drafter folders write the mask slots themselves, without `sample_from_anchor`."""
    block = int(config.get("block_size") or default)
    return block - 1 if config.get("sample_from_anchor") is False else block


def check_layers(layers: list[int], num_layers: int) -> list[int]:
    """Aux ids as vLLM reads them: distinct, increasing (it sorts and de-duplicates), each in 1..N-1."""
    layers = list(layers)
    if not layers or layers != sorted(set(layers)) or not all(1 <= x < num_layers for x in layers):
        raise ValueError("drafter.dflash.aux_layers must be distinct increasing layers in "
                         f"1..{num_layers - 1} (the hidden state entering that decoder layer); got {layers}")
    return layers
