"""The engine's narrow configuration and its caps (the composition root fills it from the settings).

The engine sits below the settings layer: `ninfer.config.groups` reads its bounds (concurrency,
draft lengths, the logprobs cap) and its defaults from here, so each is written once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

MAX_CONCURRENCY = 8  # lanes an engine may run (the contract's 1..8)
MTP_MAX_DRAFT = 5  # drafts per round through the MTP layer
DFLASH_MAX_DRAFT = 15  # a DFlash block of 16: the anchor + 15 masks
DEFAULT_DRAFT_TOKENS = 3  # k when speculation is asked for without a draft count
MAX_LOGPROBS = 20  # alternatives per token (sampled and prompt logprobs alike)
COLD_TIER_HOST_SHARE = 0.25  # no host arena size given: this share of the free host memory


@dataclass(frozen=True)
class SamplingOverrides:
    """Process-level settings (`sampling.*`): each set field overrides the registered preset."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None  # fixed seed for requests that omit one
    greedy: bool = False  # force temperature 0 for every request


@dataclass(frozen=True)
class EngineConfig:
    max_concurrency: int = 1  # lanes: active requests, each also a retained-prefix residency
    max_pending: int = 16  # requests allowed beyond the active set (lifetime tickets)
    pending_timeout_ms: int = 30000  # reservation -> admission deadline
    prefill_chunk: int = 1024
    max_context: int = 8192
    kv_capacity: int | str | None = None  # tokens, "auto", or None = max_context
    no_prefix_reuse: bool = False
    default_max_tokens: int = 8192  # for requests whose max_tokens is None
    device: str = "cpu"
    dtype: str = "float32"  # "float32" | "bfloat16"
    sampling: SamplingOverrides = field(default_factory=SamplingOverrides)
    # registered sampler presets by thinking mode (None = neutral sampling)
    thinking_preset: Mapping[str, float | int] | None = None
    non_thinking_preset: Mapping[str, float | int] | None = None
    stop_token_ids: tuple[int, ...] | None = None  # None = the model config's eos ids
    # Thinking budgets: the default for requests that set none (None: unlimited), and the template's
    # end of thinking as token ids ("\n</think>\n\n") with the `</think>` id (empty: no tokenizer,
    # budgets refused)
    default_thinking_budget: int | None = None
    think_close: tuple[int, ...] = ()
    think_end_id: int | None = None
    # Ids at or above this are never sampled: the embedding table is padded past the tokenizer's
    # vocabulary (248320 rows for 248077 ids). None = every row of the lm_head.
    vocab_limit: int | None = None
    # KV storage: None = the model dtype; "int8" = per-token per-head int8 with fp32 scales.
    kv_dtype: str | None = None
    no_cuda_graph: bool = False  # decode eagerly instead of replaying one CUDA graph per batch size
    compile: bool = False  # run the decode step through torch.compile (inductor)
    # decode/verify graphs launched in this many layer groups (None: 8 for MoE models, whose steps
    # are launch-bound, else 1; see graphs.CaptureBackend and the README's measurements)
    graph_segments: int | None = None
    # Plain decode launches round N+1 (fed its inputs on the device) before committing round N
    # while no other work waits, so the host's commit and planning overlap the GPU (Engine).
    launch_ahead: bool = True
    # Before ready, run a prefill of every length class a request can produce, so nothing
    # compiles after ready (engine.warmup). None: on a GPU (on the CPU nothing compiles).
    prefill_warmup: bool | None = None
    # Prompt chunks of up to this many tokens (padded to the next bucket) replay a one-row
    # captured graph instead of an eager forward (Runner._prefill_graph); () turns it off.
    prefill_graph_buckets: tuple[int, ...] = (16, 32, 48, 64)
    # Requests whose short chunks share one replay of a (rows, q) prefill graph; None: up to
    # max_concurrency, 1: one request per replay.
    prefill_graph_rows: int | None = None
    # Speculative decoding (frozen at startup; without a method no MTP weights or buffers exist).
    spec_method: str | None = None  # None | "mtp" | "dflash" (the artifact's dflash component)
    draft_tokens: int = DEFAULT_DRAFT_TOKENS  # k drafts per round: 1..5 for MTP, 1..15 for DFlash
    lm_head_draft: bool = False  # draft through the reduced-vocabulary proposal head
    # Benchmarking/testing aid, not a serving feature: when set, drafts are the target's own greedy
    # continuation (k extra target steps per round), each replaced by a wrong token with this
    # probability; no MTP head is needed. See ninfer.engine.speculative.oracle.
    spec_oracle_wrong_fraction: float | None = None
    spec_oracle_seed: int = 0
    # Cold tier for evicted retained prefixes: arenas on secondary CUDA devices and / or in host RAM.
    cold_tier: bool = True
    cold_tier_device: int = -1  # -1: every non-primary device with >= 512 MiB free
    cold_tier_capacity_mib: int = 0  # per arena; 0: the device's free memory minus 256 MiB
    # pinned host staging buffer for the chunked device-arena transfers; also the most bytes a
    # park keeps in flight on the transfer stream and a restore moves in one round
    cold_tier_staging_mib: int = 64
    # host-RAM arena: MiB (beside any device arenas), 0 none, None a share of the free host memory
    # when no secondary device holds the tier
    cold_tier_host_mib: int | None = None
    # > 0: a restore moves this many bytes per engine round instead of one decode step's worth
    cold_tier_restore_chunk_bytes: int = 0
