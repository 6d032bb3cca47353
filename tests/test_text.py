"""Committed tokens -> text (`verispec.text`): streaming, stop strings, returned text.

Real tokenizers: Qwen2.5 and SmolLM2 (byte-level BPE) and Gemma 3 (SentencePiece with byte
fallback), built from the registered GGUFs' metadata (`tests/tokenizer_cache.py`, run by
`make test`); a test whose tokenizer is not here says so and skips. The decode-loop tests drive
the shipped `SpeculativeDecoder` over a scripted toy target (all probability on the next token
of a fixed script) with the real tokenizer attached, so stop strings are checked mid-block and
across blocks for k = 0, 1, 4, 8.
"""

import pytest
import tokenizer_cache
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from verispec.api import SpeculativeDecoder
from verispec.models.toy import FunctionModel
from verispec.text import REPLACEMENT, TextStream, check_stop_strings, decode_text

FAMILIES = {
    "qwen": ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"),
    "smollm2": ("smollm2-135m",),
    "gemma3": ("gemma3-270m",),
}
_loaded: dict = {}


def tokenizer(family: str):
    if family not in _loaded:
        _loaded[family] = tokenizer_cache.load(*FAMILIES[family])
    if _loaded[family] is None:
        pytest.skip(f"no {family} tokenizer here: run `python tests/tokenizer_cache.py "
                    f"{FAMILIES[family][0]}` (make test does)")
    return _loaded[family]


# -- random texts: ASCII, common and rare CJK, emoji with ZWJ and skin tones, combining accents
ASCII = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCXYZ0123456789 .,:;!?'\"()-_\n\t", min_size=1, max_size=12)
CJK = st.text(alphabet="的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动"
                       "龘靐齉爩麤䨻鱻𪚥𰻞𠀋", min_size=1, max_size=6)
EMOJI = st.lists(st.sampled_from(["🧑", "💻", "👍", "👩", "👨", "👧", "👦", "🏳", "🌈", "🔥", "😀",
                                  "\u200d", "\ufe0f", "🏻", "🏼", "🏽", "🏾", "🏿",
                                  "🧑\u200d💻", "👩\u200d👩\u200d👧\u200d👦", "🏳\ufe0f\u200d🌈", "👍🏽"]),
                 min_size=1, max_size=5).map("".join)
ACCENTS = st.lists(st.sampled_from(["e\u0301", "a\u0300", "n\u0303", "o\u0308\u0304", "\u0301", "é", "ß"]),
                   min_size=1, max_size=5).map("".join)
TEXTS = st.lists(st.tuples(st.one_of(ASCII, CJK, EMOJI, ACCENTS), st.sampled_from(["", " ", "\n"])),
                 min_size=1, max_size=10).map(lambda parts: "".join(a + b for a, b in parts))


