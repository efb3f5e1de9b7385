"""The tweet-sentiment-extraction warm-start grid: span extraction scored by word-level Jaccard, from the
whole-text baseline through sentiment-aware position and word-lexicon rules to learned span scorers (a token
classifier over hashed word/position features, decoded as the contiguous span of highest total score).

Every program shares one skeleton: `fit(df)` learns what the rule needs from labelled tweets, `select(text,
sentiment, model)` returns the predicted span; the skeleton validates on 20% of train.csv, refits on all of it
and writes textID + selected_text. Neutral tweets (whose selected text is nearly always the whole tweet) and
tweets of a few words are returned whole by every rule beyond the baseline.
"""

from __future__ import annotations

from typing import Any

from mle_jax.warmstart.corpus import CorpusItem, fmt, grid, public_dir_in_sandbox

TASK_ID = TWEET = "tweet-sentiment-extraction"

_HEAD = """from collections import Counter

import numpy as np
import pandas as pd
from sklearn import linear_model, naive_bayes
from sklearn.feature_extraction import FeatureHasher
from sklearn.model_selection import train_test_split

train = pd.read_csv("{data}train.csv").fillna("")
test = pd.read_csv("{data}test.csv").fillna("")


def jaccard(a, b):
    a, b = set(a.lower().split()), set(b.lower().split())
    return len(a & b) / max(1, len(a | b))

"""

_TAIL = """
tr, va = train_test_split(train, test_size=0.2, random_state=0)
model = fit(tr)
pred = [select(t, s, model) for t, s in zip(va["text"], va["sentiment"])]
print("validation jaccard:", np.mean([jaccard(p, g) for p, g in zip(pred, va["selected_text"])]))
model = fit(train)
pred = [select(t, s, model) for t, s in zip(test["text"], test["sentiment"])]
sub = pd.DataFrame({"textID": test["textID"], "selected_text": pred})
sub.to_csv("submission.csv", index=False)
"""

# the first lines of `select` for every rule but the baseline: neutral and short tweets stay whole
_SELECT_START = """
def select(text, sentiment, model):
    words = text.split()
    if sentiment == "neutral" or len(words) <= {short}:
        return text
"""

# the contiguous span with the largest total gain (Kadane), from a per-word `gain` list
_BEST_SPAN = """    best, start, total, span = -1e9, 0, 0.0, (0, len(words))
    for i, g in enumerate(gain):
        if total <= 0:
            start, total = i, 0.0
        total += g
        if total > best:
            best, span = total, (start, i + 1)
    return " ".join(words[span[0] : span[1]])
"""

# per sentiment and word: the share of tweets holding the word whose selected text keeps it (smoothed)
_LEXICON_FIT = """
def fit(df):
    seen, kept = Counter(), Counter()
    for text, sel, s in zip(df["text"], df["selected_text"], df["sentiment"]):
        chosen = set(sel.lower().split())
        for w in set(text.lower().split()):
            seen[s, w] += 1
            kept[s, w] += w in chosen
    return {{k: kept[k] / (seen[k] + {smooth}) for k in seen}}

"""

# a token classifier: is this word in the selected text, from hashed word, neighbour and position features
_TOKEN_FIT = """
hasher = FeatureHasher(2**16, input_type="string", alternate_sign=False)


def tokens(text, sentiment):
    w = text.lower().split()
    n = len(w)
    return [[f"{{sentiment}} {{x}}", f"{{sentiment}} prev {{w[i - 1] if i else ''}}", f"{{sentiment}} at {{min(i, 4)}}",
             f"{{sentiment}} end {{min(n - i, 4)}}"] for i, x in enumerate(w)]


def fit(df):
    rows, labels = [], []
    for text, sel, s in zip(df["text"], df["selected_text"], df["sentiment"]):
        chosen = set(sel.lower().split())
        rows += tokens(text, s)
        labels += [x in chosen for x in text.lower().split()]
    return {ctor}.fit(hasher.transform(rows), labels)

"""

_TOKEN_GAIN = "    gain = model.predict_proba(hasher.transform(tokens(text, sentiment)))[:, 1] - {threshold}\n"

_SHORT = [2, 4]

