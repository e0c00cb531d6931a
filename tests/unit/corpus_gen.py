"""Deterministic multilingual test corpus for the tokenizer (generated at test time, never stored)."""

from __future__ import annotations

import random
import unicodedata
from collections.abc import Callable, Iterator

SPECIALS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|image_pad|>",
    "<|vision_end|>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
    "<|fim_prefix|>",
    "<|file_sep|>",
    "<tts_text_bos_single>",
    "<|audio_pad|>",
)

LATIN = (
    "déjà vu café naïve façade garçon élève Ökonomie Straße Übermäßig größer fiancée crème brûlée "
    "mañana niño pingüino acción corazón São Paulo coração ação Łódź zażółć gęślą jaźń Dvořák "
    "příliš žluťoučký kůň úpěl ďábelské ódy Tiếng Việt người Hà Nội phở bánh mì Ærøskøbing Ísland "
    "Þórr ðæt İstanbul ılık şoför çiğdem Ñandú"
).split()
ENGLISH = (
    "the quick brown fox jumps over lazy dog tokenizer byte pair encoding model server request "
    "response stream latency throughput attention layer cache prefix decode prefill sample token "
    "however although therefore international internationalization responsibilities"
).split()
CONTRACTIONS = (
    "'s",
    "'t",
    "'re",
    "'ve",
    "'m",
    "'ll",
    "'d",
    "'S",
    "'T",
    "'RE",
    "'Ve",
    "'M",
    "'LL",
    "'D",
    "'ſ",
    "’s",
)
CYRILLIC = (
    "Привет мир съешь же ещё этих мягких французских булок да выпей чаю Ёлка Україна ґанок Їжак".split()
)
GREEK = "Γαζέες καὶ μυρτιὲς δὲν θὰ βρῶ πιὰ στὸ χρυσαφὶ ξέφωτο ΑΒΓΔ ῾Ομηρος".split()
ARABIC = "العربية السَّلَامُ عَلَيْكُمْ مَرْحَبًا بِالْعَالَمِ كِتَابٌ مُحَمَّد ٱلرَّحْمَٰنِ ١٢٣ ٤٥٦".split()
HEBREW = "שָׁלוֹם עוֹלָם בְּרֵאשִׁית עברית".split()
DEVANAGARI = "नमस्ते दुनिया हिन्दी भाषा क्षत्रिय श्री ज्ञान संस्कृतम् १२३ ॐ".split()
THAI = "สวัสดีครับ ภาษาไทย น้ำใจ กรุงเทพมหานคร ๑๒๓ เด็กๆ".split()
OTHER_SCRIPTS = "தமிழ் বাংলা ગુજરાતી ਪੰਜਾਬੀ ქართული Հայերեն አማርኛ ខ្មែរ ລາວ မြန်မာ ᠮᠣᠩᠭᠣᠯ 한국어 안녕하세요".split()
EMOJI = (
    "😀 👍 👍🏽 👍🏿 👨‍👩‍👧‍👦 👩🏻‍💻 🏳️‍🌈 🇯🇵 🇺🇸 🇪🇺 1️⃣ #️⃣ ❤️ ❤ ☺️ 🧑🏾‍🤝‍🧑🏼 🫠 🐈‍⬛ 👁️‍🗨️ 🤷‍♀️ 💁🏽‍♂️ ✌🏻 🏴󠁧󠁢󠁳󠁣󠁴󠁿"
).split()
PUNCT_RUNS = (
    "!!!",
    "...",
    "?!",
    "=====",
    "-----",
    "***",
    "~~",
    "///",
    "\\\\",
    "<<>>",
    "(((",
    ")))",
    "«»",
    "——",
    "…",
    "、。",
    "！？",
    "【】",
    "«",
    "##",
    "```",
    "$$",
    "%%",
)
WHITESPACE = (
    " ",
    "  ",
    "   ",
    "    ",
    "\t",
    "\t\t",
    "\n",
    "\n\n",
    "\r\n",
    "\r\n\r\n",
    "\r",
    " \n",
    "\n ",
    "\u00a0",
    "\u3000",
    "\u2009",
    "\u200b",
    "\u000b",
    "\u000c",
    "\u0085",
    "\u2028",
)

