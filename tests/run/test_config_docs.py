"""docs/config.md is what `python -m mle_jax.run.config_docs --write` writes from configs/base.py now, and a field
of base.py without a comment is an error naming it."""

from __future__ import annotations

import pytest

from mle_jax.run import config_docs

SOURCE = config_docs.BASE.read_text()


def test_config_md_is_what_the_generator_writes_from_base_py():
    assert config_docs.DOC.read_text() == config_docs.render(SOURCE), f"run `{config_docs.COMMAND}`"


def test_every_field_and_section_has_its_line_with_default_and_meaning():
    text = config_docs.DOC.read_text()
    assert config_docs.undocumented(SOURCE) == []
    assert "| `ppo.clip_ratio` | `0.2` | ε: the ratio π / π_old is clipped to [1 - ε, 1 + ε] |" in text
    assert '| `task.raw_dir` | `"data/raw"` |' in text  # a path inside the repository, relative to it
    # a model field: its meaning where tiny_model sets it, the 3B default's reason where qwen25_3b_model does
    [scan] = [line for line in text.splitlines() if line.startswith("| `model.scan_layers` | `True` |")]
    assert "one lax.scan over the stacked layers" in scan and "for Qwen2.5-3B-Instruct: one scanned layer body" in scan
    assert "## `warmstart`\n\nSFT on a verified program corpus" in text


@pytest.mark.parametrize(
    "added, anchor, named",
    [
        ("    c.loop.steps_per_epoch = 4", "    c.loop.steps = 100", "loop.steps_per_epoch"),
        ("    c.extra = ml_collections.ConfigDict()", "    c.eval = ", "extra"),  # a section
        ("    m.new_width = 8", "    m.attn_block", "model.new_width"),  # a model field, in tiny_model
    ],
    ids=["field", "section", "model field"],
)
def test_a_field_added_without_a_comment_is_named_and_one_with_a_comment_is_documented(added, anchor, named):
    source = SOURCE.replace(anchor, f"{added}\n{anchor}", 1)
    assert config_docs.undocumented(source) == [named]
    with pytest.raises(config_docs.UndocumentedFields, match=f"no comment explains {named}: add one"):
        config_docs.render(source)
    commented = source.replace(added, f"{added}  # what it does", 1)
    assert config_docs.undocumented(commented) == []
    assert "what it does" in config_docs.render(commented)


def test_the_comment_lines_above_a_field_explain_it_too():
    source = SOURCE.replace(
        "    c.loop.steps = 100", "    # the comment above\n    # and its second line\n    c.loop.steps = 100"
    )
    [steps] = [f for f in config_docs.fields(source) if f.name == "loop.steps"]
    assert steps.meaning.startswith("the comment above and its second line; RL steps (updates) to run")