# family -> grid, the code between the head and the tail, plan words
_FAMILIES: dict[str, dict[str, Any]] = {
    "whole_text": dict(
        grid=[{}],
        code="\ndef fit(df):\n    return None\n\n\ndef select(text, sentiment, model):\n    return text\n\n",
        plan="I predict the whole tweet as the selected text, whatever its sentiment: the baseline every other "
        "rule must beat. There is nothing to learn, so fit returns nothing.",
    ),
    "position": dict(
        grid=grid(side=["first", "last"], k=[1, 2, 3, 5], short=_SHORT),
        code="\ndef fit(df):\n    return None\n\n" + _SELECT_START + '    return " ".join(words[{cut}])\n\n',
        plan="I keep neutral tweets and tweets of at most {short} words whole, and of the others only the {side} "
        "{k}. The rule has nothing to learn.",
    ),
    "lexicon": dict(
        grid=grid(threshold=[0.3, 0.5, 0.7], smooth=[1, 3, 10], short=_SHORT),
        code=_LEXICON_FIT
        + _SELECT_START
        + "    keep = [w for w in words if model.get((sentiment, w.lower()), 0) >= {threshold}]\n"
        + '    return " ".join(keep) or text\n\n',
        plan="I learn, for each sentiment and word, the share of tweets containing the word whose selected text "
        "keeps it (smoothed by {smooth}). Neutral tweets and tweets of at most {short} words stay whole; of the "
        "others I keep the words whose share is at least {threshold}.",
    ),
    "span_lexicon": dict(
        grid=grid(threshold=[0.2, 0.3, 0.4, 0.5], smooth=[1, 3, 10], short=_SHORT),
        code=_LEXICON_FIT
        + _SELECT_START
        + "    gain = [model.get((sentiment, w.lower()), 0) - {threshold} for w in words]\n"
        + _BEST_SPAN
        + "\n",
        plan="I learn, for each sentiment and word, the share of tweets containing the word whose selected text "
        "keeps it (smoothed by {smooth}). Neutral tweets and tweets of at most {short} words stay whole; of the "
        "others I select the contiguous span whose words' shares minus {threshold} add up to the most.",
    ),
    "token_logreg": dict(
        grid=grid(C=[0.3, 1.0, 3.0], threshold=[0.3, 0.4, 0.5], short=_SHORT),
        ctor="linear_model.LogisticRegression(C={C}, max_iter=1000)",
        plan="a logistic regression with C={C}",
    ),
    "token_naive_bayes": dict(
        grid=grid(alpha=[0.1, 1.0], threshold=[0.3, 0.4, 0.5], short=_SHORT),
        ctor="naive_bayes.MultinomialNB(alpha={alpha})",
        plan="a multinomial naive Bayes model with alpha={alpha}",
    ),
    "token_sgd": dict(
        grid=grid(alpha=[1e-5, 1e-4], threshold=[0.3, 0.4, 0.5], short=_SHORT),
        ctor='linear_model.SGDClassifier(loss="log_loss", alpha={alpha}, max_iter=20, random_state=0)',
        plan="a logistic-loss SGD classifier with alpha={alpha}",
    ),
    "token_lightgbm": dict(
        package="lightgbm",
        imports="import lightgbm\n",
        grid=grid(n_estimators=[50, 100], threshold=[0.3, 0.4], short=_SHORT),
        ctor="lightgbm.LGBMClassifier(n_estimators={n_estimators}, num_leaves=15, n_jobs=1, verbose=-1)",
        plan="LightGBM with {n_estimators} trees of 15 leaves",
    ),
}

_TOKEN_PLAN = (
    "I train {model} to tell, word by word, whether a word of the tweet is in its selected text, from hashed "
    "features of the sentiment with the word, the previous word and the position from either end. Neutral tweets "
    "and tweets of at most {short} words stay whole; of the others I select the contiguous span whose word "
    "probabilities minus {threshold} add up to the most."
)
_TAIL_PLAN = (
    " I print the mean Jaccard on 20% of train.csv, refit on all of it and write each test textID with its span "
    "to submission.csv."
)


def _code_and_plan(family: str, spec: dict[str, Any], hp: dict[str, Any]) -> tuple[str, str]:
    shown = {k: fmt(v) if isinstance(v, float) else v for k, v in hp.items()}
    if "ctor" in spec:
        ctor = spec["ctor"].format(**shown)
        imports = f"\n{spec['imports']}" if "imports" in spec else ""
        body = imports + _TOKEN_FIT.format(ctor=ctor)
        body += _SELECT_START.format(**shown) + _TOKEN_GAIN.format(**shown) + _BEST_SPAN + "\n"
        plan = _TOKEN_PLAN.format(model=spec["plan"].format(**hp), **hp)
    else:
        cut = {"first": ":{k}", "last": "-{k}:"}[hp["side"]].format(**hp) if family == "position" else ""
        body = spec["code"].format(cut=cut, **shown)
        words = {"k": "word" if hp.get("k") == 1 else f"{hp.get('k')} words"}
        plan = spec["plan"].format(**{**hp, **words})
    return _HEAD.format(data=public_dir_in_sandbox(TWEET)) + body + _TAIL, plan + _TAIL_PLAN


def programs(packages: frozenset[str]) -> list[CorpusItem]:
    """The tweet-sentiment-extraction grid (mean word-level Jaccard of selected_text, id textID)."""
    items = []
    for family, spec in _FAMILIES.items():
        if "package" in spec and spec["package"] not in packages:
            continue
        for hp in spec["grid"]:
            code, plan = _code_and_plan(family, spec, hp)
            features = "words" if family in ("whole_text", "position") else family.split("_")[0]
            items.append(CorpusItem(plan, code, {"task": TWEET, "model": family, "features": features, "hparams": hp}))
    return items
