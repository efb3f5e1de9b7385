"""The seven progress prints of the paper (§3.2, appendix C.3) and how they are counted in terminal output.

A leaf: the prompts, the reward and the instrumenter all speak this vocabulary. Placing the prints in a
program (and tagging them) is the instrumenter's job, `mle_jax.instrument.tagging`.

Trusted progress prints: the reward counts progress prints, so a policy could print them itself for
+0.1 each without doing the work (the paper shares this gap). Before a run the agent's own progress
prints are replaced by `pass`, the program is instrumented, and every progress print left (the
instrumenter's) is tagged with a random per-run nonce the agent cannot know. Only tagged lines count;
the tag is removed from the output before anyone (the improve prompt included) sees it.
"""

from __future__ import annotations

import re
import secrets

PROGRESS_PRINTS: tuple[str, ...] = (
    "imported packages",
    "loaded data",
    "defined model",
    "training loss:",
    "trained model",
    "testing loss:",
    "predicted test labels",
)
LOSS_PRINTS: tuple[str, ...] = ("training loss:", "testing loss:")  # may be followed by a value

_LINE_START = re.compile(r"^(" + "|".join(re.escape(p) for p in PROGRESS_PRINTS) + ")", re.MULTILINE)


def count_progress(output_text: str) -> tuple[str, ...]:
    """Distinct progress prints that start a line of the output, in PROGRESS_PRINTS order.

    A print repeated (e.g. inside a loop) counts once. Carriage returns (progress bars) end lines too.
    """
    seen = set(_LINE_START.findall(output_text.replace("\r", "\n")))
    return tuple(p for p in PROGRESS_PRINTS if p in seen)


def new_tag() -> str:
    """A per-run marker; printed first on each instrumenter line (`print(TAG, "loaded data")`)."""
    return f"@@mle{secrets.token_hex(6)}@@"


def count_tagged_progress(output_text: str, tag: str) -> tuple[str, ...]:
    """Distinct progress prints on lines that start with `tag` (the instrumenter's), in PROGRESS_PRINTS order."""
    pattern = re.compile(
        r"^" + re.escape(tag) + r" ?(" + "|".join(re.escape(p) for p in PROGRESS_PRINTS) + ")", re.MULTILINE
    )
    seen = set(pattern.findall(output_text.replace("\r", "\n")))
    return tuple(p for p in PROGRESS_PRINTS if p in seen)


def untag(output_text: str, tag: str) -> str:
    """The output as the paper shows it: tagged lines become plain progress prints."""
    return re.sub(r"^" + re.escape(tag) + r" ?", "", output_text, flags=re.MULTILINE)