PYTHON = '''def fib(n: int) -> int:
    """Return the n-th Fibonacci number."""
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


class Cache(dict):
    def __missing__(self, key):  # lazily compute
        self[key] = value = fib(key) ** 2 // 3
        return value
'''
JS = """export async function fetchAll(urls) {
\tconst out = [];
\tfor (const u of urls) {
\t\tconst r = await fetch(u, { method: 'GET', headers: { 'x-id': `${u.length}` } });
\t\tif (!r.ok) throw new Error(`bad ${r.status}`);
\t\tout.push(await r.json());
\t}
\treturn out.filter((x) => x?.ok ?? false);
}
"""
C = """#include <stdio.h>\r\nint main(int argc, char **argv) {\r\n    for (int i = 0; i < argc; ++i) printf("%s\\n", argv[i]);\r\n    return 0x7fffffff & ~0u;\r\n}\r\n"""
RUST = """fn main() -> Result<(), Box<dyn std::error::Error>> {
    let v: Vec<u64> = (0..1_000).map(|x| x * x).collect();
    println!("{:?}", v.iter().sum::<u64>());
    Ok(())
}
"""
SQL = "SELECT u.id, COUNT(*) AS n FROM users u JOIN orders o ON o.user_id = u.id WHERE o.total >= 100.50 GROUP BY u.id HAVING n > 3;\n"
HTML = '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>Test &amp; more</title></head>\n<body><p class="x">Hi&nbsp;there</p></body></html>\n'
JSON = '{"name": "ninfer", "version": [0, 1, 0], "nested": {"a": null, "b": true, "c": -1.5e-10}, "emoji": "\\ud83d\\ude00"}\n'
CODE = (PYTHON, JS, C, RUST, SQL, HTML, JSON)


def _digits(rng: random.Random) -> str:
    n = rng.choice((1, 2, 3, 4, 7, 12, 30))
    s = "".join(rng.choice("0123456789") for _ in range(n))
    return rng.choice((s, s + "." + s[:2], "-" + s, s + "%", "v" + s, "١٢٣" + s, "３４"))


def _random_chars(rng: random.Random) -> str:
    """A few characters from assorted Unicode blocks (assigned code points only)."""
    blocks = ((0x20, 0x7E), (0xA0, 0x24F), (0x300, 0x36F), (0x370, 0x3FF), (0x400, 0x4FF), (0x590, 0x6FF),
              (0x900, 0x97F), (0xE00, 0xE7F), (0x1100, 0x11FF), (0x2000, 0x206F), (0x2190, 0x23FF),
              (0x3040, 0x30FF), (0x4E00, 0x9FFF), (0xAC00, 0xD7A3), (0xFF00, 0xFFEF), (0x1F300, 0x1FAFF))  # fmt: skip
    out = []
    for _ in range(rng.randint(1, 8)):
        lo, hi = rng.choice(blocks)
        c = chr(rng.randint(lo, hi))
        if unicodedata.category(c) not in ("Cn", "Cs", "Co"):
            out.append(c)
    return "".join(out)


def _cjk(rng: random.Random) -> str:
    pools = ("的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动同工也能下过子说产种面而方后多定行学法所民得经十三之进着等部度家电力里如水化高自二理起小物现实加量都两体制机当使点从业本去把性好应开它合还因由其些然前外天政四日那社义事平形相全表间样与关各重新线内数正心反你明看原又么利比或但质气第向道命此变条只没结解问意建月公无系军很情者最立代想已通并提直题党程展五果料象员革位入常文总次品式活设及管特件长求老头基资边流路级少图山统接知较将组见计别她手角期根论运农指几九区强放决西被干做必战先回则任取据处理",
             "あいうえおかきくけこさしすせそアイウエオカキクケコガギグゲゴパピプペポーッャュョ漢字仮名",
             "가나다라마바사아자차카타파하한국어대한민국서울")  # fmt: skip
    pool = rng.choice(pools)
    return "".join(rng.choice(pool) for _ in range(rng.randint(1, 12)))