def encode(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def first_stop(tok, ids: list[int], stops: list[str]) -> tuple[int, str, str] | None:
    """Oracle by brute force: (number of tokens up to the first whose decoded prefix contains a
    stop string, the text cut before the earliest match then, the stop string matched)."""
    for i in range(len(ids)):
        text = tok.decode(ids[:i + 1], skip_special_tokens=True)
        hits = sorted((text.find(s), n, s) for n, s in enumerate(stops) if s in text)
        if hits:
            start, _, s = hits[0]
            return i + 1, text[:start], s
    return None


@st.composite
def text_and_stops(draw):
    """A text and 1-3 stop specs: (start, length) of a piece to cut from the decoded text
    (1-12 characters), or a string that may not occur at all."""
    text = draw(TEXTS)
    specs = [(draw(st.floats(0, 1, exclude_max=True)), draw(st.integers(1, 12)))]
    for _ in range(draw(st.integers(0, 2))):
        specs.append(draw(st.one_of(
            st.tuples(st.floats(0, 1, exclude_max=True), st.integers(1, 12)),
            st.sampled_from(["zzqzz", "龘龘龘龘", "🧑\u200d💻🧑\u200d💻🧑"]))))
    return text, specs


def stops_from(decoded: str, specs) -> list[str]:
    """Stop strings cut from the text as decoded (a tokenizer may normalise it)."""
    return [s if isinstance(s, str) else decoded[int(s[0] * len(decoded)):][:s[1]] for s in specs]


def run_stream(tok, ids, stops, blocks):
    """Push `ids` in blocks of the given sizes; check the chunks on the way; return
    (stream, chunks)."""
    stream = TextStream(tok, stops)
    chunks, i, sizes = [], 0, iter(blocks)
    while i < len(ids) and not stream.stopped:
        n = next(sizes, 1)
        stream.push(ids[i:i + n])
        i += n
        chunks.append(stream.pop_chunk())
        if not stream.stopped:   # everything settled is streamed except the hold-back
            shown = sum(map(len, chunks))
            settled = tok.decode(ids[:min(i, len(ids))], skip_special_tokens=True).rstrip(REPLACEMENT)
            assert shown >= len(settled) - stream.holdback
    chunks.append(stream.finish())
    return stream, chunks


# -- the detokeniser on its own --------------------------------------------------------------
@pytest.mark.parametrize("family", list(FAMILIES))
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_streamed_text_equals_one_shot_decode(family, data):
    tok = tokenizer(family)
    text = data.draw(TEXTS)
    ids = encode(tok, text)
    blocks = data.draw(st.lists(st.integers(1, 9), max_size=len(ids)))
    stream, chunks = run_stream(tok, ids, [], blocks)
    assert stream.text == "".join(chunks) == tok.decode(ids, skip_special_tokens=True)
    assert stream.token_ids == ids and stream.stop_index is None
    assert not any(REPLACEMENT in c for c in chunks)     # valid text: never half a character
    assert decode_text(tok, ids) == stream.text


@pytest.mark.parametrize("family", list(FAMILIES))
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=text_and_stops(), blocks=st.lists(st.integers(1, 9), max_size=20))
def test_stop_string_found_at_the_first_token_whose_text_contains_it(family, case, blocks):
    tok = tokenizer(family)
    text, specs = case
    ids = encode(tok, text)
    stops = stops_from(tok.decode(ids), specs)
    expected = first_stop(tok, ids, stops)
    stream, chunks = run_stream(tok, ids, stops, blocks)
    assert expected is not None   # every case holds a stop string cut from the text
    n, cut_text, matched = expected
    assert (stream.stop_index, stream.text, stream.stop_string) == (n, cut_text, matched)
    assert stream.token_ids == ids[:n]
    assert "".join(chunks) == stream.text
    assert not any(REPLACEMENT in c for c in chunks)


# -- through the decode loop: scripted target, real tokenizer, k = 0, 1, 4, 8 ----------------
def scripted(tok, script: list[int], prompt_len: int, wrong_every: int = 0,
             with_tokenizer: bool = True) -> FunctionModel:
    """A model over `tok`'s vocabulary whose next token is script[position] (every
    `wrong_every`-th one off by one: a draft that is sometimes rejected)."""
    vocab, rows = len(tok), {}

    def fn(prefix):
        i = len(prefix) - prompt_len
        t = script[min(i, len(script) - 1)]
        if wrong_every and i % wrong_every == wrong_every - 1:
            t = (t + 1) % vocab
        if t not in rows:
            rows[t] = torch.full((vocab,), float("-inf"))
            rows[t][t] = 0.0
        return rows[t]

    model = FunctionModel(fn, vocab, name="scripted")
    model.tokenizer = tok if with_tokenizer else None
    return model


def generate(tok, script, stops, ks=(0, 1, 4, 8), drafter="model", wrong_every=3):
    """[(result, streamed chunks)] of one scripted decoder for each k."""
    prompt = list(script) if drafter == "lookup" else encode(tok, "Say:")[:1]
    target = scripted(tok, script, len(prompt))
    # the draft never decodes text; without a tokenizer it skips the vocabulary comparison
    draft = scripted(tok, script, len(prompt), wrong_every, False) if drafter == "model" else None
    decoder = SpeculativeDecoder(target, draft, drafter=drafter)
    runs = []
    for k in ks:
        chunks = []
        result = decoder.generate(prompt, max_new_tokens=len(script), k=k, stop_strings=stops,
                                  on_text=chunks.append)
        runs.append((result, chunks))
    return runs


@pytest.mark.parametrize("family", list(FAMILIES))
@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=text_and_stops(), drafter=st.sampled_from(["model", "lookup"]),
       wrong_every=st.sampled_from([0, 2, 3, 5]))
def test_decode_loop_stops_exactly_where_the_text_first_contains_the_stop(family, case, drafter, wrong_every):
    tok = tokenizer(family)
    text, specs = case
    script = encode(tok, text)
    stops = stops_from(tok.decode(script), specs)
    n, cut_text, matched = first_stop(tok, script, stops)
    plain = None
    for k, (result, chunks) in zip((0, 1, 4, 8), generate(tok, script, stops, drafter=drafter,
                                                           wrong_every=wrong_every)):
        assert result.token_ids == script[:n], f"k={k}"
        assert result.stats.finish_reason == "stop_string" and result.finish_reason == "stop"
        assert (result.text, result.stop_string) == (cut_text, matched)
        assert "".join(chunks) == result.text
        assert not any(REPLACEMENT in c for c in chunks)
        if plain is None:
            plain = result
        assert (result.token_ids, result.text) == (plain.token_ids, plain.text)


