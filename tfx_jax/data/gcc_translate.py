"""TFDS builder `tfx_gcc_translate`: English -> German/French GCC diagnostics.

Source: the GCC 12 message catalogs of Debian's `gcc-12-locales` package
(`/usr/share/locale/<lang>/LC_MESSAGES/gcc-12.mo`, about 15.3k entries per
language). The catalog is read with the standard library (`struct`): no
gettext tooling is needed. When the package is not installed the builder
fetches it with `apt-get download gcc-12-locales` and unpacks it with
`dpkg -x` into `<data_dir>/downloads/` (no root needed), so only the Debian
package archive has to be reachable.

Cleaning, identical on both sides (`normalize`):
* GCC's quoting directives `%<` `%>` and `%'` become `'`; `%%` becomes `%`;
  the URL markers `%{` `%}` and colour end `%R` are dropped;
* directives of the second formatting pass of Fortran messages (`%%<`, `%%>`,
  `%%L`, `%%C`) are treated the same way, loci becoming `{L}` / `{C}`;
* each printf/GCC conversion (`%s`, `%qD`, `%lu`, `%wd`, `%.*s`, `%2$qs`, ...)
  becomes `{k}` with k its argument number, so reordered arguments in a
  translation (`%2$s ... %1$s`) keep their correspondence;
* whitespace runs (option help text has tabs and newlines) become one space.
A pair is dropped when either side is empty, the source has no letters, the
target is an untranslated copy of the source, or the placeholders of the two
sides differ (a broken translation). Plural entries give two pairs: the singular
msgid with form 0 and the plural msgid with form 1.

Split (`split_of`): the first 8 bytes of the SHA-256 of a pair's normalised
source, modulo 100, are its bucket. Buckets 0-4 (`VALIDATION_PERCENT`) are
`validation`, buckets 5-9 (`TEST_PERCENT`, since 1.1.0) are `test`, the rest
`train`. Identical sources (one message in several contexts) never straddle
splits, and the split does not depend on the catalog order.
"""

from __future__ import annotations

import collections
import glob
import hashlib
import os
import re
import shutil
import struct
import subprocess
import tempfile
from collections.abc import Iterator

from absl import logging
import tensorflow_datasets as tfds

from tfx_jax.data import builder_base
from tfx_jax.core.errors import ConfigError

PACKAGE = "gcc-12-locales"
CATALOG = "gcc-12.mo"
SYSTEM_LOCALE_DIR = "/usr/share/locale"
LANGUAGES = ("de", "fr")
VALIDATION_PERCENT = 5
TEST_PERCENT = 5
SPLITS = ("train", "validation", "test")

_MO_MAGIC_LE = 0x950412DE
_ESCAPED = "\x00"  # Stands for a literal '%' between the two passes.
_SPECIALS = {"%%": _ESCAPED, "%<": "'", "%>": "'", "%'": "'", "%{": "", "%}": "",
             "%R": ""}
# A GCC pretty-printer / printf conversion: optional argument number, flags
# (`q` quote, `+`, `#`, printf flags), width, precision, length modifier
# (`w` is HOST_WIDE_INT), conversion letter.
_SPEC_RE = re.compile(
    r"%%|%<|%>|%'|%\{|%\}|%R"
    r"|%(?:(?P<arg>\d+)\$)?[-+ #0q]*(?:\*|\d+)?(?:\.(?:\*|\d+))?"
    r"(?:ll|hh|l|h|w|z|t)?(?P<conv>[a-zA-Z@])"
)
# Fortran front-end messages are formatted twice: `%%<%s%%> at %%L` leaves
# `%<`, `%>` and the locus `%L` (also `%C`) for the second pass.
_SECOND_PASS_RE = re.compile(_ESCAPED + r"(?:[<>']|[LC](?![A-Za-z]))")
_LETTER_RE = re.compile(r"[^\W\d_]")


