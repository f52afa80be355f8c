"""Floor 2: the model (its config, the three families, blocks, decoding,
logical axis names and ``layers/``). Imports core and data (the tokenizer's
special ids) only.
"""
