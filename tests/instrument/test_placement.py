"""Where progress prints sit against where the AST instrumenter puts them."""

from __future__ import annotations

import math

from mle_jax.instrument.fallback import ast_instrument
from mle_jax.instrument.placement import Agreement, agreement, print_places

CODE = 'import pandas as pd\ndf = pd.read_csv("train.csv")\nx = df.mean()\n'


def test_places_are_the_line_before_and_the_text():
    places = print_places(ast_instrument(CODE))
    assert places[("import pandas as pd", "imported packages")] == 1
    assert places[('df = pd.read_csv("train.csv")', "loaded data")] == 1
    assert print_places('print("training loss:", 0.5)\nprint("hi")') == {(None, "training loss:"): 1}


def test_agreement_counts_same_extra_and_missing():
    ref = ast_instrument(CODE)
    assert agreement(ref, ref) == Agreement(2, 0, 0)
    moved = 'print("loaded data")\nimport pandas as pd\nprint("imported packages")\ndf = pd.read_csv("train.csv")\n'
    a = agreement(ref, moved + "x = df.mean()\n")
    assert a == Agreement(1, 1, 1) and a.precision == 0.5 and a.recall == 0.5
    assert a + a == Agreement(2, 2, 2)
    assert math.isnan(Agreement(0, 0, 0).precision)
