"""text: words and token ids, with no model in sight.

tokenizer (WordPiece, read and written in transformers' files), pieces (a long text tokenized in
bounded pieces), data (text files -> documents -> windows -> batches), sources (files read as a stream: lines, documents, compressed files), token_cache
(a corpus tokenized once into memory-mapped arrays on disk), cached_windows (whole-story windows drawn
from them), cached_examples (a line or sentence run's examples and packed windows drawn from them), learnt_tables (the truecasing table and word list, learnt once per corpus), detok (token
pieces -> text), truecase, stable (a layout whose words stay put),
quotes, contractions and lexicon (the rules the touch-ups and the reader's checks apply; lexicon: the
training text's words, against which a sample's made-up words are found).

May import: the floor, disk.
"""
