"""dbert-tui on a story checkpoint, driven with Pilot: a prompt drawn where its tokens are on the
story's canvas (which opens with [SEP]), refill of a story longer than the model's positions,
and a long story followed and scrolled at 80x24."""

from __future__ import annotations

import pytest

from dbert_core.sampling.blocks import story_of
from dbert_core.sampling.sample import prompt_words
from helpers import SIZE, fill_dialog, finished, make_app, train_stories, wait_for

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def story_db(tmp_path_factory):
    """A tiny story model (24-token windows, 158 positions), trained for two steps."""
    return train_stories(tmp_path_factory.mktemp("tui-stories"), max_steps=2)


def story_text(db, rec, prompt: str) -> str:
    """What `dbert sample` prints for the frame's first story: the prompt's words as typed."""
    ids = story_of(rec.frame.ids[0], db.tokenizer.sep_token_id)
    return db.decode(ids, paragraph="\n", verbatim=prompt_words(db, prompt))


@pytest.mark.parametrize("prompt", ["Tom had a red kite.", "Tom had a [MASK*3] dog. He [MASK*8]"])
async def test_a_story_prompt_is_drawn_where_its_tokens_are(story_db, prompt):
    app = make_app(story_db, length=30, min_length=0)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, finished(app), what="the first run")
        await pilot.press("p")
        await fill_dialog(pilot, {"prompt": prompt})
        g = app.generate_screen
        await wait_for(pilot, lambda: g.run.settings.prompt == prompt and finished(app)(), what="the prompted run")
        await pilot.pause()
        words = prompt.split("[MASK")[0].split()
        expected = story_text(story_db, g.run.frames[-1], prompt)
        assert expected.split()[:len(words)] == words
        assert g.shown_text().split() == expected.split()  # the live canvas reads what is saved
        await pilot.press("w")  # the other layout (stable / free) draws the same words
        await pilot.pause()
        assert g.shown_text().split() == expected.split()
        mid = g.run.frames[len(g.run.frames) // 2]
        g.player.scrub_to(len(g.run.frames) // 2)
        g._draw()
        assert g.shown_text().split()[:len(words)] == words  # mid-run too: the prompt is given from the start
        assert mid.frame.ids.shape[1] == 31
