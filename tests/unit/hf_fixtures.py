"""Tiny random Hugging Face Qwen3.5 / Qwen3.5-MoE checkpoints on disk, built with transformers.

Stable API (shared by several test suites; import as ``from hf_fixtures import ...`` from
tests/unit, or after ``sys.path.insert(0, "tests/unit")`` elsewhere):

    make_hf_checkpoint(out_dir, kind="dense"|"moe", *, vl=False, with_mtp=True,
                       mtp_separate_file=False, per_expert_keys=False, sharded=False, seed=0,
                       dtype=torch.float32, with_tokenizer=False, template="qwen3_6",
                       template_in_tokenizer_config=False, init_std=0.1, **config_overrides) -> Path
    read_hf_tensors(path) -> dict[str, torch.Tensor]   every tensor of every *.safetensors file
    TINY_TEXT, TINY_MOE, TINY_VISION                    the default config dicts

The checkpoint is what ``save_pretrained`` writes for ``Qwen3_5ForCausalLM`` /
``Qwen3_5MoeForCausalLM`` (text names ``model.*``), or for ``vl=True`` the
``*ForConditionalGeneration`` class (``model.language_model.*``, ``model.visual.*``, a top-level
config with ``text_config``/``vision_config``), with a tiny vision tower. Every parameter is random
from ``torch.Generator().manual_seed(seed)``: projections and 1+w norm offsets N(0, init_std),
the GDN gated-norm weight and ``dt_bias`` 1 + N(0, init_std), ``A_log`` = log U(1, 16).
``A_log`` stays float32 whatever ``dtype`` is (as in the released checkpoints).

``with_mtp`` adds the MTP head: ``mtp.fc.weight`` (H, 2H), the three MTP
norms and ``mtp.layers.0.*`` = one full-attention decoder layer with the model's FFN type, in the
last weight file (or in a separate ``mtp.safetensors`` that the index does not name), and sets
``mtp_num_hidden_layers: 1`` in the config. ``per_expert_keys`` rewrites the fused MoE experts as
``mlp.experts.{e}.{gate,up,down}_proj.weight`` (transformers loads both). ``sharded`` writes
several files plus ``model.safetensors.index.json``. ``config_overrides`` update the text config
(e.g. ``vocab_size=248320``, ``num_hidden_layers=8``). No ``tokenizer.json`` unless asked for;
the chat template is the official ``qwen3_6`` one (``template=None`` writes none).
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

TINY_TEXT: dict[str, Any] = {
    "vocab_size": 512,
    "hidden_size": 64,
    "num_hidden_layers": 4,  # layer 3 is full attention
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4,
    "intermediate_size": 128,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 10_000_000.0,
        "partial_rotary_factor": 0.25,  # rotary 8 -> mrope_section sums to 4
        "mrope_section": [2, 1, 1],
        "mrope_interleaved": True,
    },
}
TINY_MOE: dict[str, Any] = {
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 32,
}
TINY_VISION: dict[str, Any] = {
    "depth": 1,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_heads": 2,
    "patch_size": 4,
    "num_position_embeddings": 16,
}
GENERATION_CONFIG = {
    "bos_token_id": 248044,
    "eos_token_id": [248046, 248044],
    "pad_token_id": 248044,
    "do_sample": True,
    "temperature": 0.6,
    "top_k": 20,
    "top_p": 0.95,
}


def _build_model(kind: str, vl: bool, text: dict[str, Any]) -> torch.nn.Module:
    import transformers as tf

    moe = kind == "moe"
    if not vl:
        cfg_cls = tf.Qwen3_5MoeTextConfig if moe else tf.Qwen3_5TextConfig
        model_cls = tf.Qwen3_5MoeForCausalLM if moe else tf.Qwen3_5ForCausalLM
        return model_cls(cfg_cls(**text))
    cfg_cls = tf.Qwen3_5MoeConfig if moe else tf.Qwen3_5Config
    model_cls = tf.Qwen3_5MoeForConditionalGeneration if moe else tf.Qwen3_5ForConditionalGeneration
    vision = {**TINY_VISION, "out_hidden_size": text["hidden_size"]}
    return model_cls(cfg_cls(text_config=text, vision_config=vision))


def _random_like(name: str, shape: torch.Size, g: torch.Generator, std: float) -> torch.Tensor:
    if name.endswith("linear_attn.A_log"):
        return torch.empty(shape).uniform_(1.0, 16.0, generator=g).log_()
    t = torch.empty(shape).normal_(0.0, std, generator=g)
    if name.endswith(("linear_attn.norm.weight", "linear_attn.dt_bias")):
        t += 1.0
    return t


def _split_experts(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Fused `mlp.experts.{gate_up_proj,down_proj}` -> per-expert `{e}.{gate,up,down}_proj.weight`."""
    out: dict[str, torch.Tensor] = {}
    for name, t in sd.items():
        if name.endswith("mlp.experts.gate_up_proj"):
            p, half = name.removesuffix("gate_up_proj"), t.shape[1] // 2  # [E, 2*Ie, H]: gate rows, then up
            for e in range(t.shape[0]):
                out[f"{p}{e}.gate_proj.weight"] = t[e, :half].clone()
                out[f"{p}{e}.up_proj.weight"] = t[e, half:].clone()
        elif name.endswith("mlp.experts.down_proj"):  # [E, H, Ie]
            p = name.removesuffix("down_proj")
            for e in range(t.shape[0]):
                out[f"{p}{e}.down_proj.weight"] = t[e].clone()
        else:
            out[name] = t
    return out


