"""`python -m ninfer.artifact {convert,inspect,verify,import,synth,demo,lm-head-draft,add-dflash}`: every
failure is one line on stderr (exit 1; a seed-format file that breaks a container rule: exit 2)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from ninfer.artifact.errors import ArtifactError
from ninfer.artifact.profiles import PROFILES
from ninfer.artifact.released import RELEASED_SHAPES


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024  # type: ignore[assignment]
    return f"{n} B"


def _inspect(path: Path, tensors: bool = False) -> int:
    from ninfer.artifact.opener import open_artifact

    a = open_artifact(path)
    c, m = a.config, a.manifest
    if a.manifest.created_by.startswith("seed "):
        _inspect_seed(a, tensors)
        _inspect_config(c)
        return 0
    print(f"artifact      {a.path}")
    print(f"model_id      {a.model_id}")
    print(f"display_name  {m.identity.display_name}")
    print(f"family        {a.family}")
    print(f"source        {m.identity.source}")
    print(f"format        v{m.format_version}, created by {m.created_by}")
    if a.synthetic is not None:
        print(
            f"weights       SYNTHETIC: drawn at load time from seed {a.synthetic['seed']} "
            "(no weight files; generated text is not meaningful)"
        )
    for name, comp in m.components.items():
        print(
            f"component     {name:<14} {comp.tensor_count:>6} tensors  {_size(comp.bytes):>11}  {len(comp.files)} file(s)"
        )
    _inspect_formats(a, tensors)
    total = sum(comp.bytes for comp in m.components.values())
    print(f"total         {sum(x.tensor_count for x in m.components.values())} tensors, {_size(total)}")
    _inspect_config(c)
    return 0


def _inspect_config(c) -> None:  # type: ignore[no-untyped-def]
    ffn = (
        f"dense FFN {c.intermediate_size}"
        if not c.is_moe
        else f"MoE {c.num_experts} experts top-{c.num_experts_per_tok} x {c.moe_intermediate_size}, "
        f"shared {c.shared_expert_intermediate_size}"
    )
    print(
        f"config        hidden {c.hidden_size}, {c.num_hidden_layers} layers "
        f"({len(c.attention_layers)} attention at {list(c.attention_layers)[:4]}{'…' if len(c.attention_layers) > 4 else ''}), "
        f"vocab {c.vocab_size}"
    )
    print(
        f"              attention {c.num_attention_heads}/{c.num_key_value_heads} heads x {c.head_dim} "
        f"(rotary {c.rotary_dim}, theta {c.rope_theta:g}), GDN {c.linear_num_key_heads}/{c.linear_num_value_heads} "
        f"heads x {c.linear_key_head_dim}/{c.linear_value_head_dim}"
    )
    print(f"              {ffn}, MTP layers {c.mtp_num_hidden_layers}, eos {list(c.eos_token_ids)}")


def _inspect_seed(a, tensors: bool) -> None:  # type: ignore[no-untyped-def]
    """A seed container: identity, files, components, stored formats with bits per weight, what
    loads natively, what is dequantized to bf16 at load, what is not loaded."""
    from collections import Counter

    from ninfer.artifact.seed_container import FORMATS

    sf = a.sf
    print(f"artifact      {a.path} (seed .ninfer container v{sf.version})")
    print(f"model_id      {a.model_id}" + (f" / weights {sf.weights_id}" if sf.weights_id else ""))
    if sf.artifact_id is not None:
        print(f"artifact_id   {sf.artifact_id.hex()}")
    shown = ", ".join(f"{p.path.name} ({_size(p.payload_bytes)})" for p in sf.parts[:3])
    print(f"files         {len(sf.parts)}: {shown}{', …' if len(sf.parts) > 3 else ''}")
    if sf.components:
        print(f"components    {', '.join(sf.components)} (in the file)")
    roles = sf.resource_roles()
    print(f"resources     {', '.join(roles)}")
    count: Counter[str] = Counter()
    nbytes: Counter[str] = Counter()
    weights: Counter[str] = Counter()
    for o in sf.tensors():
        count[o.format] += 1
        nbytes[o.format] += o.nbytes
        weights[o.format] += o.elements
    for fmt in sorted(count, key=lambda f: -nbytes[f]):
        kind = FORMATS[fmt].kind
        how = {"groupwise": "our groupwise kernels, as stored", "direct": "as stored"}.get(
            kind, "DEQUANTIZED TO BF16 AT LOAD (no native kernel: bf16 memory and speed)"
        )
        bpw = 8 * nbytes[fmt] / weights[fmt]
        print(
            f"format        {fmt:<20} {count[fmt]:>5} objects {_size(nbytes[fmt]):>11}  {bpw:5.2f} bits/weight  {how}"
        )
    for comp in a.components:
        info = a.tensor_infos(comp)
        print(
            f"component     {comp:<6} {len(info):>5} tensors loaded ({_size(sum(i.nbytes for i in info.values()))} in memory)"
        )
    _inspect_seed_dflash(a)
    slow = a.dequantized_on_load()
    if slow:
        print(f"dequantized   {len(slow)} tensors load as bf16 (e.g. {slow[0]})")
    if a.unloaded:
        groups = sorted({n.split("/")[0] for n in a.unloaded})
        print(
            f"not loaded    {len(a.unloaded)} parameters of {', '.join(groups)} (ninfer does not load these from a seed file)"
        )
    _inspect_formats(a, False)
    if tensors:
        for comp in a.components:
            stored = a.stored_formats(comp)
            for name, i in sorted(a.tensor_infos(comp).items()):
                print(f"  {comp:<6} {name:<60} {'+'.join(stored[name]):<28} {i.dtype:<8} {list(i.shape)}")


def _inspect_seed_dflash(a) -> None:  # type: ignore[no-untyped-def]
    """The file's DFlash companion: the drafter it loads as and where its config comes from, or why
    it does not load."""
    d = a.dflash
    if d is None:
        why = a.not_loaded("dflash")
        if why is not None:
            print(f"dflash        NOT LOADED: {why}")
        return
    sliding = sum(t == "sliding_attention" for t in d.layer_types)
    mask = {None: "sliding layers causal, the others not", True: "causal", False: "non-causal"}[d.is_causal]
    print(
        f"dflash        drafter of {d.num_hidden_layers} layers, hidden {d.hidden_size}, heads "
        f"{d.num_attention_heads}/{d.num_key_value_heads} x {d.head_dim}, FFN {d.intermediate_size}, "
        f"features of target layers {list(d.target_layer_ids)}, block {d.block_size}, mask id {d.mask_token_id}"
    )
    print(
        f"              {sliding} sliding-window layers (window {d.sliding_window}), attention {mask}; "
        f"config from {a.dflash_source}; --spec dflash dequantizes its matrices to the engine dtype "
        "(the drafter runs dense weights)"
    )


def _import(src: Path, out: Path, force: bool) -> Path:
    """A seed file -> our artifact directory: groupwise tensors as their planes, the rest as loaded;
    a DFlash companion as our `dflash` component with its config as a checkpoint's config.json."""
    from ninfer.artifact.opener import open_artifact
    from ninfer.artifact.writer import ArtifactWriter
    from ninfer.formats import QuantWeight

    a = open_artifact(src)
    if not a.manifest.created_by.startswith("seed "):
        raise ArtifactError(
            f"{src} is not a seed .ninfer file (import reads those; convert reads checkpoints)"
        )
    with ArtifactWriter(out, overwrite=force) as w:
        w.profile = a.weight_profile if a.quantized else "bf16"
        for comp in a.components:
            cw = w.component(comp)
            tensors = a.load_tensors(comp)
            if comp == "lm_head_draft":  # the seed's ids come by frequency; ours are ascending
                from ninfer.artifact.lm_head_draft import sorted_draft

                tensors = sorted_draft(tensors)
            for name, t in tensors.items():
                cw.add_quantized(name, t) if isinstance(t, QuantWeight) else cw.add(name, t.contiguous())
        if a.has_component("dflash"):  # our component keeps its config beside it, as a checkpoint's
            from ninfer.artifact.reader import DFLASH_CONFIG

            w.write_json(DFLASH_CONFIG, a.dflash_config().to_hf())
        w.write_json("config.json", a.config.to_dict())
        w.write_json("generation.json", a.generation)
        w.write_text("frontend/chat_template.jinja", a.chat_template)
        w.copy_file("tokenizer/tokenizer.json", a.tokenizer_path)
        for name in ("preprocessor_config.json", "video_preprocessor_config.json"):
            media = a.media_config(name)
            if media is not None:
                w.write_json(f"media/{name}", media)
        return w.finish(a.manifest.identity)