def install_hint(download_dir: str) -> str:
  return (
      f"install the Debian package {PACKAGE} (`apt-get install {PACKAGE}`), "
      f"or unpack it without root: `cd {download_dir} && apt-get download "
      f"{PACKAGE} && dpkg -x {PACKAGE}_*.deb {PACKAGE}`"
  )


def find_catalog(lang: str, download_dir: str, fetch: bool = True) -> str:
  """Returns the path of `gcc-12.mo` for `lang`, fetching the .deb if needed."""
  unpacked = os.path.join(download_dir, PACKAGE)
  candidates = [
      os.path.join(SYSTEM_LOCALE_DIR, lang, "LC_MESSAGES", CATALOG),
      os.path.join(unpacked, "usr/share/locale", lang, "LC_MESSAGES", CATALOG),
  ]
  for path in candidates:
    if os.path.exists(path):
      return path
  failure = "apt-get/dpkg not available"
  if fetch and shutil.which("apt-get") and shutil.which("dpkg"):
    logging.info("%s not found; fetching %s with apt-get download into %s",
                 CATALOG, PACKAGE, download_dir)
    os.makedirs(download_dir, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=download_dir) as tmp:
      try:
        try:
          subprocess.run(["apt-get", "download", PACKAGE], cwd=tmp, check=True,
                         capture_output=True, text=True, timeout=600)
        except subprocess.CalledProcessError:
          if os.geteuid() != 0:
            raise
          # Stale package lists (the mirror moved on): refresh them once.
          subprocess.run(["apt-get", "update", "-qq"], check=True,
                         capture_output=True, text=True, timeout=600)
          subprocess.run(["apt-get", "download", PACKAGE], cwd=tmp, check=True,
                         capture_output=True, text=True, timeout=600)
        debs = glob.glob(os.path.join(tmp, f"{PACKAGE}_*.deb"))
        subprocess.run(["dpkg", "-x", debs[0], os.path.join(tmp, "x")],
                       check=True, capture_output=True, text=True, timeout=600)
        if os.path.exists(unpacked):
          shutil.rmtree(unpacked)
        os.replace(os.path.join(tmp, "x"), unpacked)
        failure = None
      except (OSError, IndexError, subprocess.SubprocessError) as e:
        stderr = getattr(e, "stderr", "") or ""
        failure = f"{e} {stderr[-500:]}".strip()
    if os.path.exists(candidates[1]):
      return candidates[1]
    failure = failure or f"{PACKAGE} has no {lang} catalog"
  raise ConfigError(
      f"dataset 'tfx_gcc_translate/{lang}' needs {candidates[0]} ({failure}); "
      + install_hint(download_dir)
  )


def read_mo(path: str) -> list[tuple[bytes, bytes]]:
  """Reads the raw (msgid, msgstr) byte pairs of a GNU .mo catalog."""
  with open(path, "rb") as f:
    data = f.read()
  (magic,) = struct.unpack("<I", data[:4])
  order = "<" if magic == _MO_MAGIC_LE else ">"
  _, _, count, ids_at, strs_at = struct.unpack(order + "5I", data[:20])
  entries = []
  for i in range(count):
    id_len, id_at = struct.unpack(order + "2I", data[ids_at + 8 * i:][:8])
    str_len, str_at = struct.unpack(order + "2I", data[strs_at + 8 * i:][:8])
    entries.append((data[id_at:id_at + id_len], data[str_at:str_at + str_len]))
  return entries


def normalize(message: str) -> tuple[str, tuple[str, ...]]:
  """Normalises GCC directives; returns (text, sorted placeholders)."""
  placeholders, counter = [], 0

  def replace(match):
    nonlocal counter
    token = match.group(0)
    if token in _SPECIALS:
      return _SPECIALS[token]
    if match.group("conv") == "m":  # strerror(errno): consumes no argument.
      name = "{m}"
    else:
      counter += 1
      number = int(match.group("arg")) if match.group("arg") else counter
      name = f"{{{number - 1}}}"
    placeholders.append(name)
    return name

  def replace_second(match):
    directive = match.group(0)[1]
    if directive in "<>'":
      return "'"
    placeholders.append(f"{{{directive}}}")
    return placeholders[-1]

  text = _SPEC_RE.sub(replace, message)
  text = _SECOND_PASS_RE.sub(replace_second, text).replace(_ESCAPED, "%")
  return " ".join(text.split()), tuple(sorted(placeholders))


