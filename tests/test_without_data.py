"""The suite where the shared corpora are not (a clone with no ../shared/data): it collects, the
tests that read the corpora skip with the reason, and the others still run (conftest.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from helpers import ROOT

READ_THE_CORPORA = [  # each reaches them another way
    "tests/test_text.py::test_no_quote_or_bracket_is_dropped_on_a_whole_corpus",  # parametrized over their files
    "tests/test_hostile.py::test_sighup_saves_even_when_the_terminal_is_gone",  # its module's TRAIN command line
    "tests/test_token_cache.py::test_the_second_call_reads_the_cache_and_tokenizes_nothing",  # HEAD = DATA / ...
    "tests/test_cli.py::test_sample_prints_exactly_n_lines",  # the tiny_checkpoint fixture trains on TinyStories
]
NEED_NONE = ["tests/test_text.py::test_splitter_keeps_closing_quotes_and_brackets",
             "tests/test_token_cache.py::test_a_bad_file_is_one_line"]


def test_without_the_corpora_their_tests_skip_with_the_reason_and_the_others_run(tmp_path):
    env = {**os.environ, "DBERT_DATA": str(tmp_path)}  # set, it is the only place looked at: here, empty
    got = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                          *READ_THE_CORPORA, *NEED_NONE], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=600)
    assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-3000:]
    counts = dict((k, int(n)) for n, k in re.findall(r"(\d+) (passed|skipped|failed|error)", got.stdout.splitlines()[-1]))
    assert counts.get("passed", 0) >= len(NEED_NONE) and counts.get("skipped", 0) >= len(READ_THE_CORPORA)
    assert "failed" not in counts and "error" not in counts, got.stdout[-2000:]
    skipped = re.findall(r"SKIPPED \[\d+\] (tests/[^:\s]+)(?::\d+)?: the shared corpora are not here", got.stdout)
    assert {s.split("::")[0] for s in READ_THE_CORPORA} <= set(skipped), got.stdout[-2000:]
