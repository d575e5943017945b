"""Records sacrebleu's corpus BLEU and chrF, and its 13a tokenisation, on
hand-written segments that exercise each rule and on random corpora, for
redco's translation metrics test (tests/test_translation_metrics.cpp).

    python tests/python/make_translation_metrics_goldens.py \
        [--seed 0] [--out tests/goldens/translation_metrics.json]

Needs sacrebleu==2.6.0 (tools/setup installs it into .venv). The committed
goldens use seed 0; the live test runs this script with another seed and
compares redco with what sacrebleu says about the new random corpora.

Output (JSON): {"sacrebleu": version, "seed": seed,
  "tokens": [[segment, 13a tokens], ...],
  "corpora": [{"name", "hyps": [...], "refs": [...], "bleu", "chrf"}, ...]}
"""

import argparse
import json
import random

import sacrebleu
from sacrebleu.metrics import BLEU, CHRF

# Each rule of the 13a tokeniser, Python's whitespace, and UTF-8 next to the
# characters the rules look at.
SEGMENTS = [
    "In the beginning God created the heaven and the earth.",
    "And God said, Let there be light: and there was light.",
    "3.14 and 1,000 but not a.b or x,y; 10-20 vs a-b and -5.",
    "Quotes: &quot;hi&quot; &amp; &lt;tag&gt; &amp;quot; stay",
    "a <skipped> word and a line-\nbreak\nthere",
    "trailing spaces   \t ",
    "non\u00a0breaking\u2009thin\u3000ideographic\x1cfile-sep",
    "¿Dónde está el niño? ¡Aquí, señor! Él dijo: «sí».",
    "é.é,9.a,1 ñ-3 3-ñ 4-5 .. ,, ., 1.2.3 a..b",
    "(parenthesised) [bracketed] {braced} `tick` ~tilde ^caret |pipe \\back /slash",
    "it's don't O'Brien — em-dash – en-dash “curly” ‘single’",
    "#$%&*+=@!?",
    "",
    "   ",
    "word",
    "\U0001F600 emoji.\U0001F600,\U0001F600",
]

HAND_CORPORA = [
    ("kjv_web", [
        "In the beginning God created the heaven and the earth.",
        "And the earth was without form, and void; and darkness was upon the face of the deep.",
        "And God said, Let there be light: and there was light.",
        "And God saw the light, that it was good: and God divided the light from the darkness.",
    ], [
        "In the beginning, God created the heavens and the earth.",
        "The earth was formless and empty. Darkness was on the surface of the deep.",
        "God said, \u201cLet there be light,\u201d and there was light.",
        "God saw the light, and saw that it was good. God divided the light from the darkness.",
    ]),
    ("identical", ["the same words here .", "and again"], ["the same words here .", "and again"]),
    ("no_match", ["xyz qqq", "rrr"], ["abc def ghi", "jkl mno"]),
    ("empty_hyps", ["", ""], ["some reference text", "another one"]),
    ("short", ["a b", "c"], ["a b c", "c d"]),
    ("longer_hyp", ["the cat sat on the mat on the mat on the mat"], ["the cat sat on the mat"]),
    ("spanish", ["En el principio creó Dios los cielos y la tierra."],
     ["En el principio crió Dios los cielos y la tierra."]),
    ("unicode_ws", ["a\u00a0b c\u2009d", "e\u3000f"], ["a b c d", "e f"]),
    ("punct_only", ["...", ",,,"], ["!!!", "..."]),
]

WORDS = ["the", "and", "God", "said", "unto", "Moses", "Let", "there", "be", "light",
         "señor", "niño", "él", "está", "día", "1,000", "3.14", "10-20", "it's", "O'Brien",
         "a.b", "x,y", "é", "ñ", "9", "&amp;", "&quot;", "<skipped>", "\U0001F600"]
PUNCT = [".", ",", ";", ":", "!", "?", "(", ")", "\"", "'", "-", "—", "«", "»", "¿", "¡"]
SPACES = [" ", " ", " ", " ", "  ", "\t", "\u00a0", "\u2009", "\n", "-\n"]


def random_segment(rng, n_words):
    out = []
    for _ in range(n_words):
        w = rng.choice(WORDS)
        if rng.random() < 0.25:
            w = w + rng.choice(PUNCT) if rng.random() < 0.7 else rng.choice(PUNCT) + w
        out.append(w)
        out.append(rng.choice(SPACES))
    return "".join(out[:-1]) + (rng.choice(SPACES) if rng.random() < 0.2 else "")


def perturb(rng, ref):
    """A hypothesis near the reference: words dropped, replaced, swapped."""
    words = ref.split(" ")
    out = []
    for w in words:
        r = rng.random()
        if r < 0.1:
            continue
        out.append(rng.choice(WORDS) if r < 0.25 else w)
    if len(out) > 2 and rng.random() < 0.5:
        i = rng.randrange(len(out) - 1)
        out[i], out[i + 1] = out[i + 1], out[i]
    return " ".join(out)


def random_corpora(seed):
    rng = random.Random(seed)
    corpora = []
    for k in range(8):
        n = rng.choice([1, 3, 10, 40])
        refs = [random_segment(rng, rng.randint(1, 25)) for _ in range(n)]
        hyps = [perturb(rng, r) if rng.random() < 0.9 else random_segment(rng, rng.randint(0, 5))
                for r in refs]
        corpora.append((f"random_{seed}_{k}", hyps, refs))
    return corpora


def score(name, hyps, refs):
    return {"name": name, "hyps": hyps, "refs": refs,
            "bleu": BLEU().corpus_score(hyps, [refs]).score,
            "chrf": CHRF().corpus_score(hyps, [refs]).score}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="tests/goldens/translation_metrics.json")
    a = ap.parse_args()
    assert sacrebleu.__version__ == "2.6.0", sacrebleu.__version__
    corpora = HAND_CORPORA + random_corpora(a.seed)
    tok = BLEU().tokenizer
    segments = SEGMENTS + [s for _, h, r in corpora for s in h + r]
    # BLEU tokenises the segment with trailing whitespace removed (_preprocess_segment).
    tokens = [[s, tok(s.rstrip())] for s in dict.fromkeys(segments)]
    out = {"sacrebleu": sacrebleu.__version__, "seed": a.seed, "tokens": tokens,
           "corpora": [score(*c) for c in corpora]}
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
