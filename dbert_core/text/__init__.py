"""text: words and token ids, with no model in sight.

tokenizer (WordPiece, read and written in transformers' files), data (text files -> documents ->
windows -> batches), detok (token pieces -> text), truecase, stable (a layout whose words stay put),
quotes, contractions and lexicon (the rules the touch-ups and the reader's checks apply; lexicon: the
training text's words, against which a sample's made-up words are found).

May import: the floor, disk.
"""
