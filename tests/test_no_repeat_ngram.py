"""The n-gram block (--no-repeat-ngram N): no id that writes an N-gram the sample already shows, at any
place of it; the setting through the CLI, the server, a checkpoint's recommendation and the queue."""

import json

import pytest
import torch

from dbert_core.config import SampleConfig
from dbert_core.errors import DbertError
from dbert_core.sampling.draw import no_repeat_ngram_ids
from dbert_core.sampling.sample import frames, generate

M = 99  # [MASK] in the hand-made rows


def blocked(x, n, specials=None):
    masked = x == M
    return [sorted({v for v in row if v >= 0}) for row in no_repeat_ngram_ids(x, masked, masked, n, specials).tolist()]


def test_the_block_holds_an_ngram_the_position_ends_or_starts():
    x = torch.tensor([[1, 2, 3, 9, 1, 2, M, 4, 5, 6, M, 5, 6, 7, M, 8]])
    # after "1 2" (as in "1 2 3"): 3; before "5 6" (as in "4 5 6") 4 and after "5 6" (as in "5 6 7") 7;
    # after "6 7" and before "8 ...": nothing shown to repeat
    assert blocked(x, 3) == [[3], [4, 7], []]
    y = torch.tensor([[1, 2, 3, 9, 1, M, 3]])  # inside "1 _ 3": not held (the word that fits there is seldom free)
    assert blocked(y, 3) == [[]]
    assert blocked(y, 2) == [[2]]  # after "1" (as in "1 2") and before "3" (as in "2 3")
    assert blocked(y, 1) == [[1, 2, 3, 9]]


def test_masked_positions_and_special_ids_make_no_ngram():
    x = torch.tensor([[1, 2, M, 9, 1, 2, M]])  # "1 2 _" shown only with its third place masked: nothing to repeat
    assert blocked(x, 3) == [[], []]
    SEP = 50
    end = torch.tensor([[SEP, SEP, SEP, 1, SEP, SEP, M]])  # end padding is no text: "[SEP] [SEP] [SEP]" may go on
    assert blocked(end, 3, torch.tensor([SEP])) == [[]]
    assert blocked(end, 3) == [[1, SEP]]  # as words: "SEP SEP SEP" and "SEP SEP 1" both shown


def ngrams_repeated(ids, n, specials):
    out = 0
    for row in ids.tolist():
        seen = set()
        for i in range(len(row) - n + 1):
            g = tuple(row[i: i + n])
            if any(t in specials for t in g):
                continue
            out += g in seen
            seen.add(g)
    return out


def test_no_sample_repeats_an_ngram_written_left_to_right(tiny_db):
    """One token a step, left to right (blockwise, blocks of 1): each position ends the only n-gram it
    completes, so no 3-gram repeats; the model alone repeats them here (the test can fail)."""
    tok = tiny_db.tokenizer
    specials = {tok.sep_token_id, tok.cls_token_id, tok.pad_token_id}
    kw = dict(n=8, length=40, steps=40, sampler="blockwise", params={"block": 1}, top_k=3, pair_quotes=False,
              block_repeats=False)
    free = list(frames(tiny_db, generator=torch.Generator().manual_seed(3), **kw))[-1].ids
    assert ngrams_repeated(free, 3, specials) > 0
    kept = list(frames(tiny_db, generator=torch.Generator().manual_seed(3), no_repeat_ngram=3, **kw))[-1].ids
    assert ngrams_repeated(kept, 3, specials) == 0


def test_fewer_ngrams_repeat_in_any_order(tiny_db):
    """Confidence order (positions between revealed ones, not held to the n-grams they sit inside):
    fewer repeats, not none."""
    tok = tiny_db.tokenizer
    specials = {tok.sep_token_id, tok.cls_token_id, tok.pad_token_id}
    kw = dict(n=8, length=40, steps=40, sampler="confidence", top_k=3, pair_quotes=False, block_repeats=False)
    free = list(frames(tiny_db, generator=torch.Generator().manual_seed(3), **kw))[-1].ids
    kept = list(frames(tiny_db, generator=torch.Generator().manual_seed(3), no_repeat_ngram=3, **kw))[-1].ids
    assert ngrams_repeated(kept, 3, specials) < ngrams_repeated(free, 3, specials) / 2


