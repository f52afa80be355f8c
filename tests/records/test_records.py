"""The records on disk: one serializer from type hints (``records.serial``),
and report.json, sweep.json and status.json written by it exactly as the
hand-written writers before it wrote them."""

from __future__ import annotations

import dataclasses
import glob
import json
import math
import pathlib
from typing import Annotated, Any, Literal

import pytest

from tfx_jax.records import serial
from tfx_jax.records import status as status_lib
from tfx_jax.records import sweep as sweep_record
from tfx_jax.report import schema
from tfx_jax.report.claims import ClaimResult
import records_written

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "records"


def dumped(data: Any) -> str:
  """A file's text as ``core.atomic.write_json`` writes it."""
  return json.dumps(data, indent=2, default=str) + "\n"


# ------------------------------------------------------------- the forms
@dataclasses.dataclass(frozen=True)
class Inner:
  name: str
  weight: float = 1.0


Colour = Literal["red", "green"]
Doubled = Annotated[int, serial.Form(lambda v: 2 * v, lambda v: v // 2)]


@dataclasses.dataclass(frozen=True)
class Every:
  inner: Inner
  maybe: Inner | None
  pair: tuple[int, str]
  many: tuple[float, ...]
  items: list[Inner]
  by_name: dict[str, int]
  by_seed: dict[int, float | None]
  colour: Colour
  flag: bool
  count: int
  ratio: float
  anything: Any
  doubled: Doubled
  nested: tuple[tuple[int, int], ...] = ()
  note: str = ""


EVERY = Every(inner=Inner("a", 0.5), maybe=None, pair=(1, "x"), many=(1.5, 2, math.inf),
              items=[Inner("b"), Inner("c", 3.0)], by_name={"k": 1}, by_seed={0: 1.0, 3: None},
              colour="green", flag=False, count=7, ratio=-math.inf,
              anything={"lr": [1e-3, 3e-3]}, doubled=21, nested=((0, 1),), note="n")


def test_every_type_form_round_trips_through_json_text():
  data = serial.to_json(EVERY)
  assert data == {"inner": {"name": "a", "weight": 0.5}, "maybe": None, "pair": [1, "x"],
                  "many": [1.5, 2, math.inf],
                  "items": [{"name": "b", "weight": 1.0}, {"name": "c", "weight": 3.0}],
                  "by_name": {"k": 1}, "by_seed": {"0": 1.0, "3": None}, "colour": "green",
                  "flag": False, "count": 7, "ratio": -math.inf,
                  "anything": {"lr": [1e-3, 3e-3]}, "doubled": 42, "nested": [[0, 1]],
                  "note": "n"}
  text = dumped(data)
  # Infinities and NaN as Python's json writes them, and reads them back.
  assert '"ratio": -Infinity' in text and "Infinity\n" in text
  again = serial.from_json(Every, json.loads(text))
  assert again == EVERY
  # JSON's string keys back to ints; an int stays the number the file has.
  assert list(again.by_seed) == [0, 3] and again.many[1] == 2 and type(again.many[1]) is int
  nan = serial.from_json(Inner, json.loads(dumped(serial.to_json(Inner("x", math.nan)))))
  assert math.isnan(nan.weight)


def test_a_key_the_file_lacks_takes_the_default_and_an_unknown_key_is_ignored():
  assert serial.from_json(Inner, {"name": "a", "written_later": 1}) == Inner("a", 1.0)


@pytest.mark.parametrize("change, message", [
    ({"count": "7"}, r"Every: count: an integer, got a string '7'\."),
    ({"count": True}, r"Every: count: an integer, got a boolean True\."),
    ({"ratio": None}, r"Every: ratio: a number, got null None\."),
    ({"colour": "blue"}, r"Every: colour: 'blue' is not one of \['red', 'green'\]\."),
    ({"pair": [1]}, r"Every: pair: 2 values, got 1: \[1\]\."),
    ({"items": [{"name": "b"}, {"name": 3}]}, r"Every: items\[1\]\.name: a string, got"),
    ({"by_seed": {"zero": 1.0}}, r"Every: by_seed\['zero'\]: the key 'zero' is not an integer"),
    ({"maybe": {"weight": 2.0}}, r"Every: maybe\.name: missing\."),
    ({"flag": 0}, r"Every: flag: true or false, got an integer 0\."),
    ({"many": {"a": 1}}, r"Every: many: a list, got an object"),
])
def test_a_wrong_value_is_refused_naming_its_field(change, message):
  data = {**serial.to_json(EVERY), **change}
  with pytest.raises(serial.RecordError, match=message):
    serial.from_json(Every, data)


@serial.layout(order=("b", "total", "a", "span"), keys={"b": "B"}, flat=("span",),
               omit_none=("a",), written={"b": lambda v: round(v, 1)},
               derived={"total": lambda r: r.b + (r.a or 0)})
@dataclasses.dataclass(frozen=True)
class Laid:
  a: int | None
  b: float
  span: Inner


def test_a_layout_orders_renames_flattens_omits_rounds_and_derives():
  record = Laid(None, 2.04, Inner("s"))
  assert list(serial.to_json(record).items()) == [
      ("B", 2.0), ("total", 2.04), ("name", "s"), ("weight", 1.0)]
  assert serial.from_json(Laid, serial.to_json(record)) == Laid(None, 2.0, Inner("s"))
  assert serial.to_json(Laid(3, 1.0, Inner("s")))["a"] == 3
  with pytest.raises(TypeError, match="not its fields"):
    serial.layout(order=("a",))(Inner)


@serial.layout(omit_default=("flag", "names"))
@dataclasses.dataclass(frozen=True)
class Flagged:
  name: str
  flag: bool = False
  names: tuple[str, ...] = ()


def test_a_field_at_its_default_may_be_left_out_and_reads_back_as_it():
  assert serial.to_json(Flagged("a")) == {"name": "a"}
  assert serial.to_json(Flagged("a", True, ("b",))) == {"name": "a", "flag": True,
                                                       "names": ["b"]}
  for record in (Flagged("a"), Flagged("a", True), Flagged("a", names=("b",))):
    assert serial.from_json(Flagged, serial.to_json(record)) == record
  with pytest.raises(TypeError, match=r"omits \['name'\] at their defaults"):
    serial.layout(omit_default=("name",))(Inner)


@dataclasses.dataclass(frozen=True)
class Versioned:
  name: str
  sizes: tuple[int, ...]


def _named(data):
  """Version 0 called it ``title``."""
  if "title" in data:
    data["name"] = data.pop("title")


def _sizes(data):
  """Version 1 had one ``size``."""
  if "sizes" not in data:
    data["sizes"] = [data.pop("size")]


serial.versioned(Versioned, "versioned.json", (_named, _sizes))


def test_a_kind_s_migrations_bring_every_older_file_to_the_current_shape():
  assert serial.kind(Versioned).version == 2
  oldest = {"title": "a", "size": 3}
  assert serial.from_json(Versioned, oldest) == Versioned("a", (3,))
  assert oldest == {"title": "a", "size": 3}  # the caller's data is not changed
  assert serial.from_json(Versioned, {"name": "a", "size": 3}) == Versioned("a", (3,))
  current = serial.to_json(Versioned("a", (3, 4)))
  assert serial.from_json(Versioned, current) == Versioned("a", (3, 4))
  # A file that states a version runs only the migrations above it.
  assert serial.from_json(Versioned, {"version": 1, "name": "a", "size": 5}).sizes == (5,)
  with pytest.raises(serial.RecordError, match=r"versioned.json: sizes\[0\]: an integer"):
    serial.from_json(Versioned, {"name": "a", "sizes": ["3"]})


# ------------------------------------------------------------ report.json
REPORTS = sorted(glob.glob(str(ROOT / "docs" / "results" / "*" / "report.json")))
# What reading and writing a committed report adds to one an earlier version
# wrote, as the hand-written reader and writer did: per seed its ``training``
# signals, per comparison its ``base_index``, the report's evaluation effects
# and layer profiles, and a point's ``stale`` flag where its confirmation ran
# at another value than it chose (written only where true), and each compute
# row's evaluations' time over its train steps' (derived from its phases).
ADDED = ("training", "base_index", "evaluation_effects", "layer_profiles", "stale",
         "eval_per_train_step")


def _eval_ratio(row: dict) -> float | None:
  """A compute row's ``eval_per_train_step`` as its phases give it."""
  train = row["phases"].get("train_steps", 0.0)
  return round(row["phases"].get("evaluations", 0.0) / train, 4) if train > 0 else None


def _without_added(written: Any, original: Any) -> Any:
  """``written`` less the ``ADDED`` keys ``original`` did not have."""
  if isinstance(written, dict) and isinstance(original, dict):
    return {k: _without_added(v, original.get(k)) for k, v in written.items()
            if k in original or k not in ADDED}
  if isinstance(written, list) and isinstance(original, list):
    return [_without_added(w, o) for w, o in zip(written, original)]
  return written


def _added(written: Any, original: Any, found: set) -> set:
  """``found`` with (key, its value as JSON) of each key ``written`` has and
  ``original`` lacks; a base index's value as "index" (it is the data's), a
  compute row's evaluations' ratio as "phases' ratio" where its phases give it."""
  if isinstance(written, dict) and isinstance(original, dict):
    for k, v in written.items():
      if k not in original:
        if k == "eval_per_train_step" and v == _eval_ratio(written):
          found.add((k, "phases' ratio"))
          continue
        found.add((k, "index" if k == "base_index" else json.dumps(v)))
      else:
        _added(v, original[k], found)
  elif isinstance(written, list) and isinstance(original, list):
    for w, o in zip(written, original):
      _added(w, o, found)
  return found


def _outside_the_schema(data: dict) -> dict:
  """Popped from ``data``, in their order: the keys after the schema's that
  are not ``schema.Report``'s, each section's own record
  (``assemble.report_json``: a ``tune_at`` sweep's ``provenance``) and then
  the claims' labels."""
  fields = {f.name for f in dataclasses.fields(schema.Report)}
  keys = list(data)
  while keys and keys[-1] not in fields:
    keys.pop()
  return {k: data.pop(k) for k in list(data)[len(keys):]}


@pytest.mark.parametrize("path", REPORTS, ids=lambda p: pathlib.Path(p).parent.name)
def test_every_committed_report_reads_and_writes_back_as_it_was(path):
  """Byte for byte, where the current version wrote it; one an earlier
  version wrote gains only the keys it lacked (``ADDED``), each at its place,
  everything else (keys, order, values) as it was. The claims' labels
  (``claims``, outside the schema) are written after it and read back as
  ``ClaimResult``s unchanged."""
  text = pathlib.Path(path).read_text()
  original = json.loads(text)
  outside = _outside_the_schema(original)
  claims = outside.get("claims")
  if claims is not None:
    assert list(json.loads(text))[-1] == "claims"
    assert [serial.to_json(serial.from_json(ClaimResult, c)) for c in claims] == claims
  report = schema.Report.from_json(original)
  written = report.to_json()
  assert _added(written, original, set()) <= {
      ("training", "{}"), ("base_index", "index"), ("evaluation_effects", "[]"),
      ("layer_profiles", "[]"), ("stale", "true"), ("eval_per_train_step", "phases' ratio")}
  expected = {**_without_added(written, original), **outside}
  assert dumped(expected) == text
  assert schema.Report.from_json(json.loads(dumped(written))) == report


def test_an_older_report_s_stale_confirmation_reads_as_stale():
  """The committed reports whose points kept a confirmation at a value chosen
  before (the optimizers sweep's Muon at d_model 64: confirmed at Adam ratio
  3, ratio 10 chosen after its grid was widened) read as stale, and only those."""
  stale = {}
  for path in REPORTS:
    for point in schema.Report.from_json(json.loads(pathlib.Path(path).read_text())).points:
      assert point.stale == (point.confirmed is not None and point.confirmed != point.chosen)
      if point.stale:
        stale.setdefault(pathlib.Path(path).parent.name, []).append(
            (point.confirmed, point.chosen))
  assert stale == {"optimizers": [
      ({"optim.learning_rate": 0.01, "optim.adam_learning_rate_ratio": 3.0},
       {"optim.learning_rate": 0.01, "optim.adam_learning_rate_ratio": 10.0})]}


def test_the_current_reports_are_written_back_byte_for_byte():
  current = [p for p in REPORTS if "layer_profiles" in json.loads(pathlib.Path(p).read_text())
             and all("training" in s for pt in json.loads(pathlib.Path(p).read_text())["points"]
                     for t in pt["tuned"] for s in t["seeds"].values())]
  assert len(current) >= 4
  for path in current:
    text = pathlib.Path(path).read_text()
    data = json.loads(text)
    # The fields of sections outside the schema (a tuned ladder's provenance)
    # and the claims' labels follow the schema's keys (the test above reads them).
    outside = _outside_the_schema(data)
    assert dumped({**schema.Report.from_json(data).to_json(), **outside}) == text, path


def test_a_report_s_migrations_change_nothing_on_a_current_file():
  data = json.loads(pathlib.Path(REPORTS[0]).read_text())
  current = schema.Report.from_json(data).to_json()
  for migrate in serial.kind(schema.Report).migrations:
    copy = json.loads(json.dumps(current))
    migrate(copy)
    assert copy == current, migrate.__name__


def test_a_bad_report_value_is_named_by_its_path():
  data = json.loads(pathlib.Path(REPORTS[0]).read_text())
  data["points"][1]["tuned"][0]["seeds"]["0"]["outcome"] = "meh"
  with pytest.raises(ValueError, match=r"report\.json: points\[1\]\.tuned\[0\]\.seeds\['0'\]"
                                       r"\.outcome: 'meh' is not one of \['learned'"):
    schema.Report.from_json(data)


# ----------------------------------------------- sweep.json, status.json
def test_sweep_json_is_written_as_before(tmp_path):
  """A record with every part, and a file in the first sweeps' shape read and
  written again, as the hand-written writer wrote them (``records_written``)."""
  for path in records_written.write_sweeps(tmp_path):
    text = records_written.normalised(path.read_text())
    assert text == (FIXTURES / f"{path.parent.name}.sweep.json").read_text(), path
    again = sweep_record.read(path.parent)
    assert sweep_record.SweepRecord.from_json(again.to_json()) == again


def test_status_json_is_written_as_before(tmp_path):
  """Each status the trainer and the sweep write, as before; the one change:
  a status written once the step compiled has its fields in the record's
  order, ``num_params`` before ``compile_seconds`` (the trainer's call had
  them the other way round), as every later status of the run has them."""
  for path in records_written.write_statuses(tmp_path):
    text = records_written.normalised(path.read_text())
    before = (FIXTURES / f"{path.parent.name}.status.json").read_text()
    if path.parent.name == "compiled":
      assert json.loads(text) == json.loads(before) and text != before
      assert list(json.loads(text)) == ["state", "step", "reason", "updated", "num_params",
                                        "compile_seconds", "seconds", "cores"]
    else:
      assert text == before, path
    read = status_lib.read_status(path.parent)
    assert dumped(serial.to_json(read)) == path.read_text()


# --------------------------------------------------------- a run's summary
def test_a_run_s_summary_is_a_typed_record_of_the_keys_the_report_reads(tmp_path):
  """``collect.read_run``: status.json's figures, else the sweep entry's,
  under the names the report reads."""
  from tfx_jax.report import collect  # pylint: disable=import-outside-toplevel
  entry = sweep_record.RunEntry("r_s0", 0, (), {}, wall_seconds=12.0, compile_seconds=1.5)
  status_lib.write_status(tmp_path, "finished", 30, num_params=1000, cores=2,
                          seconds={"train_steps": 8.0})
  run = collect.read_run(tmp_path, entry)
  assert (run.state, run.step, run.num_params, run.cores, run.seconds) == (
      "finished", 30, 1000, 2, {"train_steps": 8.0})
  assert (run.wall_seconds, run.compile_seconds, run.final, run.lengths) == (12.0, 1.5, {}, {})
  assert run.step_seconds == 8.0 / 30  # the train steps' phase over the steps
  assert [f.name for f in dataclasses.fields(run)] == [
      "state", "step", "final", "initial", "curves", "tokens_per_sec", "wall_seconds",
      "compile_seconds", "lengths", "window_tokens", "scaled_lengths", "lengths_split",
      "layer_stats", "layer_stats_step", "training", "test", "num_params", "budgets", "seconds",
      "cores", "step_seconds", "train_step_memory", "peak_rss_bytes"]
  unstarted = collect.read_run(tmp_path / "not_started", entry)
  assert (unstarted.state, unstarted.step, unstarted.num_params, unstarted.seconds) == (
      "pending", 0, None, {})
