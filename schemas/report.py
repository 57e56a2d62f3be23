"""The evaluation report of one drafter checkpoint against one cached target (JSON on disk)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from schemas.layers import CheckpointLayerConvention
from schemas.sampling import DraftSampling, SamplingParams


class RoundTaus(BaseModel):
    """Acceptance length of every round of one response; `mean` is None when there was no round."""

    model_config = ConfigDict(extra="forbid")
    round_taus: list[int]
    mean: float | None


class ExpectedRounds(BaseModel):
    """Probabilistic drafting (standard rejection sampling at the response's setting): what the live loop
    counts on this very response, in expectation over its accept/reject draws (exact, not sampled)."""

    model_config = ConfigDict(extra="forbid")
    rounds: float = Field(description="expected rounds")
    accepted: float = Field(description="expected accepted draft tokens, all rounds")
    mean_tau: float | None = Field(description="expected mean round tau, E[tokens / rounds] (None: no round)")


class PromptEval(BaseModel):
    """One prompt's round taus, chain and per tree budget."""

    model_config = ConfigDict(extra="forbid")
    prompt_id: str
    prompt_len: int
    num_tokens: int
    chain: RoundTaus
    trees: dict[int, RoundTaus] = Field(default_factory=dict, description="DDTree budget -> rounds (DFlash)")
    eagle_trees: dict[str, RoundTaus] = Field(
        default_factory=dict, description='EAGLE tree "TOPK,DEPTH,TOTAL" -> rounds (EAGLE-3)'
    )
    greedy_mismatches: int | None = Field(
        default=None,
        description="response tokens that are not the target's greedy choice (cache server's check); "
        "0 means these rounds are exactly the live greedy loop's, None that the cache did not say",
    )
    generator: str | None = Field(
        default=None, description="how the response was made: hf, given, or engine URL MODEL VERSION (cache server)"
    )
    capture: str | None = Field(
        default=None,
        description="how the states were computed: hf DTYPE, or engine vllm VERSION DTYPE tp N pp M (cache server)",
    )
    sampling: SamplingParams | None = Field(
        default=None, description="how the response was sampled from the target (None: greedy, or not recorded)"
    )
    outside_support: int | None = Field(
        default=None,
        description="sampled responses: tokens the target gives zero probability at the declared setting",
    )
    prompt_sha256: str | None = Field(
        default=None, description="sha256 of the prompt's token ids: the samples of one prompt share it"
    )
    probabilistic: ExpectedRounds | None = Field(
        default=None, description="the chain under probabilistic drafting (--draft-sampling probabilistic)"
    )


class TauSummary(BaseModel):
    """`mean_tau` = mean over prompts of each prompt's mean round tau (the DFlash benchmark's convention)."""

    model_config = ConfigDict(extra="forbid")
    mean_tau: float | None
    tokens_per_round: float | None = Field(description="total accepted tokens / total rounds")
    total_tokens: int
    total_rounds: int
    histogram: dict[int, int] = Field(description="round tau -> number of rounds")
    prompts_evaluated: int
    prompts_without_rounds: int
    stderr: float | None = Field(
        default=None,
        description="standard error of mean_tau over prompts (the samples of one prompt averaged first); "
        "None with fewer than two prompts",
    )


class ExpectedSummary(BaseModel):
    """Probabilistic drafting over a run's prompts: the mean over prompts of each one's expected mean tau."""

    model_config = ConfigDict(extra="forbid")
    mean_tau: float | None
    tokens_per_round: float | None = Field(description="expected tokens / expected rounds, all prompts")
    stderr: float | None = Field(default=None, description="standard error of mean_tau over prompts")
    prompts_evaluated: int


class EvalSeconds(BaseModel):
    """Where an evaluation's time went."""

    model_config = ConfigDict(extra="forbid")
    fetch: float = Field(description="waiting for features (fetched ahead while the drafter runs)")
    draft: float = Field(description="drafter forwards and lm_head projections")
    walk: float = Field(description="building DDTrees and walking the chain and trees")


class EvalCost(BaseModel):
    """What evaluating this checkpoint cost; `drafted_blocks` <= the total rounds of all walks."""

    model_config = ConfigDict(extra="forbid")
    drafted_blocks: int = Field(description="drafter block forwards run for this checkpoint, all walks together")
    lm_head_rows: int = Field(description="draft positions projected through lm_head")
    feature_bytes_fetched: int = Field(
        description="feature bytes fetched from the cache server for this checkpoint (a sweep's shared fetch "
        "counts for the first checkpoint that read them)"
    )
    feature_cache_hits: int = Field(description="prompts whose features were already resident in the worker")
    seconds: EvalSeconds


class SetSummary(BaseModel):
    """The run's numbers over the prompts of one set."""

    model_config = ConfigDict(extra="forbid")
    chain: TauSummary
    trees: dict[int, TauSummary] = Field(default_factory=dict)
    eagle_trees: dict[str, TauSummary] = Field(default_factory=dict)
    probabilistic: ExpectedSummary | None = Field(default=None, description="--draft-sampling probabilistic")
    prompts_evaluated: int
    by_sampling: dict[str, SetSummary] = Field(
        default_factory=dict,
        description='the same numbers per sampling setting of the responses ("T=0", "T=0.6 top_p=0.95", ...)',
    )


class EvalSummary(SetSummary):
    """The run's numbers over all prompts (a `SetSummary` of the whole run), and per set."""

    by_set: dict[str, SetSummary] = Field(
        default_factory=dict, description="the same numbers per prompt set, when the prompts were chosen by set"
    )
    prompts_not_target_greedy: int = Field(
        default=0, description="prompts whose response is not the target's own greedy continuation"
    )
    generators: dict[str, int] = Field(
        default_factory=dict, description="prompts per generator of their responses (unknown: not recorded)"
    )
    captures: dict[str, int] = Field(
        default_factory=dict, description="prompts per capture source of their states (unknown: not recorded)"
    )
    wall_time_s: float
    cost: EvalCost | None = Field(default=None, description="absent in reports written before it existed")


class DFlashDrafting(BaseModel):
    """DFlash: the drafted block length, the block's mask token, the DDTree budgets walked."""

    model_config = ConfigDict(extra="forbid")
    family: Literal["dflash"] = "dflash"
    block_size: int | None = Field(default=None, description="drafted block length")
    mask_token_id: int | None = Field(default=None, description="the block's mask token")
    tree_budgets: list[int] = Field(default_factory=list, description="DDTree budgets walked")

    @property
    def longest_round(self) -> int:
        """The most tokens one chain round can count: the whole block."""
        return self.block_size or 1


class Eagle3Drafting(BaseModel):
    """EAGLE-3: chain drafts per round, the draft vocabulary's size, EAGLE's dynamic trees walked."""

    model_config = ConfigDict(extra="forbid")
    family: Literal["eagle3"] = "eagle3"
    steps: int | None = Field(default=None, description="chain drafts per round")
    draft_vocab_size: int | None = Field(default=None, description="lm_head rows")
    eagle_trees: list[str] = Field(default_factory=list, description='EAGLE trees "TOPK,DEPTH,TOTAL"')

    @property
    def longest_round(self) -> int:
        """The most tokens one chain round can count: every step and the bonus token."""
        return (self.steps or 0) + 1


class MtpDrafting(BaseModel):
    """MTP heads: chain drafts per round (the first head drafts every step, as vLLM runs them), the heads the
    checkpoint has, its layout."""

    model_config = ConfigDict(extra="forbid")
    family: Literal["mtp"] = "mtp"
    steps: int | None = Field(default=None, description="chain drafts per round")
    mtp_layers: int = Field(description="MTP heads the checkpoint declares")
    layout: str = Field(description="how the checkpoint writes them: deepseek | qwen3_next")

    @property
    def longest_round(self) -> int:
        """The most tokens one chain round can count: every step and the bonus token."""
        return (self.steps or 0) + 1


Drafting = Annotated[DFlashDrafting | Eagle3Drafting | MtpDrafting, Field(discriminator="family")]
# The flat fields of reports written before the family blocks, each read into its family's block.
_FLAT_DRAFTING: dict[str, tuple[str, ...]] = {
    "dflash": ("block_size", "mask_token_id", "tree_budgets"),
    "eagle3": ("steps", "draft_vocab_size", "eagle_trees"),
    "mtp": ("steps",),
}
_FLAT_FIELDS = ("block_size", "mask_token_id", "steps", "draft_vocab_size", "tree_budgets", "eagle_trees")


def lift_flat_drafting(data: dict[str, Any]) -> dict[str, Any]:
    """A report body written before the family blocks (flat `block_size`, `steps`, ... beside
    `drafter_family`, "dflash" when absent) -> the same body with its family's `drafting` block. A body
    with a block and no `drafter_family` takes the block's family, a block without `family` the body's.
    ValueError for a flat field of another family that holds a value, or flat fields beside a block."""
    flat = {k: data[k] for k in _FLAT_FIELDS if k in data}
    rest = {k: v for k, v in data.items() if k not in flat}
    drafting = rest.get("drafting")
    block_family = drafting.get("family") if isinstance(drafting, dict) else getattr(drafting, "family", None)
    if "drafter_family" not in rest and block_family is not None:
        rest["drafter_family"] = block_family
    family = str(rest.get("drafter_family") or "dflash")
    if isinstance(drafting, dict) and block_family is None:
        rest["drafting"] = {**drafting, "family": family}
    if not flat:
        return rest
    if drafting is not None:
        raise ValueError(f"give {sorted(flat)} inside drafting, not beside it")
    own = _FLAT_DRAFTING.get(family, ())
    stray = sorted(k for k, v in flat.items() if k not in own and v not in (None, []))
    if stray:
        raise ValueError(f"{stray} do not apply to a {family} report")
    block = {k: v for k, v in flat.items() if k in own and v is not None}
    return {**rest, "drafting": {"family": family, **block}}


class EvalReport(BaseModel):
    """One checkpoint evaluated against one target: what was measured, how, and the results.

    Reports written before EAGLE-3 support load as DFlash reports (the defaults below), and reports
    written before the family blocks (flat `block_size`, `mask_token_id`, `steps`, `draft_vocab_size`,
    `tree_budgets`, `eagle_trees`) load with those fields in their family's `drafting` block."""

    model_config = ConfigDict(extra="forbid")
    checkpoint_path: str
    format: Literal["hf_dir", "torch_dict"]
    drafter_family: Literal["dflash", "eagle3", "mtp"] = "dflash"
    layout: str = Field(default="dflash", description='"dflash", or an EAGLE-3 layout: eagle | specforge | speculators')
    step: int | None
    epoch: int | None
    target_name: str
    target_fingerprint: str
    feature_storage: str = Field(
        default="exact",
        description='how the features were stored: "exact", or "float8_e4m3fn per-token scale" (a lossy store)',
    )
    target_layer_ids: list[int] = Field(description="the target layers fetched: 0-based decoder outputs")
    layer_ids_source: Literal["checkpoint", "default", "inferred", "override", "family"] = Field(
        description="where the layer ids came from (family: the family reads fixed layers, MTP the last)"
    )
    checkpoint_layer_ids: list[int] | None = Field(default=None, description="the ids as the checkpoint writes them")
    checkpoint_layer_convention: CheckpointLayerConvention = Field(
        default="decoder_output_0based",
        description="how checkpoint_layer_ids were read: layer_input i is decoder output i - 1",
    )
    layer_convention_source: Literal["layout", "override"] = Field(
        default="layout", description="the layout's convention, or --layer-convention"
    )
    drafting: Drafting = Field(description="how the family drafted: its own block (`family` says which)")
    draft_sampling: list[DraftSampling] = Field(
        default_factory=lambda: list[DraftSampling](["greedy"]),
        description="drafting modes measured: greedy (the chain walk) and, when asked, probabilistic",
    )
    inert_config_keys: list[str] = Field(
        default_factory=list, description="config keys the checkpoint has and the loader accepted as inert by request"
    )
    warnings: list[str] = Field(
        default_factory=list,
        description="what loading accepted or evaluating found that a reader should know (e.g. a t2d vLLM "
        "ignores, prompts without rounds)",
    )
    device: str
    dtype: str
    prompts: list[PromptEval]
    summary: EvalSummary

    @model_validator(mode="before")
    @classmethod
    def _flat(cls, data: Any) -> Any:
        return lift_flat_drafting(data) if isinstance(data, dict) else data

    @model_validator(mode="after")
    def _one_family(self) -> EvalReport:
        if self.drafting.family != self.drafter_family:
            raise ValueError(f"a {self.drafter_family} report with a {self.drafting.family} drafting block")
        return self
