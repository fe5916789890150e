"""The dbert command: data on stdout only, one-line errors with a non-zero exit."""

import json
import os
import signal
import subprocess
import sys

import pytest

from helpers import TINYSTORIES, TINYSTORIES_VALID, run


def test_sample_prints_exactly_n_lines(tiny_checkpoint, capsys, monkeypatch):
    code, out, err = run(["sample", "--checkpoint", str(tiny_checkpoint), "--n", "5", "--length", "12",
                          "--steps", "16", "--batch-size", "2", "--seed", "3", "--stats"], capsys, monkeypatch)
    assert code == 0
    lines = out.split("\n")
    assert len(lines) == 6 and lines[-1] == "" and all(lines[:5])
    stats = json.loads(err.strip().splitlines()[-1])
    assert stats["samples"] == 5 and stats["steps"] == 16 and stats["nfe"] > 0 and stats["seconds"] > 0
    code2, out2, _ = run(["sample", "--checkpoint", str(tiny_checkpoint), "--n", "5", "--length", "12",
                          "--steps", "16", "--batch-size", "2", "--seed", "3"], capsys, monkeypatch)
    assert out2 == out


def test_store_names_train_and_list(capsys, monkeypatch):
    code, out, err = run(["train", "--data", str(TINYSTORIES), "--out", "mytiny", "--max-steps", "3",
                          "--batch-size", "8", "--seq-len", "16", "--T", "64", "--eval-steps", "8",
                          "--eval-every", "0", "--device", "cpu"], capsys, monkeypatch)
    assert code == 0 and out == ""
    assert "checkpoint step 3" in err
    code, out, _ = run(["checkpoints", "list"], capsys, monkeypatch)
    row = [ln for ln in out.splitlines() if ln[2:].startswith("mytiny ")]
    assert row and " 3 " in row[0]  # its steps
    code, out, _ = run(["checkpoints", "list", "--json"], capsys, monkeypatch)
    mine = [json.loads(x) for x in out.splitlines() if json.loads(x)["name"] == "mytiny"]
    assert mine and mine[0]["schedule"] == "spindle(0.3)" and mine[0]["time"] == "none"
    code, out, _ = run(["sample", "--checkpoint", "mytiny", "--n", "2", "--length", "8", "--steps", "8"],
                       capsys, monkeypatch)
    assert code == 0 and len(out.splitlines()) == 2


def test_eval_json(tiny_checkpoint, capsys, monkeypatch):
    code, out, err = run(["eval", "--checkpoint", str(tiny_checkpoint), "--data", str(TINYSTORIES_VALID),
                          "--unit", "sentence", "--steps", "16", "--limit", "40", "--mc-samples", "2",
                          "--samples", "8", "--sample-steps", "8", "--sample-length", "16", "--json"],
                         capsys, monkeypatch)
    assert code == 0
    result = json.loads(out)
    assert result["examples"] == 40 and result["steps"] == 16
    assert result["ppl_word"] > result["ppl_token"] > 1  # words are longer than WordPiece tokens
    assert 0 <= result["bleu4"] <= 1 and 0 <= result["self_bleu4"] <= 1 and 0 < result["distinct2"] <= 1


def test_eval_windows_scores_the_checkpoints_own_training_windows(tiny_checkpoint, capsys, monkeypatch):
    from dbert_core.storage import checkpoint
    from dbert_core.text.data import document_sentences, document_windows, read_documents

    code, out, err = run(["eval", "--checkpoint", str(tiny_checkpoint), "--data", str(TINYSTORIES_VALID),
                          "--unit", "window", "--steps", "8", "--limit", "30", "--json"], capsys, monkeypatch)
    assert code == 0, err
    result = json.loads(out)
    db = checkpoint.load(tiny_checkpoint)
    windows, words = document_windows(document_sentences(read_documents([str(TINYSTORIES_VALID)])), db.tokenizer,
                                      db.meta["seq_len"], words=True)
    assert result["examples"] == 30 and result["tokens"] == sum(len(w) for w in windows[:30])
    assert result["words"] == sum(words[:30]) and result["ppl_word"] > result["ppl_token"] > 1


