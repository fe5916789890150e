"""scripts/studies/blind_read.py: the sheet hides the source, the key scores the grades."""

from __future__ import annotations

import json
import re

import pytest

from helpers import study_script


@pytest.fixture(scope="module")
def blind():
    return study_script("blind_read")


def _human_file(path, n):
    path.write_text("".join(f"Real tale {i} begins.\nIts second paragraph {i}.\n<|endoftext|>\n" for i in range(n)))
    return path


def _sheet(blind, tmp_path, n=3, seed=0):
    model = tmp_path / "model.txt"
    model.write_text("".join(f"Drawn tale {i}.\n" for i in range(n + 2)))
    other = tmp_path / "other.txt"
    other.write_text("".join(f"Other tale {i}.\n" for i in range(n)))
    out = tmp_path / "r1"
    rc = blind.main(["sheet", "--out", str(out), "--human", str(_human_file(tmp_path / "h.txt", 10)),
                     "--n", str(n), "--seed", str(seed), f"m={model}", f"o={other}"])
    assert rc == 0
    return out


def test_the_sheet_shows_ids_only_and_the_key_lies_outside_the_readers_folder(blind, tmp_path):
    out = _sheet(blind, tmp_path)
    sheet = (out / "sheet.md").read_text()
    key = json.loads((tmp_path / "r1.key.json").read_text())["key"]
    assert sorted(key.values()) == ["human"] * 3 + ["m"] * 3 + ["o"] * 3
    assert re.findall(r"^## (S\d+)$", sheet, re.M) == sorted(key)  # every id once, in order
    for word in ("human", "model", "m=", "o="):
        assert word not in sheet.lower()
    assert sorted(p.name for p in out.iterdir()) == ["rubric.md", "sheet.md"]  # the key is not in the folder
    assert "**grammar**" in (out / "rubric.md").read_text()
    # a human story is one line, its paragraphs joined; a model file gives its first --n stories
    assert re.search(r"Real tale \d+ begins\. Its second paragraph \d+\.", sheet)
    assert "Drawn tale 3" not in sheet and "Drawn tale 2" in sheet
    # a new seed is a new shuffle
    order = [key[i] for i in sorted(key)]
    (tmp_path / "b").mkdir()
    _sheet(blind, tmp_path / "b", seed=1)
    key2 = json.loads((tmp_path / "b" / "r1.key.json").read_text())["key"]
    assert [key2[i] for i in sorted(key2)] != order


def test_the_score_averages_readers_per_story_and_counts_human_guesses(blind, tmp_path, capsys):
    out = _sheet(blind, tmp_path)
    key = json.loads((tmp_path / "r1.key.json").read_text())["key"]
    grade = {"human": 9, "m": 3, "o": 5}
    lines1 = [f"{i} grammar={grade[s]} consistency={grade[s]} plot={grade[s]} fluency={grade[s]} "
              f"author={'human' if s == 'human' else 'model'}" for i, s in key.items()]
    lines2 = [f"{i} grammar={grade[s] + 1} consistency=1 plot=1 fluency=1 author=human" for i, s in key.items()]
    (out / "grades.txt").write_text("\n".join(lines1) + "\n")
    (out / "grades-2.txt").write_text("\n".join(lines2) + "\n")
    assert blind.main(["score", str(out), "--json"]) == 0
    scores = json.loads(capsys.readouterr().out)
    assert scores["human"]["grammar"] == [9.5, 0.0]
    assert scores["m"]["grammar"] == [3.5, 0.0]
    assert scores["o"]["consistency"] == [3.0, 0.0]
    assert scores["human"]["taken_for_human"] == 6 and scores["m"]["taken_for_human"] == 3
    assert scores["m"]["grades"] == 6 and scores["m"]["stories"] == 3
    assert blind.main(["score", str(out), "--grades", str(out / "grades.txt")]) == 0
    table = capsys.readouterr().out
    assert "| human (3) | 9.0 ± 0.0 |" in table and "| 3/3 |" in table and "| 0/3 |" in table


def test_the_interval_is_over_stories(blind):
    mean, half = blind.mean_ci([2, 4, 6, 8])
    assert mean == 5 and half == pytest.approx(1.96 * (20 / 3 / 4) ** 0.5)


@pytest.mark.parametrize("bad, said", [
    ("S01 grammar=11 consistency=1 plot=1 fluency=1 author=human", "grammar=11"),
    ("S01 grammar=5 consistency=1 plot=1 author=human", "fluency=(missing)"),
    ("S01 grammar=5 consistency=1 plot=1 fluency=1 author=maybe", "author=maybe"),
    ("S99 grammar=5 consistency=1 plot=1 fluency=1 author=human", "S99 is not on the sheet"),
    ("I liked them all", "not a grade line"),
    ("", "stories not graded"),
])
def test_a_bad_grades_file_is_one_line(blind, tmp_path, capsys, bad, said):
    out = _sheet(blind, tmp_path, n=1)
    capsys.readouterr()
    (out / "grades.txt").write_text(bad + "\n")
    assert blind.main(["score", str(out)]) == 2
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1


def test_bad_sheet_inputs_are_one_line(blind, tmp_path, capsys):
    model = tmp_path / "m.txt"
    model.write_text("One.\nTwo.\n")
    human = _human_file(tmp_path / "h.txt", 5)
    for args, said in ((["--n", "3", f"m={model}"], "2 stories, the sheet needs 3"),
                       ([f"human={model}"], "the human stories' own"),
                       ([str(model)], "NAME=FILE"),
                       ([f"m={tmp_path}/nope.txt"], "no such file")):
        assert blind.main(["sheet", "--out", str(tmp_path / "x"), "--human", str(human), "--n", "2", *args]) == 2
        err = capsys.readouterr().err
        assert said in err and err.count("\n") == 1


def test_the_reader_is_told_the_two_files_and_nothing_else(blind, tmp_path, capsys):
    assert blind.main(["prompt", str(tmp_path / "r1")]) == 0
    said = capsys.readouterr().out
    assert f"{tmp_path}/r1/rubric.md" in said and f"{tmp_path}/r1/sheet.md" in said
    assert "key" not in said and "do not run code" in said


def test_sheets_pool_a_story_once_with_all_its_readers(blind, tmp_path, capsys):
    """The same sample files on two sheets (two shuffles, a reader each): each story once, its two grades averaged."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    outs = [_sheet(blind, tmp_path / "a", seed=1), _sheet(blind, tmp_path / "b", seed=2)]
    for k, out in enumerate(outs):
        key = json.loads(out.with_name("r1.key.json").read_text())["key"]
        g = {"human": 8, "m": 2 + 2 * k, "o": 5}  # m: 2 on the first sheet, 4 on the second
        (out / "grades.txt").write_text("".join(
            f"{i} grammar={g[s]} consistency={g[s]} plot={g[s]} fluency={g[s]} author=model\n" for i, s in key.items()))
    capsys.readouterr()
    assert blind.main(["score", *map(str, outs), "--json"]) == 0
    scores = json.loads(capsys.readouterr().out)
    assert scores["m"]["stories"] == 3 and scores["m"]["grades"] == 6 and scores["m"]["grammar"] == [3.0, 0.0]
    assert scores["o"]["plot"] == [5.0, 0.0] and scores["human"]["taken_for_human"] == 0
    assert blind.main(["score", *map(str, outs), "--grades", str(outs[0] / "grades.txt")]) == 2
