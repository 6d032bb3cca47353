"""verispec.prompts: one prompt loader for analyze and bench (Spec-Bench JSON lines or plain text)."""

import json

import pytest

from verispec import prompts as P
from verispec.prompts import PromptError, load_prompts


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


# --------------------------------------------------------------------------- selection


def test_first_n_per_category_in_file_order(dataset):
    qs = load_prompts(dataset, ["translation", "qa"], per_category=2)
    assert [(q.id, q.category, q.groups) for q in qs] == [
        (1, "translation", ("translation",)), (2, "translation", ("translation",)),
        (4, "qa", ("qa",)), (5, "qa", ("qa",))]
    assert qs[0].text == "Translate sentence 0." and qs[0].line == 1
    # fewer rows than asked: all of them
    assert len(load_prompts(dataset, ["qa"], per_category=5)) == 2


def test_multi_turn_is_spread_round_robin_over_sub_categories_first_turn_only(dataset):
    qs = load_prompts(dataset, ["multi-turn"], per_category=4)
    # writing #1, roleplay #1, coding #1, then writing #2
    assert [(q.id, q.category) for q in qs] == [(6, "writing"), (8, "roleplay"), (9, "coding"), (7, "writing")]
    assert all(q.groups == ("multi-turn",) for q in qs)
    assert qs[0].text == "Write a poem." and len(qs[0].turns) == 2
    assert [q.id for q in load_prompts(dataset, ["multi_turn"], 1)] == [6]  # alias


def test_per_category_zero_takes_every_row_multi_turn_round_robin(dataset):
    assert [q.id for q in load_prompts(dataset, ["multi-turn"], 0)] == [6, 8, 9, 7, 10]
    assert [q.id for q in load_prompts(dataset, ["translation"], 0)] == [1, 2, 3]


def test_raw_coding_category_alone_and_together_with_multi_turn(dataset):
    assert [q.id for q in load_prompts(dataset, ["coding"], 3)] == [9, 10]
    qs = load_prompts(dataset, ["multi-turn", "coding"], per_category=3)
    groups = {q.id: q.groups for q in qs}
    assert groups == {6: ("multi-turn",), 8: ("multi-turn",), 9: ("multi-turn", "coding"), 10: ("coding",)}
    assert len(qs) == 4   # a row selected twice is returned once


def test_no_categories_means_every_category_of_the_file(dataset):
    qs = load_prompts(dataset, None, per_category=2)
    assert [(q.groups[0], q.id) for q in qs] == [
        ("translation", 1), ("translation", 2), ("qa", 4), ("qa", 5), ("multi-turn", 6), ("multi-turn", 8)]
    raw = load_prompts(dataset, None, per_category=1, raw_categories=True)
    assert [(q.groups, q.id) for q in raw] == [(("translation",), 1), (("qa",), 4), (("writing",), 6),
                                               (("roleplay",), 8), (("coding",), 9)]


def test_spec_bench_columns_must_be_in_the_file(dataset):
    with pytest.raises(PromptError, match="--categories: 'summarization' has no rows"):
        load_prompts(dataset, P.DEFAULT_CATEGORIES, 1)


@pytest.mark.parametrize("kwargs, match", [
    ({"per_category": -1}, "--per-category"),
    ({"per_category": 2.5}, "--per-category"),
    ({"per_category": True}, "--per-category"),
    ({"categories": ["poetry"]}, "--categories: unknown category 'poetry'"),
    ({"categories": []}, "--categories is empty"),
])
def test_bad_selection_errors_name_the_option(dataset, kwargs, match):
    with pytest.raises(PromptError, match=match):
        load_prompts(dataset, **{"categories": ["qa"], "per_category": 1, **kwargs})


def test_a_category_can_come_from_its_own_file(dataset, tmp_path, monkeypatch):
    """How a prompt set kept in the repository (e.g. code-edit) joins the Spec-Bench ones."""
    extra = write(tmp_path, "edits.jsonl", "".join(
        json.dumps({"question_id": f"edit-{i}", "category": "code-edit", "turns": [f"Rename x{i}."]}) + "\n"
        for i in range(3)))
    monkeypatch.setitem(P.CATEGORY_FILES, "code-edit", extra)
    qs = load_prompts(dataset, ["qa", "code-edit"], per_category=2)
    assert [(q.id, q.groups) for q in qs] == [(4, ("qa",)), (5, ("qa",)), ("edit-0", ("code-edit",)),
                                             ("edit-1", ("code-edit",))]
    assert qs[2].text == "Rename x0."
    clash = write(tmp_path, "clash.jsonl", json.dumps({"question_id": 4, "category": "code-edit",
                                                       "turns": ["x"]}) + "\n")
    monkeypatch.setitem(P.CATEGORY_FILES, "code-edit", clash)
    with pytest.raises(PromptError, match="question_id 4 is in both"):
        load_prompts(dataset, ["qa", "code-edit"], per_category=2)