def _words(rng: random.Random, pool: tuple[str, ...] | list[str]) -> str:
    return " ".join(rng.choice(pool) for _ in range(rng.randint(1, 6)))


def _contraction(rng: random.Random) -> str:
    word = rng.choice(ENGLISH)
    word = rng.choice((word, word.upper(), word.capitalize()))
    return word + rng.choice(CONTRACTIONS) + rng.choice(("", " ", "s", "x"))


def _decomposed(rng: random.Random) -> str:
    """NFD / compatibility forms that NFC must fold back."""
    word = rng.choice([*LATIN, "한국어", "が", "Å", "ﬁ", "Ω", "\u212b", "e\u0301\u0327"])
    return unicodedata.normalize(rng.choice(("NFD", "NFC", "NFKD")), word)


def _fragment(rng: random.Random) -> str:
    makers: tuple[Callable[[], str], ...] = (
        lambda: _words(rng, ENGLISH),
        lambda: _words(rng, LATIN),
        lambda: _words(rng, CYRILLIC),
        lambda: _words(rng, GREEK),
        lambda: _words(rng, ARABIC),
        lambda: _words(rng, HEBREW),
        lambda: _words(rng, DEVANAGARI),
        lambda: _words(rng, THAI),
        lambda: _words(rng, OTHER_SCRIPTS),
        lambda: "".join(rng.choice(EMOJI) for _ in range(rng.randint(1, 5))),
        lambda: _cjk(rng),
        lambda: _digits(rng),
        lambda: rng.choice(PUNCT_RUNS) * rng.randint(1, 4),
        lambda: rng.choice(WHITESPACE) * rng.randint(1, 40),
        lambda: _contraction(rng),
        lambda: rng.choice(SPECIALS),
        lambda: _random_chars(rng),
        lambda: _decomposed(rng),
        lambda: rng.choice(CODE)[: rng.randint(10, 400)],
    )
    weights = (8, 4, 2, 2, 2, 1, 2, 2, 2, 2, 4, 3, 2, 3, 2, 1, 2, 1, 4)
    return rng.choices(makers, weights)[0]()


def _joiner(rng: random.Random) -> str:
    return rng.choices(("", " ", "\n", ", ", ". ", "\t", "\r\n", "  "), (3, 10, 2, 2, 2, 1, 1, 1))[0]


def corpus_chunks(seed: int = 0, min_bytes: int = 1 << 20) -> Iterator[str]:
    """Chunks of 1-4 KB of mixed text until at least ``min_bytes`` UTF-8 bytes in total."""
    rng = random.Random(seed)
    total = 0
    while total < min_bytes:
        parts: list[str] = []
        size = 0
        target = rng.randint(1000, 4000)
        while size < target:
            piece = _fragment(rng) + _joiner(rng)
            parts.append(piece)
            size += len(piece.encode("utf-8"))
        chunk = "".join(parts)
        total += size
        yield chunk


def corpus_fragments(seed: int = 1, count: int = 2000) -> list[str]:
    """Short fragments of the same kinds as the corpus (an alphabet for property tests)."""
    rng = random.Random(seed)
    return [_fragment(rng) for _ in range(count)]


def token_soup(tokens: list[str], seed: int = 2, count: int = 30000) -> list[str]:
    """Strings made of 2-6 random vocabulary tokens: they stress the order of merges."""
    rng = random.Random(seed)
    return ["".join(rng.choice(tokens) for _ in range(rng.randint(2, 6))) for _ in range(count)]