def _inspect_formats(a, tensors: bool) -> None:  # type: ignore[no-untyped-def]
    """The weight profile, bits per weight over the text and MTP matrices, each format's count;
    `tensors`: every tensor's format and shape."""
    from collections import Counter

    from ninfer.formats.registry import FORMATS

    counts: Counter[str] = Counter()
    bits, weights = 0, 0
    for comp in ("text", "mtp"):
        if not a.has_component(comp):
            continue
        for name, info in a.tensor_infos(comp).items():
            if len(info.shape) < 2 or name.endswith("conv1d.weight"):
                continue  # norms, conv taps, A_log: not matrices
            numel = 1
            for d in info.shape:
                numel *= d
            counts[info.dtype] += 1
            bits += 8 * info.nbytes
            weights += numel
    kinds = ", ".join(
        f"{n} {k}" for k, n in sorted(counts.items(), key=lambda kv: (kv[0] not in FORMATS, kv[0]))
    )
    bpw = f"{bits / weights:.2f} bits per weight" if weights else "no matrices"
    print(f"weights       profile {a.weight_profile}: {bpw} over the text and MTP matrices ({kinds})")
    if tensors:
        for comp in a.components:
            for name, info in sorted(a.tensor_infos(comp).items()):
                print(f"  {comp:<13} {name:<60} {info.dtype:<14} {list(info.shape)}")