BAD = [
    (["sample", "--checkpoint", "{ck}", "--steps", "0"], "--steps"),
    (["sample", "--checkpoint", "{ck}", "--steps", "999999"], "--steps"),
    (["sample", "--checkpoint", "{ck}", "--temperature", "-0.5"], "--temperature"),
    (["sample", "--checkpoint", "{ck}", "--temperature", "-1"], "--temperature"),
    (["sample", "--checkpoint", "{ck}", "--top-p", "0"], "--top-p"),
    (["sample", "--checkpoint", "{ck}", "--top-p", "1.5"], "--top-p"),
    (["sample", "--checkpoint", "{ck}", "--top-k", "-3"], "--top-k"),
    (["sample", "--checkpoint", "{ck}", "--length", "5000"], "--length"),
    (["sample", "--checkpoint", "{ck}", "--length", "4", "--prompt", "once upon a time there was a cat"], "longer than"),
    (["sample", "--checkpoint", "{ck}", "--sampler", "magic"], "magic"),
    (["sample", "--checkpoint", "{tmp}/nowhere"], "not found"),
    (["sample", "--checkpoint", "no-such-name"], "no checkpoint named"),
    (["sample", "--checkpoint", "{tmp}/broken"], "corrupt"),
    (["sample", "--checkpoint", "{tmp}/incomplete"], "missing"),
    (["train", "--data", "{tmp}/missing.txt", "--out", "{tmp}/o"], "not found"),
    (["train", "--data", "{tmp}/empty.txt", "--out", "{tmp}/o"], "empty"),
    (["train", "--data", "{tmp}/latin1.txt", "--out", "{tmp}/o"], "not UTF-8"),
    (["train", "--data", str(TINYSTORIES), "--out", "{tmp}/o", "--preset", "huge"], "huge"),
    (["train", "--data", str(TINYSTORIES), "--out", "{tmp}/o", "--schedule", "cosine"], "cosine"),
    (["train", "--data", str(TINYSTORIES), "--out", "{tmp}/o", "--gpu"], "CUDA"),
    (["train", "--data", str(TINYSTORIES), "--out", "{tmp}/o", "--grad-accum", "0"], "--grad-accum"),
    (["train", "--data", str(TINYSTORIES), "--out", "{tmp}/o", "--log-every", "0"], "--log-every"),
    (["train", "--data", str(TINYSTORIES), "--out", "{tmp}/o", "--lambda", "5"], "--lambda"),
    (["train", "--data", str(TINYSTORIES), "--out", "{tmp}/o", "--dropout", "2"], "--dropout"),
    (["train", "--data", str(TINYSTORIES), "--out", "{tmp}/o", "--seed", str(2**70)], "--seed"),
    (["train", "--data", str(TINYSTORIES), "--out", "{tmp}/o", "--lr", "inf"], "--lr"),
    (["train", "--data", str(TINYSTORIES), "--out", "{tmp}/o", "--lr", "nan"], "--lr"),
    (["train", "--data", str(TINYSTORIES), "--out", "{tmp}/o", "--decay", "linear"], "linear"),
    (["train", "--out", "{tmp}/o"], "--data"),
    (["train", "--out", "{tmp}/o", "--resume"], "nothing to resume"),
    (["sample", "--checkpoint", "{ck}", "--seed", "-1"], "--seed"),
    (["sample", "--checkpoint", "{ck}", "--n", "0"], "--n"),
    (["sample", "--checkpoint", "{ck}", "--batch-size", "0"], "--batch-size"),
    (["eval", "--checkpoint", "{ck}", "--data", str(TINYSTORIES_VALID), "--batch-size", "0"], "--batch-size"),
    (["eval", "--checkpoint", "{ck}", "--data", str(TINYSTORIES_VALID), "--mc-samples", "0"], "--mc-samples"),
    (["eval", "--checkpoint", "{ck}", "--data", str(TINYSTORIES_VALID), "--samples", "2", "--sample-length", "0"], "--length"),
    (["eval", "--checkpoint", "{ck}", "--data", "{tmp}/missing.txt"], "not found"),
    (["eval", "--checkpoint", "{ck}", "--data", str(TINYSTORIES_VALID), "--steps", "0"], "--steps"),
]


