"""`--data hf:owner/name`: a hub dataset's data files downloaded once by huggingface_hub's own code
(from a local server playing the hub), trained on like a folder, reused offline; one line when it
cannot be had."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from helpers import DATA, HubServer, online, run

from dbert_core.errors import DbertError
from dbert_core.storage import datasets

HEAD = DATA / "tinystories" / "TinyStories-train-head.txt"


def _repo(tmp_path: Path) -> Path:
    """A dataset repo as the hub keeps one: data files in a folder, a README and a script beside them."""
    repo = tmp_path / "repo"
    (repo / "data").mkdir(parents=True)
    lines = HEAD.read_text().splitlines()[:400]
    (repo / "data" / "train.txt").write_text("\n".join(lines[:300]) + "\n")
    (repo / "data" / "more.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in lines[300:] if t))
    (repo / "README.md").write_text("# a dataset card\n")
    (repo / "loader.py").write_text("raise SystemExit('never run')\n")
    return repo


def test_a_hub_dataset_is_downloaded_once_and_read_as_its_data_files(tmp_path, monkeypatch):
    with HubServer() as hub:
        hub.datasets["owner/stories"] = _repo(tmp_path)
        online(monkeypatch, hub)
        got = Path(datasets.local(["hf:owner/stories"])[0])
        assert got == Path(os.environ["DBERT_HOME"]) / "cache" / "datasets" / "owner--stories"
        assert sorted(str(p.relative_to(got)) for p in got.rglob("*") if p.is_file()) == \
            ["data/more.jsonl", "data/train.txt"]  # no card, no code
        assert (got / "data" / "train.txt").read_bytes() == (tmp_path / "repo" / "data" / "train.txt").read_bytes()
        assert any(r.startswith("GET /datasets/owner/stories/resolve/") for r in hub.requests)
        assert not [p for p in got.parent.iterdir() if p.name.startswith(".")]  # no temp folder left
        hub.requests.clear()
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        assert datasets.local(["hf:owner/stories", "x.txt"]) == [str(got), "x.txt"] and hub.requests == []


def test_a_run_trains_on_a_hub_dataset(tmp_path, monkeypatch, capsys):
    from dbert_core.storage import checkpoint

    with HubServer() as hub:
        hub.datasets["owner/stories"] = _repo(tmp_path)
        online(monkeypatch, hub)
        args = ["train", "--data", "hf:owner/stories", "--preset", "tiny", "--seq-len", "24", "--batch-size", "8",
                "--max-steps", "1", "--eval-every", "0", "--out", str(tmp_path / "a")]
        code, out, err = run(args, capsys, monkeypatch)
    assert code == 0 and out == "", err
    meta = checkpoint.read_meta(tmp_path / "a")
    kept = Path(os.environ["DBERT_HOME"]) / "cache" / "datasets" / "owner--stories"
    assert [f["path"] for f in meta["data_files"]] == [str(kept / "data" / "more.jsonl"), str(kept / "data" / "train.txt")]


def test_a_hub_dataset_of_csv_files_is_downloaded_and_read_as_its_text_column(tmp_path, monkeypatch):
    import csv
    import gzip
    import io

    from dbert_core.text.sources import iter_documents

    repo = tmp_path / "repo"
    (repo / "data").mkdir(parents=True)
    stories = [["A story.", "Its end, \"quoted\"."], ["Another, with a comma."], ["A third."]]
    table = io.StringIO()
    csv.writer(table).writerows([["id", "text"], *([i, "\n".join(d)] for i, d in enumerate(stories))])
    (repo / "data" / "train.csv").write_text(table.getvalue())
    (repo / "data" / "valid.tsv.gz").write_bytes(gzip.compress(b"text\tid\nA held-out story.\t9\n"))
    (repo / "README.md").write_text("# a dataset card\n")
    with HubServer() as hub:
        hub.datasets["owner/tables"] = repo
        online(monkeypatch, hub)
        got = Path(datasets.local(["hf:owner/tables"])[0])
        assert sorted(str(p.relative_to(got)) for p in got.rglob("*") if p.is_file()) == \
            ["data/train.csv", "data/valid.tsv.gz"]  # no card
        assert list(iter_documents([str(got)])) == [*stories, ["A held-out story."]]


@pytest.mark.parametrize("source, message", [
    ("hf:owner", "a hub dataset is hf:owner/name"),
    ("hf:owner/../x", "a hub dataset is hf:owner/name"),
    ("hf:owner/name@", "a hub dataset is hf:owner/name"),
])
def test_a_malformed_id_is_one_line(source, message):
    with pytest.raises(DbertError, match=message):
        datasets.local([source])


def test_offline_missing_and_empty_datasets_are_one_line_each(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    args = ["train", "--data", "hf:owner/stories", "--preset", "tiny", "--max-steps", "1", "--out", str(tmp_path / "a")]
    code, out, err = run(args, capsys, monkeypatch)
    assert code != 0 and out == "" and err.strip().splitlines() == [
        "dbert: error: cannot download hf:owner/stories: offline (HF_HUB_OFFLINE=1 is set) and not downloaded before"], err
    with HubServer() as hub:
        online(monkeypatch, hub)
        with pytest.raises(DbertError, match=r"^cannot download hf:owner/stories: no such dataset on the hub"):
            datasets.local(["hf:owner/stories"])
        card = tmp_path / "card"
        card.mkdir()
        (card / "README.md").write_text("# nothing to train on\n")
        hub.datasets["owner/stories"] = card
        with pytest.raises(DbertError, match=r"^hf:owner/stories holds no data files"):
            datasets.local(["hf:owner/stories"])
        with pytest.raises(DbertError, match=r"^cannot download hf:owner/stories@v9: no such revision"):
            datasets.local(["hf:owner/stories@v9"])
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens: no network
    with pytest.raises(DbertError, match=r"^cannot download hf:owner/stories: the Hugging Face Hub is not reachable"):
        datasets.local(["hf:owner/stories"])
    root = Path(os.environ["DBERT_HOME"]) / "cache" / "datasets"
    assert list(root.iterdir()) == []  # nothing half-made for a later run
