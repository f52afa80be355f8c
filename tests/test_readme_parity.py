"""The README's Hugging Face table gives, per architecture, the largest max
|logit diff| that docs/huggingface.md's table states for its variants (the
figures before a row's hidden states'), so the two cannot drift apart."""

from __future__ import annotations

import re

from helpers import ROOT

FIGURE = re.compile(r"\d\.\de-\d+")


def _rows(page: str, section: str) -> list[list[str]]:
  text = (ROOT / page).read_text()
  body = text[text.index(section):]
  rows = []
  for line in body.splitlines()[1:]:  # after the header
    if line.startswith("## "):
      break
    if line.startswith("| ") and not line.startswith("|---"):
      rows.append([c.strip() for c in line.strip().strip("|").split("|")])
  return rows


def test_the_readme_gives_each_architecture_its_largest_logit_difference():
  docs = {}
  for cells in _rows("docs/huggingface.md", "| HF architecture |"):
    name = re.sub(r",.*$", "", cells[0].split(" (")[0])
    # The logits' figures (a row may go on to its final hidden states').
    figures = [float(f) for f in FIGURE.findall(cells[-1].split("hidden states")[0])]
    docs[name] = max(figures + [docs.get(name, 0.0)])
  readme = {cells[0]: float(cells[1]) for cells in _rows("README.md", "| architecture |")}
  assert readme == docs