@pytest.fixture
def bad_inputs(tmp_path, tiny_checkpoint):
    import shutil

    (tmp_path / "empty.txt").write_text("\n\n")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 au lait\n".encode("latin-1"))
    shutil.copytree(tiny_checkpoint, tmp_path / "broken")
    (tmp_path / "broken" / "model.safetensors").write_bytes(b"garbage")
    shutil.copytree(tiny_checkpoint, tmp_path / "incomplete")
    (tmp_path / "incomplete" / "config.json").unlink()
    return tmp_path


@pytest.mark.parametrize("args,needle", BAD, ids=[" ".join(a[:1] + a[-2:]) for a, _ in BAD])
def test_bad_input_gives_one_line(args, needle, bad_inputs, tiny_checkpoint, capsys, monkeypatch):
    args = [a.format(ck=tiny_checkpoint, tmp=bad_inputs) for a in args]
    code, out, err = run(args, capsys, monkeypatch)
    assert code != 0
    assert out == ""
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert "Traceback" not in err
    if lines and lines[0].startswith("dbert: error:"):
        assert len(lines) == 1 and needle in lines[0], err
    else:  # usage errors (an invalid enum choice) come from Typer as a short usage box
        assert needle in err and code == 2


def test_help_does_not_import_torch():
    code = "import sys; import dbert_core.cli; print('torch' in sys.modules, 'transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False False"


