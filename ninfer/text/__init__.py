"""Text: the tokenizer wrapper, the tokenizer.json builder and the incremental detokenizer."""
