"""Built-in texts on which a fast encoder must give `tokenizers`' ids before it may count.

Fast reimplementations of `tokenizers` differ where its rules are subtle:
byte fallback, normalizers, the added-token flags (lstrip, rstrip,
single_word, normalized), Metaspace / Prepend rules at the start of a piece,
ByteLevel's prefix space, Unicode whitespace outside ASCII (U+180E, U+0085,
U+001C..U+001F are "spaces" for some libraries and not for others) and
post-processors.  The texts here aim at each of those, built from the
tokenizer's own added tokens (with whitespace and word characters hard
against either side, next to each other, cut short, mis-cased), plus fixed
fragments in many scripts.  They are deterministic: the same tokenizer gets
the same texts on every load.

`tests/support/textgen.py` draws its randomised texts from the same fragments.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

SCRIPTS = [
    "Hello world", "naïve café résumé", "Zürich Straße", "e\u0301\u0302 a\u0308\u0323", "ǅemal Ǉubljana",
    "Привет, мир", "Γειά σου Κόσμε", "مرحبا بالعالم", "שלום עולם", "नमस्ते दुनिया", "ক্ষ্ম", "வணக்கம்",
    "สวัสดีชาวโลก", "ສະບາຍດີ", "မင်္ဂလာပါ", "ሰላም ዓለም", "Բարեւ", "გამარჯობა", "你好，世界", "學而不思則罔",
    "こんにちは世界", "カタカナ ﾊﾝｶｸ", "안녕하세요 세계", "한국어 텍스트입니다", "각", "𠀀𠀁𪚥", "Ａｂｃ１２３",
    "ﬁ ﬂ ﬃ", "Ⅻ ① ⓐ", "ℌ𝔢𝔩𝔩𝔬 𝐁𝐨𝐥𝐝", "µ Å Ω K", "\u00ad soft\u00adhyphen", "zero\u200bwidth\u200cjoin\u200d",
    "\u202eRTL override\u202c", "ı İ ß ẞ", "Ǆ ǆ", "ꙮ", "ᚠᛇᚻ", "ⴰⵣⵓⵍ",
]
WHITESPACE = [
    " ", "  ", "   ", "    ", "        ", "\t", "\t\t", "\n", "\n\n", "\n\n\n", "\r\n", "\r", " \n", "\n ",
    " \t\n ", "\xa0", "\u3000", "\u2000", "\u2009", "\u200a", "\u2028", "\u2029", "\u202f", "\u205f",
    "\u1680", "\x85", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x1f", "\u180e", " " * 33,
]
EMOJI = [
    "🐶", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🧑🏿‍💻", "❤️", "❤\ufe0f\u200d🔥", "🇰🇷🇯🇵",
    "🏴\U000e0067\U000e0062\U000e0065\U000e006e\U000e0067\U000e007f", "1️⃣", "©️", "🫠", "🦀🐍", "😀😃😄😁",
]
CODE = [
    "def f(x):\n    return x<y and x>=0\n", "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}",
    "SELECT * FROM t WHERE a <> 'b';", "<div class=\"x\">&amp;</div>", "fn main() { println!(\"{}\", 1); }",
    "#include <stdio.h>", "x = {'a': [1, 2.5e-3], \"b\": None}", "$ ls -la | grep '\\.py$'",
    "    if (a && b || !c) return;", "λx.x", "a==b!=c<=d>=e->f=>g::h", "0x1F 0b1010 1_000_000",
    "// comment\n/* block */", "'''doc'''", "\\n\\t\\\\", "```python\nprint(1)\n```",
]
PUNCT_AND_DIGITS = [
    "1234567890", "3.14159", "1,000,000", "12:30", "2024-01-01", "don't", "I'm", "we'll", "'s", "'S",
    "!!!", "...", "—", "–", "«»", "„“", "¿¡", "()", "[]", "{}", "<>", "<|", "|>", "<<", ">>", "</", "/>",
    "｜", "▁", "Ġ", "Ċ", "\u2581\u2581", "##", "@@", "<0x0A>", "<unk>", "[UNK]", "&#x27;",
]
BYTE_FALLBACK = [
    "\ue000", "\uf8ff", "\U000f0000", "\U0010fffd", "\x00", "\x01", "\x07", "\x7f", "\x9f", "\ufffd",
    "\ufeff", "\U0001d11e", "\U0001f9ff", "\U00020bb7", "\u0378",  # the last one is unassigned
    "\U000e0001", "\u180e", "\ufe0f", "\u034f",
]
FRAGMENTS = SCRIPTS + EMOJI + CODE + PUNCT_AND_DIGITS + BYTE_FALLBACK

# What stands hard against an added token on its left / right.
_LEFT = ["", " ", "  ", "\n", "\t", "a", "Hello ", "\u3000", "\xa0", "。", "\u180e", "\x1c", "🐶"]
_RIGHT = ["", " ", "  ", "\n", " \n", "b", " world", "\u2009", ".", "\x85", "\n\n", "가"]
_MAX_TOKENS = 40


def lookalikes(content: str) -> list[str]:
    """Texts that almost spell an added token (plain text to `tokenizers`)."""
    out = [content[:-1], content[1:], content.upper(), content.lower(), content.replace("|", "｜"),
           content.replace("｜", "|"), content + content[-1:], content[:1] + content, content.replace("_", " ")]
    if len(content) > 2:
        half = len(content) // 2
        out.append(content[:half] + " " + content[half:])
    return [text for text in dict.fromkeys(out) if text and text != content]


def _chosen(tokens: Sequence[tuple[str, bool]]) -> list[str]:
    """Flagged tokens first (where engines differ), then an even spread of the rest."""
    flagged = [content for content, is_flagged in tokens if is_flagged]
    rest = [content for content, is_flagged in tokens if not is_flagged]
    room = max(0, _MAX_TOKENS - len(flagged[:_MAX_TOKENS // 2]))
    step = max(1, len(rest) // room) if room else len(rest) + 1
    return list(dict.fromkeys(flagged[: _MAX_TOKENS // 2] + rest[::step][:room]))


def _fixed_texts() -> Iterable[str]:
    yield from ("", "a", " a", "a ", "  a  ", "\u3000a", "▁a", "Ġa")
    yield from FRAGMENTS
    for space in WHITESPACE:
        yield space
        yield space + "a"
        yield "a" + space + "b"
        yield space + ">"
        yield "x" + space
    for char in BYTE_FALLBACK:
        yield char + ">"
        yield " " + char + "a"
    yield " ".join(SCRIPTS)
    yield "".join(EMOJI)
    yield "\n".join(CODE)
    yield "a" * 3000
    yield "가" * 700
    yield "x1" * 900 + " " + "_" * 400
    for i, fragment in enumerate(FRAGMENTS):  # pairs across kinds, glued by varying whitespace
        yield fragment + WHITESPACE[i % len(WHITESPACE)] + FRAGMENTS[(i * 7 + 3) % len(FRAGMENTS)]


def self_check_texts(tokens: Sequence[tuple[str, bool]]) -> list[str]:
    """Texts for one tokenizer: `tokens` are its added tokens as (content, has lstrip/rstrip/single_word/normalized)."""
    texts = list(_fixed_texts())
    chosen = _chosen([(content, flagged) for content, flagged in tokens if content])
    for i, token in enumerate(chosen):
        after = chosen[(i + 1) % len(chosen)]
        for j, left in enumerate(_LEFT):
            texts.append(left + token + _RIGHT[(i + j) % len(_RIGHT)])
        texts += [token, token + token, token + " " + after, "x" + token + "y" + after + "  ",
                  " " + token + "\n" + after + "Hello" + after, token + SCRIPTS[i % len(SCRIPTS)],
                  CODE[i % len(CODE)] + token + EMOJI[i % len(EMOJI)]]
        texts += lookalikes(token)
    return list(dict.fromkeys(texts))
