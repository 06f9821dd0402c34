"""The names of the splits an evaluation may score, in a module that imports nothing heavy: the command
line builds its parsers from it without importing torch."""

EVAL_SPLITS = ("test", "val", "train", "all")  # what an evaluation may score (datasets.eval_split)