def _verify(path: Path) -> int:
    from ninfer.artifact.opener import open_artifact

    a = open_artifact(path, verify=True)
    print(f"ok: {a.path} ({a.model_id}, {len(a.manifest.digests)} files, digests and shapes match)")
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m ninfer.artifact", description="Build and check .ninfer artifacts."
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("convert", help="convert a Hugging Face checkpoint directory")
    c.add_argument("hf_dir", type=Path)
    c.add_argument("out", type=Path)
    c.add_argument(
        "--model-id", default=None, help="public model id (default: registry match, else dir name)"
    )
    c.add_argument("--dtype", default="keep", choices=("keep", "bfloat16", "float32"))
    c.add_argument("--weights", default=None, choices=PROFILES, metavar="PROFILE",
                   help="weight profile: " + ", ".join(PROFILES) + " (default: as the checkpoint is; "
                   "an FP8 checkpoint stays fp8)")  # fmt: skip
    c.add_argument("--template", default=None, choices=("qwen3_6", "qwen3_5", "qwen3_8"),
                   help="official chat template to use (required when the checkpoint has none)")  # fmt: skip
    c.add_argument("--force", action="store_true", help="replace OUT if it exists")
    c.add_argument("--lm-head-draft-corpus", type=Path, default=None,
                   help="also add the reduced-vocabulary proposal head built from this text corpus")  # fmt: skip
    c.add_argument("--lm-head-draft-size", type=int, default=32768, help="ids in the proposal head")
    h = sub.add_parser("lm-head-draft", help="add the reduced-vocabulary proposal head to an artifact")
    h.add_argument("path", type=Path)
    src = h.add_mutually_exclusive_group(required=True)
    src.add_argument("--corpus", type=Path, help="UTF-8 text, tokenized with the artifact's tokenizer")
    src.add_argument("--frequencies", type=Path, help="token counts: JSON {id: count} or 'ID COUNT' lines")
    h.add_argument("--size", type=int, default=32768, help="number of token ids kept")
    f = sub.add_parser("add-dflash", help="add a DFlash drafter (HF directory) as the dflash component")
    f.add_argument("path", type=Path)
    f.add_argument("drafter_dir", type=Path)
    i = sub.add_parser("inspect", help="print identity, components, weight formats and config")
    i.add_argument("path", type=Path)
    i.add_argument("--tensors", action="store_true", help="also list every tensor's format and shape")
    m = sub.add_parser("import", help="write our artifact directory from a seed system's .ninfer file")
    m.add_argument("path", type=Path)
    m.add_argument("out", type=Path)
    m.add_argument("--force", action="store_true", help="replace OUT if it exists")
    v = sub.add_parser("verify", help="recompute digests and check shapes")
    v.add_argument("path", type=Path)
    y = sub.add_parser(
        "synth", help="an artifact of a released shape whose weights are drawn at load time (no weight files)"
    )
    y.add_argument("out", type=Path)
    y.add_argument("--shape", required=True, choices=tuple(RELEASED_SHAPES), help="released model shape")
    y.add_argument("--layers", type=int, default=None, help="keep only the first N decoder layers")
    y.add_argument("--no-mtp", action="store_true", help="leave out the MTP layer")
    y.add_argument("--seed", type=int, default=0)
    y.add_argument("--weights", default="bf16", choices=PROFILES, metavar="PROFILE",
                   help="formats the drawn weights take: " + ", ".join(PROFILES))  # fmt: skip
    y.add_argument("--force", action="store_true", help="replace OUT if it exists")
    d = sub.add_parser("demo", help="build the small random-weight demo artifact")
    d.add_argument("out", type=Path)
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--force", action="store_true", help="replace OUT if it exists")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    start = time.perf_counter()
    try:
        if args.cmd == "inspect":
            return _inspect(args.path, args.tensors)
        if args.cmd == "verify":
            return _verify(args.path)
        if args.cmd == "lm-head-draft":
            from ninfer.artifact.lm_head_draft import add_lm_head_draft

            out = add_lm_head_draft(args.path, args.size, corpus=args.corpus, frequencies=args.frequencies)
        elif args.cmd == "import":
            out = _import(args.path, args.out, args.force)
        elif args.cmd == "add-dflash":
            from ninfer.artifact.dflash import add_dflash

            out = add_dflash(args.path, args.drafter_dir)
        elif args.cmd == "convert":
            from ninfer.artifact.convert import convert

            out = convert(
                args.hf_dir,
                args.out,
                model_id=args.model_id,
                dtype=args.dtype,
                weights=args.weights,
                template=args.template,
                force=args.force,
            )
            if args.lm_head_draft_corpus is not None:
                from ninfer.artifact.lm_head_draft import add_lm_head_draft

                add_lm_head_draft(out, args.lm_head_draft_size, corpus=args.lm_head_draft_corpus)
        elif args.cmd == "synth":
            from ninfer.artifact.synth import synth

            out = synth(
                args.out,
                args.shape,
                layers=args.layers,
                mtp=not args.no_mtp,
                seed=args.seed,
                force=args.force,
                weights=args.weights,
            )
        else:
            from ninfer.artifact.demo import build_demo

            out = build_demo(args.out, seed=args.seed, force=args.force)
    except ArtifactError as exc:
        from ninfer.artifact.seed_container import SeedFormatError

        print(f"error: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, SeedFormatError) else 1
    except (OSError, RuntimeError, ValueError) as exc:  # disk full, permissions, missing dependency
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    print(f"wrote {out} in {time.perf_counter() - start:.1f}s", file=sys.stderr)
    return 0