def test_jsonl_without_ids_or_categories(tmp_path):
    path = write(tmp_path, "q.jsonl", '{"turns": "just one"}\n{"turns": ["a", "b"], "question_id": "7"}\n')
    qs = load_prompts(path, None, 0)
    assert [(q.id, q.category, q.text) for q in qs] == [(1, "uncategorized", "just one"), (7, "uncategorized", "a")]


def test_plain_text_prompts(tmp_path):
    path = write(tmp_path, "prompts.txt", "Write a haiku.\n\n  Explain TCP.  \n")
    qs = load_prompts(path, per_category=0)
    assert [(q.id, q.category, q.groups, q.text, q.line) for q in qs] == [
        (1, "prompts", ("prompts",), "Write a haiku.", 1), (3, "prompts", ("prompts",), "Explain TCP.", 3)]
    assert len(load_prompts(path, per_category=1)) == 1


# --------------------------------------------------------------------------- file errors


def test_prompt_file_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_prompts(tmp_path / "nope.jsonl")
    with pytest.raises(PromptError, match="is a directory"):
        load_prompts(tmp_path)
    with pytest.raises(PromptError, match="empty"):
        load_prompts(write(tmp_path, "empty.txt", "\n  \n"))
    good = json.dumps({"category": "qa", "turns": ["hi"]})
    with pytest.raises(PromptError, match="line 3: not valid JSON"):
        load_prompts(write(tmp_path, "bad.jsonl", f"{good}\n\n{{oops\n"))
    with pytest.raises(PromptError, match="line 2: needs \"turns\""):
        load_prompts(write(tmp_path, "noturns.jsonl", f"{good}\n{json.dumps({'category': 'qa'})}\n"))
    with pytest.raises(PromptError, match="line 2: needs \"turns\""):
        load_prompts(write(tmp_path, "oops.jsonl", '{"question_id": 1, "category": "qa", "turns": ["x"]}\n'
                                                    '{"oops": 1}\n'))
    with pytest.raises(PromptError, match="line 1: expected a JSON object"):
        load_prompts(write(tmp_path, "list.jsonl", "[1, 2]\n"))
    with pytest.raises(PromptError, match="line 2: question_id 1 repeats line 1"):
        load_prompts(write(tmp_path, "dup.jsonl", '{"question_id": 1, "turns": ["a"]}\n'
                                                   '{"question_id": 1, "turns": ["b"]}\n'))
    with pytest.raises(PromptError, match="question_id"):
        load_prompts(write(tmp_path, "badid.jsonl", '{"question_id": [1], "turns": ["a"]}\n'))
    bad_utf8 = tmp_path / "latin1.txt"
    bad_utf8.write_bytes("café\n".encode("latin-1"))
    with pytest.raises(PromptError, match="UTF-8"):
        load_prompts(bad_utf8)


def test_dataset_path_option_env_and_default(tmp_path, monkeypatch):
    f = write(tmp_path, "question.jsonl", json.dumps({"category": "qa", "turns": ["hi"]}) + "\n")
    assert P.dataset_path(str(f)) == f
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        P.dataset_path(tmp_path / "nope.jsonl")
    monkeypatch.setenv(P.ENV_VAR, str(tmp_path))            # a directory holding question.jsonl
    assert P.dataset_path() == f
    assert load_prompts(None)[0].text == "hi"
    monkeypatch.setenv(P.ENV_VAR, str(f))                   # the file itself
    assert P.dataset_path() == f
    monkeypatch.setenv(P.ENV_VAR, str(tmp_path / "missing.jsonl"))
    with pytest.raises(FileNotFoundError, match=P.ENV_VAR):
        P.dataset_path()
    monkeypatch.delenv(P.ENV_VAR)
    monkeypatch.chdir(tmp_path)   # neither ../shared nor ./shared here; the checkout's may exist
    try:
        path = P.dataset_path()
    except FileNotFoundError as e:
        assert "--dataset" in str(e)
    else:
        assert path.name == "question.jsonl"


def test_spec_bench_selection_on_the_real_file_when_present():
    """The shared Spec-Bench file: the six columns, 3 each, multi-turn from three MT-Bench categories."""
    try:
        path = P.dataset_path()
    except FileNotFoundError:
        pytest.skip("Spec-Bench question.jsonl not found")
    qs = load_prompts(path, P.DEFAULT_CATEGORIES, 3)
    assert len(qs) == 18
    assert [q.category for q in qs if q.groups == ("multi-turn",)] == ["writing", "roleplay", "reasoning"]
    assert all(isinstance(q.id, int) for q in qs)
