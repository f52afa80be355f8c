"""One serializer for every record on disk: a dataclass <-> its JSON, read
from the dataclass's type hints.

  to_json(record)        the JSON-ready value: dicts (str keys), lists, str,
                         numbers, bools and None, in the record's key order
  from_json(cls, data)   the record, each value checked against its field's
                         type (a ``RecordError`` naming the field where it is
                         not), after the migrations of older files where
                         ``cls`` is a versioned kind (``versioned``)
  layout(...)            where a record's file is not its fields in declared
                         order: keys in another order or under another name, a
                         nested record written flat, a key left out when None,
                         a value written rounded, derived values written beside
  Form(encode, decode)   a type whose file form is its own (``Annotated[T,
                         Form(...)]`` on a type, or ``form(cls, ...)``)

Types read: a dataclass (an object of its fields), ``X | None``, ``tuple[X,
...]`` and ``tuple[X, Y]`` (lists), ``list[X]``, ``dict[str, X]`` and
``dict[int, X]`` (an object; JSON keys are strings, so int keys are written as
strings and read back as ints), ``Mapping`` as ``dict``, ``Literal[...]``,
``float`` (an int is a float, as PEP 484 has it, and stays the number the file
has; NaN and infinities as Python's json writes and reads them: ``NaN``,
``Infinity``, ``-Infinity``), ``int``, ``str``, ``bool`` and ``Any`` (as it is).

Reading, as the hand-written readers did: a key the file lacks takes the
field's default (an error naming the field where it has none); a key the
record does not know is ignored, so a file a later version wrote still reads.

Versions: a kind's version is the number of its migrations. Files carry no
version (none written so far has one, and adding one would change every
file), so a file reads as version 0 and every migration runs, oldest first;
each adds only what its era's files lack, so on a newer file it changes
nothing.
"""

from __future__ import annotations

import collections.abc
import copy
import dataclasses
import functools
import types
import typing
from typing import Any, Callable, Literal, Mapping, Sequence

# Where a file may one day state its version; none does yet (see above).
VERSION_KEY = "version"


class RecordError(ValueError):
  """A file's value that its record's type does not allow, named by its path
  (``report.json: points[0].tuned[1].seeds["3"].outcome: ...``)."""


@dataclasses.dataclass(frozen=True)
class Form:
  """A file form of its own: ``encode`` the value to JSON, ``decode`` it back."""
  encode: Callable[[Any], Any]
  decode: Callable[[Any], Any]


@dataclasses.dataclass(frozen=True)
class Layout:
  """How a record's JSON object differs from its fields in declared order.

  ``order``: the keys in file order, each a field's name (or a derived key);
  empty: the fields in declared order. ``keys``: {field: its key in the file}.
  ``flat``: fields whose record's keys are written inline, in this object.
  ``omit_none``: fields left out when None (absent reads as None).
  ``omit_default``: fields left out when equal to their default (absent
  reads as the default): a flag or a listing an earlier file never had.
  ``written``: {field: its JSON value of the field's value} (e.g. rounded).
  ``derived``: {key: its value of the record}, written and never read back.
  """
  order: tuple[str, ...] = ()
  keys: Mapping[str, str] = dataclasses.field(default_factory=dict)
  flat: frozenset[str] = frozenset()
  omit_none: frozenset[str] = frozenset()
  omit_default: frozenset[str] = frozenset()
  written: Mapping[str, Callable[[Any], Any]] = dataclasses.field(default_factory=dict)
  derived: Mapping[str, Callable[[Any], Any]] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Kind:
  """A record written as a file of its own: its name (in errors) and the
  migrations of its older files, oldest first, each changing the parsed
  JSON in place. ``version``: how many there are."""
  filename: str
  migrations: tuple[Callable[[dict[str, Any]], None], ...] = ()

  @property
  def version(self) -> int:
    return len(self.migrations)


_LAYOUTS: dict[type, Layout] = {}
_FORMS: dict[type, Form] = {}
_KINDS: dict[type, Kind] = {}