def catalog_pairs(path: str) -> tuple[list[tuple[str, str]], collections.Counter]:
  """Cleaned, de-duplicated (english, translation) pairs and drop counts."""
  stats = collections.Counter()
  pairs, seen = [], set()
  for raw_id, raw_str in read_mo(path):
    if not raw_id:  # The header entry.
      continue
    stats["entries"] += 1
    raw_id = raw_id.split(b"\x04", 1)[-1]  # Drop a msgctxt.
    ids = raw_id.split(b"\x00")
    forms = raw_str.split(b"\x00")
    for msgid, msgstr in zip(ids, forms):  # Singular->form 0, plural->form 1.
      try:
        source, target = msgid.decode("utf-8"), msgstr.decode("utf-8")
      except UnicodeDecodeError:
        stats["undecodable"] += 1
        continue
      source, source_ph = normalize(source)
      target, target_ph = normalize(target)
      if not source or not target:
        stats["empty"] += 1
      elif not _LETTER_RE.search(source):
        stats["no_words"] += 1
      elif source == target:
        stats["untranslated"] += 1
      elif source_ph != target_ph:
        stats["placeholder_mismatch"] += 1
      elif (source, target) in seen:
        stats["duplicate"] += 1
      else:
        seen.add((source, target))
        pairs.append((source, target))
  stats["pairs"] = len(pairs)
  return pairs, stats


def split_of(source: str) -> str:
  """"validation", "test" or "train": a function of the source text alone."""
  digest = hashlib.sha256(source.encode()).digest()
  bucket = int.from_bytes(digest[:8], "big") % 100
  if bucket < VALIDATION_PERCENT:
    return "validation"
  if bucket < VALIDATION_PERCENT + TEST_PERCENT:
    return "test"
  return "train"


class TfxGccTranslateConfig(tfds.core.BuilderConfig):
  """One target language."""

  def __init__(self, *, language: str, **kwargs):
    super().__init__(name=language, **kwargs)
    self.language = language


class TfxGccTranslate(builder_base.PackageBuilder):
  """English -> German/French GCC diagnostic messages."""

  VERSION = tfds.core.Version("1.1.0")
  SPLITS = SPLITS
  RELEASE_NOTES = {
      "1.0.0": "Initial release.",
      "1.1.0": "A test split: hash buckets 5-9 of 100, taken out of train; "
               "validation (buckets 0-4) is unchanged.",
  }
  BUILDER_CONFIGS = [
      TfxGccTranslateConfig(language=lang, description=f"English -> {lang}")
      for lang in LANGUAGES
  ]

  def _info(self):
    lang = self.builder_config.language
    return tfds.core.DatasetInfo(
        builder=self,
        description=__doc__,
        features=tfds.features.Translation(languages=("en", lang)),
        supervised_keys=("en", lang),
        homepage="https://packages.debian.org/bookworm/gcc-12-locales",
    )

  def _split_generators(self, dl_manager):
    lang = self.builder_config.language
    path = find_catalog(lang, os.fspath(dl_manager.download_dir))
    pairs, stats = catalog_pairs(path)
    logging.info("Read %s: %s", path, dict(stats))
    by_split = {split: [] for split in SPLITS}
    for source, target in pairs:
      by_split[split_of(source)].append((source, target))
    return {split: self._generate_examples(items)
            for split, items in by_split.items()}

  def _generate_examples(self, items) -> Iterator:
    lang = self.builder_config.language
    for source, target in items:
      key = hashlib.sha256(f"{source}\x00{target}".encode()).hexdigest()
      yield key, {"en": source, lang: target}