# -- the issue's cases (all three ran to max_new_tokens before) ------------------------------
ISSUE_TEXT = "intro words 龘靐龘靐 more 🧑\u200d💻🧑\u200d💻 end 靐靐靐 tail tail tail"


@pytest.mark.parametrize("k", [0, 1, 4, 8])
@pytest.mark.parametrize("stop,tokens,before", [
    ("龘靐龘靐", 11, "intro words "),
    ("🧑\u200d💻🧑\u200d💻", 22, "intro words 龘靐龘靐 more "),
    ("靐靐靐", 30, "intro words 龘靐龘靐 more 🧑\u200d💻🧑\u200d💻 end "),
])
def test_issue_12_multi_token_characters_stop(stop, tokens, before, k):
    tok = tokenizer("qwen")
    script = encode(tok, ISSUE_TEXT)
    assert len(script) == 33
    ((result, chunks),) = generate(tok, script, [stop], (k,))
    assert result.stats.drafted if k else not result.stats.drafted
    assert len(result.token_ids) == tokens and result.stats.finish_reason == "stop_string"
    assert result.text == before and "".join(chunks) == before
    # the same string found with other stop strings around it (the old check's window
    # depended on the longest of them)
    ((result, _),) = generate(tok, script, ["x" * 12, stop, "靐" * 7], (k,))
    assert len(result.token_ids) == tokens and result.text == before


# -- SentencePiece: the "▁" space at the start of a decode window ----------------------------
def test_gemma_leading_space_of_a_window_is_kept():
    tok = tokenizer("gemma3")
    ids = encode(tok, "Hello world 龘 and 🧑\u200d💻 end")
    pieces = tok.convert_ids_to_tokens(ids)
    assert "▁world" in pieces and "▁" in pieces and "<0xE9>" in pieces   # a window starts at each
    _, chunks = run_stream(tok, ids, [], [1] * len(ids))
    assert "".join(chunks) == "Hello world 龘 and 🧑\u200d💻 end"
    assert " world" in chunks and " and" in chunks
    assert chunks[chunks.index(" and") - 1] == "龘"   # the bare "▁" went out before its bytes