def layout(order: Sequence[str] = (), keys: Mapping[str, str] | None = None,
           flat: Sequence[str] = (), omit_none: Sequence[str] = (),
           written: Mapping[str, Callable[[Any], Any]] | None = None,
           derived: Mapping[str, Callable[[Any], Any]] | None = None,
           omit_default: Sequence[str] = ()) -> Callable[[type], type]:
  """A class decorator: the record's file layout (``Layout``). Also called on
  a class defined elsewhere, ``layout(...)(cls)``, where the file is this
  module's caller's concern."""
  def register(cls: type) -> type:
    shape = Layout(tuple(order), dict(keys or {}), frozenset(flat), frozenset(omit_none),
                   frozenset(omit_default), dict(written or {}), dict(derived or {}))
    names = [f.name for f in dataclasses.fields(cls)]
    if (shape.order or shape.derived) and sorted(shape.order) != sorted(
        [*names, *shape.derived]):  # derived keys are written where the order puts them
      raise TypeError(f"{cls.__name__}: layout order {list(shape.order)} is not its fields "
                      f"{names} and derived keys {list(shape.derived)}.")
    unknown = (set(shape.keys) | shape.flat | shape.omit_none | shape.omit_default
               | set(shape.written)) - set(names)
    if unknown:
      raise TypeError(f"{cls.__name__}: layout names {sorted(unknown)}, not fields.")
    defaults = {f.name for f in dataclasses.fields(cls)
                if f.default is not dataclasses.MISSING
                or f.default_factory is not dataclasses.MISSING}
    if shape.omit_default - defaults:
      raise TypeError(f"{cls.__name__}: layout omits {sorted(shape.omit_default - defaults)} "
                      "at their defaults, which they do not have (a default or a default factory is needed).")
    _LAYOUTS[cls] = shape
    return cls
  return register


def form(cls: type, encode: Callable[[Any], Any], decode: Callable[[Any], Any]) -> None:
  """``cls``'s values are written ``encode(value)`` and read ``decode(data)``."""
  _FORMS[cls] = Form(encode, decode)


def versioned(cls: type, filename: str, migrations: Sequence[Callable[[dict], None]] = ()
              ) -> None:
  """``cls`` is the record of a file named ``filename``, whose older versions
  ``migrations`` bring to the current shape (oldest first)."""
  _KINDS[cls] = Kind(filename, tuple(migrations))


def kind(cls: type) -> Kind:
  """The registered file kind of ``cls``."""
  return _KINDS[cls]


