"""Every worker error in dbert-tui is one readable notification and the screen goes back to a
usable state, driven with Pilot through workers that raise."""

from __future__ import annotations

import pytest

from dbert_core.errors import DbertError
from dbert_tui.app import create_app
from dbert_tui.controller import Settings
from dbert_tui.workers import MOST, one_line
from helpers import SIZE, TINYSTORIES, finished, make_app, wait_for

pytestmark = pytest.mark.anyio

TORCH = ("The size of tensor a (604) must match the size of tensor b (512) at non-singleton dimension 1. "
         "You can make a clone to get a normal tensor before doing inplace update. See "
         "https://github.com/pytorch/rfcs/pull/17 for more details and a long explanation of inference mode")


def readable(message: str) -> bool:
    """One line, no raw library text, not cut inside a word."""
    return "\n" not in message and "tensor a" not in message and len(message) <= MOST and (
        not message.endswith("…") or message[-2].isalpha() or message[-2] in ".)")


def test_one_line_says_it_for_a_person_and_cuts_after_a_word():
    long = DbertError("the checkpoint " + "very " * 60 + "long story ends here")
    line = one_line(long)
    assert len(line) <= MOST and line.endswith("…") and line[:-1].endswith("very")
    assert one_line(RuntimeError(TORCH)) == "an internal error (RuntimeError), please report it"
    assert one_line(RuntimeError(TORCH), "/x/tui-errors.log").endswith("the traceback is in /x/tui-errors.log")
    assert one_line(RuntimeError("CUDA out of memory. Tried to allocate 2 GiB")).startswith("out of memory")
    assert one_line(PermissionError(13, "Permission denied", "/tmp/x")) == "Permission denied (/tmp/x)"
    assert readable(one_line(RuntimeError(TORCH * 3)))


async def test_a_sampling_worker_that_raises_is_one_notification_and_the_run_can_go_again(tiny_db, monkeypatch):
    from dbert_core.storage.store import home
    from dbert_tui.widgets.generate import player

    real = player.produce

    def broken(*args, **kwargs):
        raise RuntimeError(TORCH)

    monkeypatch.setattr(player, "produce", broken)
    app = make_app(tiny_db)
    async with app.run_test(size=SIZE) as pilot:
        g = app.generate_screen
        await wait_for(pilot, lambda: g.run is not None and g.run.failed, what="the failed run")
        await pilot.pause()
        messages = [n.message for n in app._notifications if "loading" not in n.message]
        assert len(messages) == 1 and readable(messages[0]) and "internal error (RuntimeError)" in messages[0]
        log = home() / "tui-errors.log"
        assert str(log) in messages[0] and "The size of tensor a (604)" in log.read_text()  # the details: there
        assert "starting" not in g.shown_text() and "the run failed" in str(g.canvas.query_one("#gen-tokens").render())
        status = str(g.query_one("#gen-status").render())
        assert "failed" in status and "starting" not in status
        monkeypatch.setattr(player, "produce", real)
        await pilot.press("space")  # the run again: it works now
        await wait_for(pilot, finished(app), what="the run again")
        assert not g.run.failed and g.shown_text()


async def test_a_refill_that_fails_brings_back_the_text_it_started_from(tiny_db, monkeypatch):
    import dbert_core.sampling.refill as refill

    app = make_app(tiny_db)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, finished(app))
        g = app.generate_screen
        text, original = g.shown_text(), [int(i) for i in g.run.frames[-1].frame.ids[0]]
        real = refill.refill_stream

        def broken(*args, **kwargs):
            raise IndexError("index out of range in self")

        monkeypatch.setattr(refill, "refill_stream", broken)
        await pilot.press("i", "backspace", "f")
        await wait_for(pilot, lambda: any("internal error (IndexError)" in n.message for n in app._notifications),
                       what="the notification")
        await pilot.pause()
        assert g.shown_text() == text and [int(i) for i in g.run.frames[-1].frame.ids[0]] == original
        assert "starting" not in str(g.query_one("#gen-status").render())
        monkeypatch.setattr(refill, "refill_stream", real)
        await pilot.press("i", "backspace", "f")  # and a refill works again
        await wait_for(pilot, lambda: finished(app)() and g.run.template is not None, what="the refill")
        assert tiny_db.model.mask_id not in [int(i) for i in g.run.frames[-1].frame.ids[0]]


async def test_a_training_worker_that_raises_is_readable_and_the_form_starts_again(tiny_db, monkeypatch):
    from dbert_core.training.train import Trainer

    def broken(self):
        raise RuntimeError(TORCH)

    monkeypatch.setattr(Trainer, "run", broken)
    app = create_app(checkpoint=tiny_db.path, loader=lambda p: tiny_db, train_data=[str(TINYSTORIES)],
                     settings=Settings(pace_ms=0, steps=8, length=12, sampler="ancestral", top_k=0), deterministic=True)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, finished(app))
        await pilot.press("3")
        tr = app.train_screen
        for wid, value in {"tr-out": "broken", "tr-steps": "4", "tr-batch": "8", "tr-seq": "16", "tr-T": "64"}.items():
            tr.query_one(f"#{wid}").value = value
        await pilot.press("f5")
        await wait_for(pilot, lambda: "failed" in str(tr.query_one("#tr-stats").render()), what="the failure")
        await pilot.pause(0.2)
        stats = str(tr.query_one("#tr-stats").render())
        assert "internal error (RuntimeError)" in stats and "tensor a" not in stats
        messages = [n.message for n in app._notifications if "RuntimeError" in n.message]
        assert len(messages) == 1 and readable(messages[0])
        assert not tr.query_one("#tr-start").disabled and tr.trainer is None


def test_the_error_log_is_a_regular_file_never_a_link_or_a_fifo(tmp_path, monkeypatch):
    import os

    from dbert_core.storage.store import home
    from dbert_tui import files

    def logged(message: str):
        try:
            raise RuntimeError(message)
        except RuntimeError as e:
            return files.log_error("test", e)

    log = home() / "tui-errors.log"
    assert logged("first") == log and logged("second") == log
    text = log.read_text()
    assert "RuntimeError: first" in text and "RuntimeError: second" in text and "Traceback" in text
    monkeypatch.setattr(files, "LOG_MOST", 10)
    logged("third")  # past its limit: started anew
    assert "first" not in log.read_text() and "RuntimeError: third" in log.read_text()
    target = tmp_path / "elsewhere.txt"
    target.write_text("a user's file\n")
    log.unlink()
    log.symlink_to(target)
    assert logged("through a link") is None and target.read_text() == "a user's file\n"
    log.unlink()
    os.mkfifo(log)
    assert logged("into a fifo") is None  # at once: nobody reads it, nothing waits
