"""Stop strings across token boundaries with the real tokenizer, held-back text, stop tokens."""

from __future__ import annotations

from ninfer.engine.stops import StopChecker
from ninfer.text.detok import IncrementalDetokenizer

TEXT = "The answer is 42. Everything else follows naturally, 日本語 too."


def _run(tokenizer, stops, text=TEXT, stop_ids=frozenset()):
    ids = tokenizer.encode(text)
    chk = StopChecker(stop_ids, stops, IncrementalDetokenizer(tokenizer))
    visible, used = [], 0
    for t in ids:
        used += 1
        delta, hit = chk.push(t)
        visible.append(delta)
        if hit is not None:
            return "".join(visible), hit, used, ids
    visible.append(chk.flush())
    return "".join(visible), None, used, ids


def test_stop_string_across_tokens(tokenizer) -> None:
    for stop in ("42. Every", "s 4", "else fol", "日本"):
        vis, hit, used, ids = _run(tokenizer, (stop, "never-there"))
        assert hit is not None and hit.string == stop
        assert vis == TEXT[: TEXT.index(stop)]
        # the match completed exactly at the token that finished the stop text
        assert stop in tokenizer.decode(ids[:used]) and stop not in tokenizer.decode(ids[: used - 1])


def test_earliest_stop_wins_and_no_match_flushes_everything(tokenizer) -> None:
    vis, hit, _, _ = _run(tokenizer, ("follows", "answer"))
    assert hit.string == "answer" and vis == "The "
    vis, hit, used, ids = _run(tokenizer, ("zzz", "too!"))
    assert hit is None and vis == TEXT and used == len(ids)


def test_held_back_text_is_released_at_the_end(tokenizer) -> None:
    # the text ends with a prefix of the stop string: held while ambiguous, then flushed
    vis, hit, _, _ = _run(tokenizer, ("too. And",))
    assert hit is None and vis == TEXT


def test_stop_token_adds_no_text(tokenizer) -> None:
    im_end = tokenizer.token_to_id("<|im_end|>")
    ids = [*tokenizer.encode("Hi there"), im_end]
    chk = StopChecker(frozenset({im_end}), (), IncrementalDetokenizer(tokenizer))
    out = [chk.push(t) for t in ids]
    assert "".join(d for d, _ in out) == "Hi there"
    assert out[-1][1].token_id == im_end and all(h is None for _, h in out[:-1])