# ------------------------------------------------------------------- write
def to_json(value: Any) -> Any:
  """``value`` (a record, or a container of them) as JSON-ready data."""
  if dataclasses.is_dataclass(value) and not isinstance(value, type):
    cls = type(value)
    if cls in _FORMS:
      return _FORMS[cls].encode(value)
    return _record_json(value)
  if isinstance(value, Mapping):
    return {str(k) if isinstance(k, int) else k: to_json(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [to_json(v) for v in value]
  return value


def _record_json(record: Any) -> dict[str, Any]:
  cls = type(record)
  shape, hints = _LAYOUTS.get(cls, Layout()), _hints(cls)
  out: dict[str, Any] = {}
  for name in shape.order or [f.name for f in dataclasses.fields(cls)]:
    if name in shape.derived:
      out[name] = to_json(shape.derived[name](record))
      continue
    value = getattr(record, name)
    if name in shape.omit_none and value is None:
      continue
    if name in shape.omit_default and value == _default(_field(cls, name)):
      continue
    if name in shape.written:
      encoded = shape.written[name](value)
    else:
      found = _form_of(hints[name])
      encoded = found.encode(value) if found and value is not None else to_json(value)
    if name in shape.flat:
      out.update(encoded)
    else:
      out[shape.keys.get(name, name)] = encoded
  return out


# -------------------------------------------------------------------- read
def from_json(cls: type, data: Any, where: str | None = None) -> Any:
  """The ``cls`` record of ``data`` (parsed JSON; not changed). A versioned
  kind's migrations run first; ``where`` names the file in errors (default:
  the kind's file name, else the class's name)."""
  found = _KINDS.get(cls)
  where = where or (found.filename if found else cls.__name__)
  if found is not None:
    if not isinstance(data, Mapping):
      raise RecordError(f"{where}: an object, got {_kind_of(data)}.")
    data = copy.deepcopy(dict(data))
    start = data.get(VERSION_KEY, 0)
    for migrate in found.migrations[start if isinstance(start, int) else 0:]:
      migrate(data)
  return _read(cls, data, where, "")


def _read(tp: Any, value: Any, where: str, path: str) -> Any:
  """``value`` read as type ``tp`` (``path``: where it is, for errors)."""
  found = _form_of(tp)
  if found is not None:
    return found.decode(value)
  origin, args = typing.get_origin(tp), typing.get_args(tp)
  if origin is typing.Annotated:
    return _read(args[0], value, where, path)
  if tp is Any:
    return value
  if origin in (typing.Union, types.UnionType):
    if value is None and type(None) in args:
      return None
    errors = []
    for arg in (a for a in args if a is not type(None)):
      try:
        return _read(arg, value, where, path)
      except RecordError as e:
        errors.append(e)
    if len(errors) == 1:
      raise errors[0]
    _fail(where, path, f"{value!r} is none of {_name(tp)}")
  if origin is Literal:
    if not any(value == a and type(value) is type(a) for a in args):  # 1 is not True
      _fail(where, path, f"{value!r} is not one of {list(args)}")
    return value
  if dataclasses.is_dataclass(tp):
    return _read_record(tp, value, where, path)
  if origin is tuple:
    _need(isinstance(value, (list, tuple)), value, "a list", where, path)
    if len(args) == 2 and args[1] is Ellipsis:
      return tuple(_read(args[0], v, where, f"{path}[{i}]") for i, v in enumerate(value))
    if len(value) != len(args):
      _fail(where, path, f"{len(args)} values, got {len(value)}: {value!r}")
    return tuple(_read(a, v, where, f"{path}[{i}]") for i, (a, v) in enumerate(zip(args, value)))
  if origin is list:
    _need(isinstance(value, (list, tuple)), value, "a list", where, path)
    return [_read(args[0], v, where, f"{path}[{i}]") for i, v in enumerate(value)]
  if origin in (dict, collections.abc.Mapping) or tp in (dict, Mapping):
    _need(isinstance(value, Mapping), value, "an object", where, path)
    key_type, item_type = args or (str, Any)
    out = {}
    for k, v in value.items():
      here = f"{path}[{k!r}]"
      if key_type is int:
        try:
          key = int(k)
        except (TypeError, ValueError):
          _fail(where, here, f"the key {k!r} is not an integer")
      else:
        key = k
      out[key] = _read(item_type, v, where, here)
    return out
  if tp is float:
    _need(isinstance(value, (int, float)) and not isinstance(value, bool), value, "a number",
          where, path)
    return value
  if tp is int:
    _need(isinstance(value, int) and not isinstance(value, bool), value, "an integer",
          where, path)
    return value
  if tp in (str, bool):
    _need(isinstance(value, tp), value, "a string" if tp is str else "true or false",
          where, path)
    return value
  if tp is type(None):
    _need(value is None, value, "null", where, path)
    return None
  raise TypeError(f"{where}: {path or 'the record'}: no JSON form for the type {_name(tp)}.")


def _read_record(cls: type, data: Any, where: str, path: str) -> Any:
  _need(isinstance(data, Mapping), data, f"an object ({cls.__name__})", where, path)
  shape, hints = _LAYOUTS.get(cls, Layout()), _hints(cls)
  values = {}
  for f in dataclasses.fields(cls):
    if not f.init:
      continue
    if f.name in shape.flat:
      values[f.name] = _read(hints[f.name], data, where, path)
      continue
    key = shape.keys.get(f.name, f.name)
    here = f"{path}.{key}" if path else key
    if key in data:
      values[f.name] = _read(hints[f.name], data[key], where, here)
    elif f.name in shape.omit_none:
      values[f.name] = None
    elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
      _fail(where, here, "missing")
  return cls(**values)


# ------------------------------------------------------------------ helpers
def _field(cls: type, name: str) -> dataclasses.Field:
  return next(f for f in dataclasses.fields(cls) if f.name == name)


def _default(field: dataclasses.Field) -> Any:
  """A field's default value (a fresh one where it has a default factory)."""
  if field.default_factory is not dataclasses.MISSING:
    return field.default_factory()
  return field.default


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
  return typing.get_type_hints(cls, include_extras=True)


def _form_of(tp: Any) -> Form | None:
  if typing.get_origin(tp) is typing.Annotated:
    return next((m for m in typing.get_args(tp)[1:] if isinstance(m, Form)), None)
  return _FORMS.get(tp) if isinstance(tp, type) else None


def _need(ok: bool, value: Any, what: str, where: str, path: str) -> None:
  if not ok:
    _fail(where, path, f"{what}, got {_kind_of(value)} {value!r}")


def _fail(where: str, path: str, message: str) -> typing.NoReturn:
  raise RecordError(f"{where}: {path or 'the record'}: {message}.")


def _kind_of(value: Any) -> str:
  return {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
          int: "an integer", float: "a number", type(None): "null"}.get(
              type(value), type(value).__name__)


def _name(tp: Any) -> str:
  return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")