def llama_style_tokenizer():
    """A tiny SentencePiece-style tokenizer whose decoder drops the space of a leading "▁"
    (as Llama's does): decoding a window from its first token alone would lose spaces."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "▁Hello": 2, "▁world": 3, "▁": 4, "<0xE9>": 5, "<0xBE>": 6,
             "<0x98>": 7, "!": 8}
    t = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    t.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    t.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                   decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    return PreTrainedTokenizerFast(tokenizer_object=t, bos_token="<s>", unk_token="<unk>")


def test_stripping_decoder_keeps_spaces_between_windows():
    tok = llama_style_tokenizer()
    ids = [2, 3, 1, 3, 4, 5, 6, 7, 8, 3]
    assert tok.decode([3]) == "world"            # what a window without left context gives
    stream, chunks = run_stream(tok, ids, [], [1] * len(ids))
    assert stream.text == "".join(chunks) == tok.decode(ids, skip_special_tokens=True) \
        == "Hello world world 龘! world"
    assert [c for c in chunks if c] == ["Hello", " world", " world", " ", "龘", "!", " world"]


# -- edges -----------------------------------------------------------------------------------
def test_generation_ending_inside_a_character_keeps_the_replacement_character():
    tok = tokenizer("qwen")
    ids = encode(tok, "ok 🧑\u200d💻")
    stream = TextStream(tok)
    cut = next(i for i in range(1, len(ids)) if tok.decode(ids[:i]).endswith(REPLACEMENT))
    stream.push(ids[:cut])
    assert REPLACEMENT not in stream.pop_chunk()     # the incomplete bytes are held back ...
    last = stream.finish()                           # ... until the end, as a one-shot decode
    assert stream.text == tok.decode(ids[:cut]) and last.endswith(REPLACEMENT)


def test_stop_text_after_the_match_in_the_same_token_is_dropped_and_later_ids_ignored():
    tok = tokenizer("smollm2")
    ids = encode(tok, "alpha beta gamma delta")
    stream = TextStream(tok, ["et"])                 # inside the token " beta"
    assert stream.push(ids)                          # a whole block at once
    assert stream.text == "alpha b" and stream.stop_string == "et"
    assert stream.token_ids == ids[:stream.stop_index] and tok.decode(ids[:stream.stop_index]).endswith("beta")
    assert stream.push(ids) and stream.finish() == "alpha b" and stream.text == "alpha b"
    with pytest.raises(RuntimeError, match="after finish"):
        stream.push([1])


def test_hold_back_is_the_longest_stop_minus_one_and_released_at_the_end():
    tok = tokenizer("smollm2")
    ids = encode(tok, "one two three four")
    stream = TextStream(tok, ["xyzzy", "nope"])
    stream.push(ids)
    assert stream.pop_chunk() == "one two three four"[:-4]
    assert stream.finish() == "four" and stream.text == "one two three four"


def test_special_tokens_are_skipped_and_never_match_a_stop_string():
    tok = tokenizer("smollm2")
    end = tok.convert_tokens_to_ids("<|im_end|>")
    ids = encode(tok, "hi there") + [end] + encode(tok, " again")
    stream = TextStream(tok, ["<|im_end|>"])
    assert not stream.push(ids)
    assert stream.finish() == "hi there again"
    assert decode_text(tok, ids, skip_special_tokens=False) == "hi there<|im_end|> again"


def test_detokenising_is_linear_in_the_output_length():
    """Ids decoded per token stay bounded (a few), however long the output: no O(n²)."""
    tok = tokenizer("qwen")

    class Counting:
        def __init__(self):
            self.ids = 0

        def decode(self, ids, **kw):
            self.ids += len(ids)
            return tok.decode(ids, **kw)

    ids = encode(tok, ("Speculative decoding 龘靐 🧑\u200d💻 é, " * 80))
    counting = Counting()
    stream = TextStream(counting, ["never seen"])
    for t in ids:
        stream.push([t])
        stream.pop_chunk()
    stream.finish()
    assert len(ids) > 1000 and stream.text == tok.decode(ids)
    assert counting.ids < 12 * len(ids)


class RewritingTokenizer:
    """A decoder that rewrites text it already gave once more ids follow (none registered
    does): id 1 decodes to "p" + U+FFFD, and "p" + U+FFFD + "q" decodes to "Rq"."""

    PIECES = ("a", "p" + REPLACEMENT, "q", "c")

    def decode(self, ids, **kw):
        return "".join(self.PIECES[i] for i in ids).replace("p" + REPLACEMENT + "q", "Rq")


def test_a_decoder_that_rewrites_text_falls_back_and_stays_consistent():
    stream = TextStream(RewritingTokenizer())
    chunks = []
    for t in [0, 1, 2, 3]:
        stream.push([t])
        chunks.append(stream.pop_chunk())
    assert chunks[:2] == ["a", "p"]                  # shown before the rewrite: never taken back
    chunks.append(stream.finish())
    assert "".join(chunks) == stream.text == "apRqc"


def test_bad_stop_strings_are_refused_by_name():
    assert check_stop_strings(None) == () and check_stop_strings(["a"]) == ("a",)
    for bad in ("stop", [""], [1], 5):
        with pytest.raises(ValueError, match="stop_strings"):
            check_stop_strings(bad)
    with pytest.raises(ValueError, match="tokenizer"):
        TextStream(None)


def test_stop_strings_without_a_tokenizer_are_refused():
    model = FunctionModel(lambda prefix: torch.zeros(4), 4)
    with pytest.raises(ValueError, match="stop_strings need a tokenizer"):
        SpeculativeDecoder(model).generate([1], max_new_tokens=3, k=0, stop_strings=["a"])


def test_no_stop_string_is_matched_before_min_tokens():
    """As vLLM's min_tokens: a stop completed by one of the first min_tokens - 1 tokens is
    ignored (and never matched later); the next occurrence after that ends generation."""
    tok = tokenizer("smollm2")
    ids = encode(tok, "go stop go go stop go")
    first = TextStream(tok, [" stop"])
    assert first.push(ids) and first.text == "go"
    n_first = first.stop_index
    late = TextStream(tok, [" stop"], min_tokens=n_first + 1)
    assert late.push(ids)
    assert late.text == "go stop go go" and late.stop_index > n_first
    exact = TextStream(tok, [" stop"], min_tokens=n_first)     # completed at the min_tokens-th token
    assert exact.push(ids) and exact.stop_index == n_first