def test_core_never_imports_textual():
    mods = ["cli", "storage.checkpoint", "text.data", "maths.diffusion", "evaluation.metrics", "maths.model", "progress",
            "sampling.sample", "maths.schedule", "storage.store", "training.train"]
    code = "import sys\n" + "".join(f"import dbert_core.{m}\n" for m in mods) + "print('textual' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_saves_and_resume_continues(tmp_path, sig):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "dbert_core.cli", "train", "--data", str(TINYSTORIES), "--out", str(out),
           "--max-steps", "100000", "--batch-size", "8", "--seq-len", "16", "--T", "64", "--eval-every", "0",
           "--save-every", "0", "--log-every", "1", "--device", "cpu"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    for line in proc.stderr:
        if line.startswith("step 5/"):
            break
    proc.send_signal(sig)  # Ctrl-C, or a kill / job scheduler's SIGTERM: both save
    stdout, rest = proc.communicate(timeout=120)
    assert proc.returncode == 130 and stdout == ""
    assert "continue with --resume" in rest and "Traceback" not in rest
    state = json.loads((out / "trainer_state" / "state.json").read_text())
    assert state["step"] >= 5
    resumed = subprocess.run(cmd[:cmd.index("--max-steps") + 1] + [str(state["step"] + 2)] +
                             cmd[cmd.index("--max-steps") + 2:] + ["--resume"], capture_output=True, text=True,
                             env=env, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads((out / "trainer_state" / "state.json").read_text())["step"] == state["step"] + 2


def test_generation_conventions(tiny_checkpoint, tmp_path, capsys, monkeypatch):
    """A positional prompt with [MASK*N], short options, prompts from a file or stdin (--n each),
    --output JSON Lines with text, prompt, seed and settings; progress on stderr only."""
    import io

    ck = str(tiny_checkpoint)
    code, out, err = run(["sample", "Once upon a time [MASK*6]", "-c", ck, "-n", "2", "--seed", "4",
                          "--length", "12", "--steps", "8"], capsys, monkeypatch)
    assert code == 0 and len(out.splitlines()) == 2
    assert all(line.startswith("Once upon a time") for line in out.splitlines())
    assert "[MASK" not in out and "sampling 2/2" in err  # a plain progress line: stderr is not a terminal
    # the same run through -p gives the same lines
    code, again, _ = run(["sample", "-p", "Once upon a time [MASK*6]", "-c", ck, "-n", "2", "--seed", "4",
                          "--length", "12", "--steps", "8"], capsys, monkeypatch)
    assert again == out
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Once upon a time [MASK*6]\n\nThe dog [MASK] ran\n", encoding="utf-8")
    jsonl = tmp_path / "out.jsonl"
    code, out2, err2 = run(["sample", "--prompt-file", str(prompts), "-c", ck, "-n", "2", "--seed", "4",
                            "--length", "12", "--steps", "8", "-o", str(jsonl)], capsys, monkeypatch)
    lines = out2.splitlines()
    assert code == 0 and len(lines) == 4 and lines[:2] == out.splitlines()  # each prompt: its own seeded run
    records = [json.loads(x) for x in jsonl.read_text(encoding="utf-8").splitlines()]
    assert [r["text"] for r in records] == lines
    assert [r["prompt"] for r in records] == ["Once upon a time [MASK*6]"] * 2 + ["The dog [MASK] ran"] * 2
    assert {r["seed"] for r in records} == {4} and records[2]["index"] == 0
    assert records[0]["settings"]["steps"] == 8 and records[0]["settings"]["length"] == 12
    assert records[0]["settings"]["sampler"] and records[0]["stats"]["nfe"] > 0
    monkeypatch.setattr(sys, "stdin", io.StringIO("The dog [MASK] ran\n"))
    code, out3, _ = run(["sample", "-", "-c", ck, "-n", "2", "--seed", "4", "--length", "12", "--steps", "8"],
                        capsys, monkeypatch)
    assert code == 0 and out3.splitlines() == lines[2:]
    # without --seed, the seed drawn is written down and reproduces the run
    code, out4, _ = run(["sample", "-c", ck, "-n", "1", "--length", "12", "--steps", "8", "-o", str(jsonl)],
                        capsys, monkeypatch)
    seed = json.loads(jsonl.read_text(encoding="utf-8"))["seed"]
    code, out5, _ = run(["sample", "-c", ck, "-n", "1", "--length", "12", "--steps", "8", "--seed", str(seed)],
                        capsys, monkeypatch)
    assert out5 == out4
    code, _, err = run(["sample", "a [MASK]", "-p", "b [MASK]", "-c", ck], capsys, monkeypatch)
    assert code != 0 and "one prompt source" in err and "Traceback" not in err


def test_resume_from_anywhere_and_moved_data(tmp_path, capsys, monkeypatch):
    """A run records absolute data paths (it resumes from another folder), and --data may be given
    again on resume for the same files moved elsewhere, checked by content, never for other files."""
    import shutil

    home = tmp_path / "project"
    home.mkdir()
    shutil.copy(TINYSTORIES, home / "stories.txt")
    monkeypatch.setenv("DBERT_HOME", str(tmp_path / "dbhome"))
    monkeypatch.chdir(home)
    args = ["--max-steps", "2", "--batch-size", "8", "--seq-len", "16", "--T", "64", "--eval-steps", "8",
            "--eval-every", "0", "--device", "cpu"]
    code, _, err = run(["train", "--data", "stories.txt", "--out", "anywhere", *args], capsys, monkeypatch)
    assert code == 0, err
    meta = json.loads((tmp_path / "dbhome" / "checkpoints" / "anywhere" / "dbert.json").read_text())
    assert meta["train_config"]["data"] == [str(home / "stories.txt")] and meta["data_files"][0]["size"] > 0
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    code, _, err = run(["train", "--out", "anywhere", "--resume", "--max-steps", "3"], capsys, monkeypatch)
    assert code == 0, err
    # the files moved: given again, they are checked by size and hash
    (home / "stories.txt").rename(elsewhere / "moved.txt")
    code, _, err = run(["train", "--out", "anywhere", "--resume", "--max-steps", "4"], capsys, monkeypatch)
    assert code != 0 and "data file not found" in err
    code, _, err = run(["train", "--out", "anywhere", "--resume", "--max-steps", "4", "--data", "moved.txt"],
                       capsys, monkeypatch)
    assert code == 0, err
    (elsewhere / "other.txt").write_text("A different story. It is not the run's.\n" * 50)
    code, _, err = run(["train", "--out", "anywhere", "--resume", "--max-steps", "5", "--data", "other.txt"],
                       capsys, monkeypatch)
    assert code != 0 and "not the run's" in err and "Traceback" not in err


def test_the_default_answers_to_both_names(capsys, monkeypatch):
    from dbert_core.storage.store import resolve

    assert resolve("dbert-minilm-stories") == resolve("default") == resolve(None)
    code, _, err = run(["sample", "-c", "dbert-minilm-stori", "-n", "1"], capsys, monkeypatch)
    assert code == 2 and "did you mean 'dbert-minilm-stories'" in err and len(err.strip().splitlines()) == 1
    code, _, err = run(["train", "--data", str(TINYSTORIES), "--out", "dbert-minilm-stories"], capsys, monkeypatch)
    assert code == 2 and "shipped checkpoint" in err


@pytest.mark.parametrize("command", [["train"], ["sample"], ["eval"], ["bench"], ["serve"], ["tui"],
                                     ["checkpoints", "list"], ["checkpoints", "fetch"], ["checkpoints", "import"],
                                     ["checkpoints", "remove"]])
def test_help_reads_cleanly(command, capsys, monkeypatch):
    """Each command's help: an example, no `<bool>` on flags, no " ." left by swallowed markup."""
    monkeypatch.setenv("COLUMNS", "100")
    code, out, _ = run([*command, "--help"], capsys, monkeypatch)
    assert code == 0 and "Example:" in out
    assert "<bool>" not in out and " .\n" not in out.replace("│", "\n") and " . " not in out
    if command == ["sample"]:
        flat = " ".join(out.replace("│", " ").split())
        assert "default: a fresh one" in flat and "default: the checkpoint's training length" in flat


def test_cli_starts_with_a_typer_that_has_no_help_type_hook(monkeypatch):
    """The GPU image's older typer has no TyperOption.display_type_rich: the `dbert` command must
    still start there (help then shows flags with their type), not fail on import."""
    import typer.core

    from dbert_core.cli.options import flags_without_type

    old = type("TyperOption", (), {})  # an option class without the hook, as an older typer's
    monkeypatch.setattr(typer.core, "TyperOption", old)
    flags_without_type()  # no AttributeError
    assert not hasattr(old, "display_type_rich")


def test_dbert_tui_takes_every_option_of_dbert_tui(capsys, monkeypatch):
    from dbert_tui import app as tui_app
    from dbert_tui.controller import Settings

    seen = {}
    monkeypatch.setattr(tui_app, "run", lambda checkpoint, settings: seen.update(c=checkpoint, s=settings) or 0)
    code, _, err = run(["tui", "--steps", "64", "--temperature", "0", "--top-k", "5", "--length", "20", "--seed", "3",
                        "--device", "cpu", "--pace-ms", "0", "-c", "dbert-minilm-wiki"], capsys, monkeypatch)
    assert code == 0, err
    assert seen["c"] == "dbert-minilm-wiki"
    assert seen["s"] == Settings(steps=64, temperature=0.0, top_k=5, length=20, seed=3, device="cpu", pace_ms=0)
    code, _, err = run(["tui", "--steps", "0"], capsys, monkeypatch)
    assert code == 2 and "--steps" in err and "Traceback" not in err


def test_errors_that_say_what_happened(tiny_checkpoint, tmp_path, capsys, monkeypatch):
    """A prompt without a slot or with unspellable characters gets a note; a hub id that cannot be
    downloaded says the Hub is unreachable and how to use a local folder; a folder that is no
    checkpoint says which files are missing."""
    code, out, err = run(["sample", "-c", str(tiny_checkpoint), "-p", "the cat 🐱", "-n", "1", "--length", "8",
                          "--steps", "4", "--seed", "1"], capsys, monkeypatch)
    assert code == 0 and out.startswith("the cat 🐱")
    assert "no [MASK] slot" in err and "cannot spell '🐱'" in err
    code, _, err = run(["sample", "-c", str(tiny_checkpoint), "-p", "the [mask] sat", "-n", "1", "--length", "8",
                        "--steps", "4"], capsys, monkeypatch)
    assert code == 0 and "no [MASK] slot" not in err
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("DBERT_HOME", str(tmp_path / "home"))
    code, _, err = run(["train", "--init", "bert-base-uncased", "--data", str(TINYSTORIES), "--out", str(tmp_path / "x"),
                        "--max-steps", "1"], capsys, monkeypatch)
    assert code == 2 and "not reachable" in err and "--init ./bert-base-uncased" in err
    (tmp_path / "notck").mkdir()
    (tmp_path / "notck" / "config.json").write_text("{}")
    code, _, err = run(["checkpoints", "import", str(tmp_path / "notck")], capsys, monkeypatch)
    assert code == 2 and "missing" in err and "model.safetensors" in err and "config.json," not in err


def test_eval_and_sample_show_progress_on_stderr_only(tiny_checkpoint, capsys, monkeypatch):
    code, out, err = run(["eval", "--checkpoint", str(tiny_checkpoint), "--data", str(TINYSTORIES_VALID), "--unit",
                          "sentence", "--limit", "40", "--batch-size", "16", "--steps", "8", "--samples", "4",
                          "--sample-steps", "4", "--sample-length", "8", "--json"], capsys, monkeypatch)
    assert code == 0 and json.loads(out)["examples"] == 40  # stdout: the JSON alone
    assert "scoring 40/40" in err and "sampling 8/8" in err



def test_eval_samples_follow_the_checkpoints_length_unless_told(tiny_checkpoint, capsys, monkeypatch):
    seq_len = json.loads((tiny_checkpoint / "dbert.json").read_text())["seq_len"]
    code, out, _ = run(["eval", "--checkpoint", str(tiny_checkpoint), "--data", str(TINYSTORIES_VALID), "--limit", "4",
                        "--steps", "4", "--samples", "2", "--sample-steps", "4", "--json"], capsys, monkeypatch)
    assert code == 0 and json.loads(out)["sample_length"] == seq_len  # as `dbert sample` does
    code, out, _ = run(["eval", "--checkpoint", str(tiny_checkpoint), "--data", str(TINYSTORIES_VALID), "--limit", "4",
                        "--steps", "4", "--samples", "2", "--sample-steps", "4", "--sample-length", "7", "--json"],
                       capsys, monkeypatch)
    assert code == 0 and json.loads(out)["sample_length"] == 7

def test_progress_line_on_a_terminal():
    import io

    import torch

    from dbert_core.cli.progress import SampleProgress
    from dbert_core.sampling.sample import Frame

    class Tty(io.StringIO):
        def isatty(self):
            return True

    stream = Tty()
    bar = SampleProgress(4, 2, stream=stream)
    masked = torch.ones(2, 3, dtype=torch.bool)
    for step, done in ((1, False), (2, True)):
        m = torch.zeros_like(masked) if done else masked
        bar(Frame(ids=torch.zeros(2, 3, dtype=torch.long), masked=m, revealed=torch.zeros_like(m),
                  confidence=torch.zeros(2, 3), step=step, steps=2, t=0, nfe=step))
    bar.close()
    text = stream.getvalue()
    assert "\r" in text and "sampling 2/4 · step 2/2 · 2 calls" in text and "\n" not in text


def test_checkpoints_list_fits_80_columns_and_marks_the_tuis(tiny_checkpoint, tmp_path, capsys, monkeypatch):
    import shutil

    monkeypatch.setenv("DBERT_HOME", str(tmp_path))
    store = tmp_path / "checkpoints"
    store.mkdir()
    long_name = "a-checkpoint-with-a-really-very-long-name-that-would-not-fit-otherwise"
    shutil.copytree(tiny_checkpoint, store / long_name)
    shutil.copytree(tiny_checkpoint, store / "mine")
    (tmp_path / "tui.json").write_text(json.dumps({"checkpoint": str(store / "mine")}))
    code, out, err = run(["checkpoints", "list"], capsys, monkeypatch)
    lines = out.splitlines()
    assert code == 0 and all(len(x) <= 80 for x in lines)
    assert lines[1].startswith("  dbert-minilm-stories (default)")  # both names of the default
    mine = next(x for x in lines if " mine " in x)
    meta = json.loads((store / "mine" / "dbert.json").read_text())
    assert mine.startswith("* ") and f"{meta['step']:,}" in mine and meta["created"][:10] in mine
    assert f"{meta['parameters'] / 1e6:.2f}M" in mine  # counted as the TUI's Checkpoints screen counts them
    assert any("…" in x for x in lines)  # the long name is cut, not the table
    code, out, _ = run(["checkpoints", "list", "--json"], capsys, monkeypatch)
    rows = {r["name"]: r for r in map(json.loads, out.splitlines())}
    assert rows["mine"]["tui"] and not rows["default"]["tui"] and rows["mine"]["step"] == meta["step"]


def test_import_of_a_folder_that_is_no_checkpoint_says_what_is_missing(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("DBERT_HOME", str(tmp_path / "home"))
    folder = tmp_path / "scratch"
    folder.mkdir()
    (folder / "scanhist.sh").write_text("echo hi\n")
    code, _, err = run(["checkpoints", "import", str(folder)], capsys, monkeypatch)
    assert code == 2 and "is not a dbert checkpoint" in err and "model.safetensors" in err
    assert "custom code" not in err


def test_eval_text_output_reads_as_bounds(tiny_checkpoint, capsys, monkeypatch):
    code, out, _ = run(["eval", "--checkpoint", str(tiny_checkpoint), "--data", str(TINYSTORIES_VALID), "--unit",
                        "sentence", "--limit", "20", "--steps", "8"], capsys, monkeypatch)
    assert code == 0
    assert "perplexity per token  <= " in out and "(95%: " in out and "upper bounds" in out
    assert "nats_per_word " in out and "nats_per_word_se" in out


def test_sample_help_is_short_and_help_all_lists_every_option_whole():
    """`dbert sample --help` at 80 columns: the common options, none of their names cut (it was 402
    lines, "--end-at-senten…"); --help-all: every option by its full names, no line past 80."""
    import re
    import subprocess

    from dbert_core.cli.commands.sample import COMMON
    from helpers import ROOT

    env = {**os.environ, "COLUMNS": "80", "PYTHONPATH": str(ROOT), "TERM": "dumb"}
    short = subprocess.run([sys.executable, "-m", "dbert_core.cli", "sample", "--help"], env=env, capture_output=True,
                           text=True, timeout=120)
    every = subprocess.run([sys.executable, "-m", "dbert_core.cli", "sample", "--help-all"], env=env,
                           capture_output=True, text=True, timeout=120)
    assert short.returncode == 0 and every.returncode == 0, short.stderr + every.stderr
    assert len(short.stdout.splitlines()) < 100 and "…" not in short.stdout
    import typer.main

    from dbert_core.cli import app

    command = typer.main.get_command(app).commands["sample"]
    options = [p for p in command.params if p.param_type_name == "option"]
    assert len(options) > 30
    for p in options:
        names = [*p.opts, *p.secondary_opts]
        assert "  " + ", ".join(names) in every.stdout.splitlines(), names  # each option's names whole, on a line
        if p.name in COMMON:
            assert all(re.search(re.escape(n) + r"(?![\w-])", short.stdout) for n in names), names
        else:
            assert not re.search(re.escape(p.opts[0]) + r"(?![\w-])", short.stdout), p.opts  # only under --help-all
    assert max(len(line) for line in every.stdout.splitlines()) <= 80 and "…" not in every.stdout