def test_the_block_changes_nothing_where_no_ngram_repeats(tiny_db):
    """A large N (no 12-gram repeats in 16 tokens of a one-step-a-token run) leaves the sample as it was."""
    kw = dict(n=4, length=16, steps=16, sampler="confidence", top_k=0, seed=5, pair_quotes=False)
    assert generate(tiny_db, **kw)[0] == generate(tiny_db, no_repeat_ngram=12, **kw)[0]


def test_the_setting_is_checked_and_recommended(tiny_db):
    from dbert_core.sampling.settings import default_decoding, resolve

    with pytest.raises(DbertError) as e:
        SampleConfig(no_repeat_ngram=-1).validate()
    assert e.value.setting == "no_repeat_ngram"
    assert resolve(SampleConfig(), tiny_db).no_repeat_ngram == 0  # no recommendation: off
    meta = tiny_db.meta.setdefault("sampling", {})
    old = meta.get("decoding")
    try:
        meta["decoding"] = {"no_repeat_ngram": 4}
        assert default_decoding(tiny_db)["no_repeat_ngram"] == 4
        assert resolve(SampleConfig(), tiny_db).no_repeat_ngram == 4
        assert resolve(SampleConfig(no_repeat_ngram=0), tiny_db).no_repeat_ngram == 0  # told: off
        meta["decoding"] = {"no_repeat_ngram": "four"}  # malformed: left out
        assert default_decoding(tiny_db)["no_repeat_ngram"] == 0
    finally:
        if old is None:
            meta.pop("decoding", None)
        else:
            meta["decoding"] = old


def test_the_cli_and_the_server_take_it(tiny_checkpoint, tmp_path):
    import subprocess
    import sys

    out = tmp_path / "s.jsonl"
    r = subprocess.run([sys.executable, "-m", "dbert_core.cli", "sample", "-c", str(tiny_checkpoint), "--n", "2",
                        "--steps", "8", "--seed", "1", "--no-repeat-ngram", "3", "--output", str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert all(json.loads(line)["settings"]["no_repeat_ngram"] == 3 for line in out.read_text().splitlines())
    bad = subprocess.run([sys.executable, "-m", "dbert_core.cli", "sample", "-c", str(tiny_checkpoint),
                          "--no-repeat-ngram", "-2"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--no-repeat-ngram" in bad.stderr and "Traceback" not in bad.stderr


def test_the_server_takes_it_and_the_queue_keeps_it_apart(tiny_db):
    from dbert_core.sampling.settings import resolve
    from dbert_core.serving.options import Limits
    from dbert_core.serving.serve import create_app
    from dbert_core.serving.serve_queue import Job
    from helpers import post_json, serving

    prompt = "once upon a time"
    length = len(tiny_db.tokenizer.encode(prompt, add_special_tokens=False)) + 12
    cfg = dict(n=2, steps=12, seed=4, length=length, prompt=prompt + " [MASK]" * 12, dtype="fp32", top_k=3,
               sampler="confidence")
    want, _ = generate(tiny_db, SampleConfig(no_repeat_ngram=2, **cfg))
    assert want != generate(tiny_db, SampleConfig(**cfg))[0]  # the setting changes these texts: the test can fail
    app = create_app(tiny_db, "tiny", dtype="fp32", limits=Limits(max_n=8, max_tokens=64, max_body=4096))
    with serving(app) as (url, _):
        body = {"model": "tiny", "prompt": prompt, "max_tokens": 12, "n": 2, "seed": 4, "echo": True,
                "dbert": {"steps": 12, "top_k": 3, "sampler": "confidence", "no_repeat_ngram": 2}}
        status, got = post_json(url + "/v1/completions", body)
        assert status == 200, got
        assert [c["text"] for c in got["choices"]] == want
        status, err = post_json(url + "/v1/completions", {**body, "dbert": {"no_repeat_ngram": -1}})
        assert status == 400 and err["error"]["param"] == "dbert.no_repeat_ngram", err
    one = resolve(SampleConfig(n=1, no_repeat_ngram=3), tiny_db)
    two = resolve(SampleConfig(n=1, no_repeat_ngram=4), tiny_db)
    assert Job(one, notify=print).batch_key != Job(two, notify=print).batch_key