def _mtp_tensors(model: torch.nn.Module, vl: bool, g: torch.Generator, std: float) -> dict[str, torch.Tensor]:
    """Random MTP head: fc, three norms and a copy of the shapes of one full-attention trunk layer."""
    text_cfg = model.config.get_text_config()
    h = text_cfg.hidden_size
    attn = text_cfg.layer_types.index("full_attention")
    prefix = f"model.{'language_model.' if vl else ''}layers.{attn}."
    shapes: dict[str, tuple[torch.Size, torch.dtype]] = {
        "mtp.fc.weight": (torch.Size([h, 2 * h]), torch.float32),
        "mtp.pre_fc_norm_embedding.weight": (torch.Size([h]), torch.float32),
        "mtp.pre_fc_norm_hidden.weight": (torch.Size([h]), torch.float32),
        "mtp.norm.weight": (torch.Size([h]), torch.float32),
    }
    for name, p in model.state_dict().items():
        if name.startswith(prefix):
            shapes["mtp.layers.0." + name.removeprefix(prefix)] = (p.shape, p.dtype)
    return {n: _random_like(n, s, g, std).to(dt) for n, (s, dt) in shapes.items()}


def _weight_files(out: Path) -> list[Path]:
    index = out / "model.safetensors.index.json"
    if index.is_file():
        wm = json.loads(index.read_text())["weight_map"]
        return [out / f for f in dict.fromkeys(wm.values())]
    return [out / "model.safetensors"]


def _rewrite_index(out: Path) -> None:
    index = out / "model.safetensors.index.json"
    if not index.is_file():
        return
    data = json.loads(index.read_text())
    weight_map, total = {}, 0
    for f in dict.fromkeys(data["weight_map"].values()):
        for name, t in load_file(out / f).items():
            weight_map[name] = f
            total += t.nbytes
    data["weight_map"] = dict(sorted(weight_map.items()))
    data["metadata"] = {**data.get("metadata", {}), "total_size": total}
    index.write_text(json.dumps(data, indent=2) + "\n")


def make_hf_checkpoint(
    out_dir: str | Path,
    kind: str = "dense",
    *,
    vl: bool = False,
    with_mtp: bool = True,
    mtp_separate_file: bool = False,
    per_expert_keys: bool = False,
    sharded: bool = False,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    with_tokenizer: bool = False,
    template: str | None = "qwen3_6",
    template_in_tokenizer_config: bool = False,
    init_std: float = 0.1,
    **config_overrides: Any,
) -> Path:
    """Write a tiny random checkpoint directory to `out_dir` (created) and return its path."""
    if kind not in ("dense", "moe"):
        raise ValueError(f"kind must be 'dense' or 'moe', not {kind!r}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    text = {**TINY_TEXT, **(TINY_MOE if kind == "moe" else {}), **config_overrides}
    if kind == "moe":
        text.pop("intermediate_size", None)
    torch.manual_seed(seed)  # module construction draws from the global generator; all values are replaced
    model = _build_model(kind, vl, text)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            p.copy_(_random_like(name, p.shape, g, init_std))
        model.to(dtype)
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.data = p.data.float()
    size = sum(p.numel() for p in model.parameters()) * torch.finfo(dtype).bits // 8
    shard = f"{max(1, math.ceil(size / 4 / 1000))}KB" if sharded else "50GB"  # about four shards
    model.save_pretrained(out, max_shard_size=shard)

    files = _weight_files(out)
    mtp = _mtp_tensors(model, vl, g, init_std) if with_mtp else {}
    for i, f in enumerate(files):
        sd = {k: v.clone() for k, v in load_file(f).items()}  # never overwrite a mapped file
        if mtp and not mtp_separate_file and i == len(files) - 1:
            sd.update(mtp)
        if per_expert_keys:
            sd = _split_experts(sd)
        save_file(sd, f, metadata={"format": "pt"})
    if mtp and mtp_separate_file:
        save_file(
            _split_experts(mtp) if per_expert_keys else mtp,
            out / "mtp.safetensors",
            metadata={"format": "pt"},
        )
    _rewrite_index(out)

    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    if with_mtp:
        (cfg.get("text_config") or cfg)["mtp_num_hidden_layers"] = 1
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG, indent=2) + "\n")
    if template is not None:
        from ninfer.templates import read_template

        text_tpl = read_template(template)
        if template_in_tokenizer_config:
            tok_cfg = {"tokenizer_class": "Qwen2Tokenizer", "add_bos_token": False, "chat_template": text_tpl}
            (out / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2) + "\n")
        else:
            (out / "chat_template.jinja").write_text(text_tpl, encoding="utf-8", newline="")
    if with_tokenizer:
        from ninfer.text.builder import cached_tokenizer_json

        shutil.copyfile(cached_tokenizer_json(), out / "tokenizer.json")
    return out


def read_hf_tensors(path: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of every top-level `*.safetensors` file of a checkpoint directory."""
    out: dict[str, torch.Tensor] = {}
    for f in sorted(Path(path).glob("*.safetensors")):
        out.update(load_file(f))
    return out
