"""What a compiled program does per step, read from its optimised HLO text.

XLA's own ``cost_analysis()`` counts the body of a ``while`` loop once, and
every scanned layer stack is one such loop (``model.scan_layers``): for a
32-layer model it reports about 1/32 of the layers' work. Here each
computation of the module is weighted by how many times one step runs it:
the entry once, a loop's body and condition its trip count times, fusions,
reductions and async wrappers as often as the instruction that calls them.

* ``flops``: 2 x multiply-adds of every ``dot`` and ``convolution`` (XLA on TPU
  writes matrix products as convolutions), counting only the kernel positions
  that meet the input (padding contributes nothing), as XLA's
  HloCostAnalysis counts them. Custom kernels (the splash attention kernel)
  are opaque here: their work is not in this count.
* ``bytes_accessed``: the bytes each top-level instruction (a fusion, a
  product, a copy, a collective; not the bookkeeping of tuples and
  parameters) reads and writes in device memory.
* ``collectives``: each all-gather, reduce-scatter, all-reduce, all-to-all,
  ragged-all-to-all and collective-permute with its buffer size and group
  size (a ragged-all-to-all's is its operand, the most it can send: how many
  of its rows it sends is known only when it runs). On TPU a
  reduce-scatter is emitted as a fusion named ``all-reduce-scatter`` around an
  all-reduce; it is counted as the reduce-scatter it is. An all-reduce whose
  every use reads only one slice of it (1/k of it, k > 1 dividing the group:
  a dynamic-slice by partition) is a reduce-scatter, over k devices, that the
  compiler runs as a whole all-reduce: libtpu 0.0.42.1 does so over all the
  chips of a square slice (v5e-16's 4x4, v5e-64's 8x8), even for an explicit
  ``psum_scatter`` (docs/scale.md). Those are counted apart
  (``sliced_all_reduces``): a whole all-reduce sends about twice the bytes
  of the reduce-scatter it stands for.

The trip count of a loop is its ``known_trip_count`` (CPU and GPU backends
record it) or else read from its condition, ``counter < N``, with the
counter's start from the loop's initial tuple and its step from the body's
``counter + c`` (XLA unrolls some loops, two iterations a trip: c = 2); a loop
whose count cannot be read counts once and is listed in
``unknown_trip_counts``.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import re

COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all",
               "ragged-all-to-all", "collective-permute")
# Bytes per element of the HLO element types.
_ITEMSIZE = {"pred": 1, "s4": 1, "u4": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1,
             "f8e4m3b11fnuz": 1, "f8e4m3fnuz": 1, "f8e5m2fnuz": 1, "s16": 2, "u16": 2,
             "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8,
             "f64": 8, "c64": 8, "c128": 16, "token": 0}
# Instructions that move no data of their own (aliases, bookkeeping, control).
_FREE = {"parameter", "get-tuple-element", "tuple", "bitcast", "constant", "while",
         "call", "conditional", "after-all", "partition-id", "replica-id", "opt-barrier",
         "add-dependency", "domain", "iota"}
_ARRAY = re.compile(r"\b([a-z][a-z0-9]*)\[([0-9,]*)\]")
_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s+\(.*\)\s+->\s+.*\{\s*$")
_CALLED = re.compile(r"\b(?:calls|to_apply|body|condition|true_computation|"
                     r"false_computation)=%?([\w.\-]+)")
_CALLED_LIST = re.compile(r"\b(?:branch_computations|called_computations)=\{([^}]*)\}")


@dataclasses.dataclass
class Instruction:
  name: str
  type_text: str  # the result type, e.g. "bf16[2048,128]{1,0}" or a tuple
  opcode: str
  operands: list[str]
  attrs: str
  literal: int | None = None  # a scalar integer constant's value; a parameter's number


@dataclasses.dataclass
class Collective:
  kind: str  # one of COLLECTIVES
  bytes: int  # the whole buffer: the gathered result, the scattered input
  group: int  # devices taking part in one group
  count: int  # times per step (loop trip counts applied)


@dataclasses.dataclass
class ProgramCounts:
  flops: float
  bytes_accessed: float
  collectives: list[Collective]
  trip_counts: dict[str, int]  # loop body -> trip count
  unknown_trip_counts: list[str]
  kernels: int = 0  # custom kernels run per step (Pallas/Mosaic: tpu_custom_call)
  # XLA's collective matmuls (windowed einsums): a product whose operand is
  # gathered, or whose result is scattered, in a loop of collective-permutes
  # overlapped with the product's pieces. {"all-gather": runs per step,
  # "reduce-scatter": runs per step}; their permutes are among the collectives.
  collective_matmuls: dict[str, int] = dataclasses.field(default_factory=dict)
  # All-reduces read only through this device's 1/n slice (module docstring):
  # {"count": runs per step, "bytes": their buffers per step}, among the all-reduces.
  sliced_all_reduces: dict[str, int] = dataclasses.field(
      default_factory=lambda: {"count": 0, "bytes": 0})

  def collective_totals(self) -> dict[str, dict[str, float]]:
    """{kind: {"count": n, "bytes": sum}} per step, for every kind (0 where none)."""
    out = {kind: {"count": 0, "bytes": 0} for kind in COLLECTIVES}
    for c in self.collectives:
      out[c.kind]["count"] += c.count
      out[c.kind]["bytes"] += c.count * c.bytes
    return out


def array_shapes(type_text: str) -> list[tuple[str, tuple[int, ...]]]:
  """[(element type, dims)] of a result type (one per array of a tuple)."""
  out = []
  for dtype, dims in _ARRAY.findall(type_text):
    if dtype in _ITEMSIZE:
      out.append((dtype, tuple(int(d) for d in dims.split(",") if d)))
  return out


def type_bytes(type_text: str) -> int:
  return sum(_ITEMSIZE[t] * math.prod(d) for t, d in array_shapes(type_text))


def _split_type(rest: str) -> tuple[str, str]:
  """(result type, the text after it) of "TYPE opcode(...)..."."""
  if rest.startswith("("):
    depth = 0
    for i, ch in enumerate(rest):
      depth += ch == "("
      depth -= ch == ")"
      if depth == 0:
        return rest[:i + 1], rest[i + 1:].lstrip()
  head, _, tail = rest.partition(" ")
  return head, tail


def _parse_instruction(line: str) -> Instruction | None:
  line = line.strip()
  if line.startswith("ROOT "):
    line = line[5:]
  name, sep, rest = line.partition(" = ")
  if not sep or not name.startswith("%"):
    return None
  type_text, rest = _split_type(rest)
  match = re.match(r"([\w\-]+)\(", rest)
  if not match:
    return None
  opcode = match.group(1)
  depth, end = 0, len(rest)
  for i in range(match.end() - 1, len(rest)):
    depth += rest[i] == "("
    depth -= rest[i] == ")"
    if depth == 0:
      end = i
      break
  inside = rest[match.end():end]
  operands = re.findall(r"%([\w.\-]+)", inside)
  literal = (int(inside) if opcode in ("constant", "parameter")
             and re.fullmatch(r"-?\d+", inside) else None)
  return Instruction(name[1:], type_text, opcode, operands, rest[end + 1:], literal)


def parse_module(text: str) -> tuple[dict[str, list[Instruction]], str]:
  """({computation: instructions}, entry computation name) of HLO text."""
  computations: dict[str, list[Instruction]] = {}
  entry, current = "", None
  for line in text.splitlines():
    if current is None:
      m = _HEADER.match(line)
      if m:
        current = m.group(2)
        computations[current] = []
        if m.group(1):
          entry = current
      continue
    if line.strip() == "}":
      current = None
      continue
    inst = _parse_instruction(line)
    if inst is not None:
      computations[current].append(inst)
  return computations, entry


def _called(inst: Instruction) -> list[str]:
  names = _CALLED.findall(inst.attrs)
  for group in _CALLED_LIST.findall(inst.attrs):
    names += re.findall(r"%?([\w.\-]+)", group)
  return names


def _tuple_index(inst: Instruction) -> int | None:
  m = re.search(r"\bindex=(\d+)", inst.attrs)
  return int(m.group(1)) if m else None


def _trip_count(inst: Instruction, caller: list[Instruction], computations) -> int | None:
  """A loop's trip count: its ``known_trip_count``, or ``counter < N`` read
  from its condition with the counter's start (the while's initial tuple) and
  step (the body's ``counter + c``; XLA's loop unrolling makes c > 1)."""
  known = re.search(r'known_trip_count[^0-9]*"?n"?\s*:\s*"?(\d+)', inst.attrs)
  if known:
    return int(known.group(1))
  cond = re.search(r"condition=%?([\w.\-]+)", inst.attrs)
  body = re.search(r"body=%?([\w.\-]+)", inst.attrs)
  cond_insts = computations.get(cond.group(1), []) if cond else []
  by_name = {i.name: i for i in cond_insts}
  root = cond_insts[-1] if cond_insts else None
  if root is None or root.opcode != "compare" or "direction=LT" not in root.attrs:
    return None
  counter = by_name.get(root.operands[0]) if len(root.operands) == 2 else None
  bound = by_name.get(root.operands[1]) if len(root.operands) == 2 else None
  if bound is None or bound.opcode != "constant" or bound.literal is None:
    return None
  k = _tuple_index(counter) if counter is not None and (
      counter.opcode == "get-tuple-element") else None
  start, step = 0, 1
  if k is not None:
    caller_by_name = {i.name: i for i in caller}
    init = caller_by_name.get(inst.operands[0]) if inst.operands else None
    if init is not None and init.opcode == "tuple" and k < len(init.operands):
      first = caller_by_name.get(init.operands[k])
      if first is not None and first.opcode == "constant" and first.literal is not None:
        start = first.literal
    body_insts = computations.get(body.group(1), []) if body else []
    body_by_name = {i.name: i for i in body_insts}
    body_root = body_insts[-1] if body_insts else None
    if body_root is not None and body_root.opcode == "tuple" and k < len(body_root.operands):
      update = body_by_name.get(body_root.operands[k])
      if update is not None and update.opcode == "add":
        for o in update.operands:
          c = body_by_name.get(o)
          if c is not None and c.opcode == "constant" and c.literal:
            step = c.literal
  return max(0, -(-(bound.literal - start) // step))


def multiplicities(computations, entry) -> tuple[dict[str, int], dict[str, int], list[str]]:
  """(times each computation runs per step, loop trip counts, loops of unknown
  count); a loop's body runs its trip count times per run of the loop, which
  runs as often as the computation holding it (``times[loop body]`` /
  ``trips[loop body]``)."""
  times: dict[str, int] = collections.defaultdict(int)
  trips, unknown = {}, []
  order, seen = [], set()

  def visit(name):  # callers before callees
    if name in seen or name not in computations:
      return
    seen.add(name)
    for inst in computations[name]:
      for callee in _called(inst):
        visit(callee)
    order.append(name)

  visit(entry)
  times[entry] = 1
  for name in reversed(order):
    for inst in computations[name]:
      factor = 1
      if inst.opcode == "while":
        n = _trip_count(inst, computations[name], computations)
        body = re.search(r"body=%?([\w.\-]+)", inst.attrs)
        if n is None:
          unknown.append(body.group(1) if body else inst.name)
          n = 1
        elif body:
          trips[body.group(1)] = n
        factor = n
      for callee in _called(inst):
        times[callee] += times[name] * factor
  return dict(times), trips, unknown


def _conv_valid_positions(window: str, lhs_spatial: list[int]) -> list[int]:
  """Per spatial dimension, the (output, kernel) position pairs that read a
  real (not padded, not dilation-hole) input element."""
  fields = dict(re.findall(r"(\w+)=([\w_x\-]+)", window))
  sizes = [int(s) for s in fields.get("size", "").split("x") if s]
  n = len(sizes)
  stride = [int(s) for s in fields.get("stride", "1" + "x1" * (n - 1)).split("x")]
  pads = [tuple(int(v) for v in p.split("_")) for p in
          fields.get("pad", "x".join(["0_0"] * n)).split("x")]
  lhs_dil = [int(s) for s in fields.get("lhs_dilate", "1" + "x1" * (n - 1)).split("x")]
  rhs_dil = [int(s) for s in fields.get("rhs_dilate", "1" + "x1" * (n - 1)).split("x")]
  out = []
  for d in range(n):
    size_in = (lhs_spatial[d] - 1) * lhs_dil[d] + 1
    padded = size_in + pads[d][0] + pads[d][1]
    span = (sizes[d] - 1) * rhs_dil[d] + 1
    outputs = max(0, (padded - span) // stride[d] + 1)
    valid = 0
    for o in range(outputs):
      for w in range(sizes[d]):
        i = o * stride[d] + w * rhs_dil[d] - pads[d][0]
        if 0 <= i < size_in and i % lhs_dil[d] == 0:
          valid += 1
    out.append(valid)
  return out


def _product_flops(inst: Instruction, shapes: dict[str, tuple]) -> float:
  """2 x multiply-adds of a dot or convolution (0 for anything else)."""
  out = array_shapes(inst.type_text)
  if not out or len(inst.operands) < 2:
    return 0.0
  out_dims = out[0][1]
  lhs = shapes.get(inst.operands[0])
  rhs = shapes.get(inst.operands[1])
  if lhs is None or rhs is None:
    return 0.0
  if inst.opcode == "dot":
    m = re.search(r"lhs_contracting_dims=\{([0-9,]*)\}", inst.attrs)
    contracted = [int(d) for d in m.group(1).split(",") if d] if m else []
    return 2.0 * math.prod(out_dims) * math.prod(lhs[d] for d in contracted)
  labels = re.search(r"dim_labels=([\w]+)_([\w]+)->([\w]+)", inst.attrs)
  if not labels:
    return 0.0
  lhs_l, rhs_l, out_l = labels.groups()
  window = re.search(r"window=\{([^}]*)\}", inst.attrs)
  spatial_keys = sorted({c for c in lhs_l if c.isdigit()}, key=int)
  lhs_spatial = [lhs[lhs_l.index(k)] for k in spatial_keys]
  valid = (_conv_valid_positions(window.group(1), lhs_spatial) if window and spatial_keys
           else [])
  in_features = rhs[rhs_l.index("i")]
  batch = out_dims[out_l.index("b")]
  features = out_dims[out_l.index("f")]
  return 2.0 * batch * features * in_features * math.prod(valid)


def _group_size(attrs: str, num_devices: int) -> int:
  mesh = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", attrs)
  if mesh:
    sizes = dict((k, int(v)) for k, v in re.findall(r"'(\w+)'=(\d+)", mesh.group(1)))
    return math.prod(sizes[a] for a in re.findall(r"'(\w+)'", mesh.group(2)))
  iota = re.search(r"replica_groups=\[(\d+),(\d+)\]<=", attrs)
  if iota:
    return int(iota.group(2))
  listed = re.search(r"replica_groups=\{\{([0-9,]*)\}", attrs)
  if listed:
    return len([d for d in listed.group(1).split(",") if d])
  pairs = re.search(r"source_target_pairs=\{([^}]*(?:\}[^}]*)*)\}", attrs)
  if pairs:
    return 2
  return num_devices


def _collective_kind(inst: Instruction, computation: str) -> str | None:
  op = inst.opcode
  for kind in COLLECTIVES:
    if op in (kind, f"{kind}-start"):
      if kind == "all-reduce" and computation.startswith("all-reduce-scatter"):
        return "reduce-scatter"
      return kind
  return None


def _fused_traffic(insts: list[Instruction]) -> tuple[dict[int, int], int | None]:
  """How much of each operand a fused computation reads, where it reads less
  than the whole, and how much it writes, where less than its result: a
  parameter read only through dynamic-slices reads their slices; the buffer
  a dynamic-update-slice root updates in place (a scanned layer's slot in a
  stacked [layers, ...] array) is neither read nor rewritten whole, only the
  update is written. ({parameter number: bytes read}, bytes written or None)."""
  users: dict[str, list[Instruction]] = collections.defaultdict(list)
  for inst in insts:
    for o in inst.operands:
      users[o].append(inst)
  sizes = {inst.name: type_bytes(inst.type_text) for inst in insts}
  root = insts[-1] if insts else None
  written = None
  if root is not None and root.opcode == "dynamic-update-slice" and len(root.operands) > 1:
    written = sizes.get(root.operands[1], 0)
  reads: dict[int, int] = {}
  for inst in insts:
    if inst.opcode != "parameter" or inst.literal is None:
      continue
    used = users.get(inst.name, [])
    if used and all(u.opcode == "dynamic-slice" and u.operands[0] == inst.name for u in used):
      reads[inst.literal] = sum(sizes[u.name] for u in used)
    elif written is not None and used == [root] and root.operands[0] == inst.name:
      reads[inst.literal] = 0
  return reads, written


def _traffic(inst: Instruction, sizes: dict[str, int], traffic) -> int:
  """Bytes an instruction reads and writes in device memory (``_fused_traffic``
  for the slices and in-place updates of fusions and of the ops themselves)."""
  operands = [sizes.get(o, 0) for o in inst.operands]
  written = sizes[inst.name]
  if inst.opcode == "dynamic-slice":
    return 2 * written
  if inst.opcode == "dynamic-update-slice" and len(operands) > 1:
    return 2 * operands[1] + sum(operands[2:])
  if inst.opcode == "fusion":
    callee = next(iter(_called(inst)), None)
    reads, out = traffic.get(callee, ({}, None))
    operands = [reads.get(k, b) for k, b in enumerate(operands)]
    written = written if out is None else out
  return written + sum(operands)


def _read_as_slice(value: str, size: int, group: int, users, sizes, traffic) -> bool:
  """Whether every use of ``value`` (``size`` bytes) reads one slice of it, the
  same 1/k for some k > 1 dividing ``group``, through a dynamic-slice, itself or
  inside a fusion (``_fused_traffic``)."""
  used = users.get(value, [])
  read = set()
  for u in used:
    if u.opcode == "dynamic-slice" and u.operands[0] == value:
      read.add(sizes.get(u.name, 0))
    elif u.opcode == "fusion":
      reads, _ = traffic.get(next(iter(_called(u)), None), ({}, None))
      read.update(reads.get(k, size) for k, o in enumerate(u.operands) if o == value)
    else:
      return False
  if len(read) != 1:
    return False
  part = read.pop()
  return 0 < part < size and size % part == 0 and group % (size // part) == 0


def _sliced_all_reduce(inst: Instruction, group: int, users, sizes, traffic) -> int:
  """The bytes of an all-reduce (or all-reduce-start) whose every result is read
  only as one slice of it (``_read_as_slice``); 0 otherwise."""
  result = inst
  if inst.opcode == "all-reduce-start":
    done = [u for u in users.get(inst.name, []) if u.opcode == "all-reduce-done"]
    if len(done) != 1:
      return 0
    result = done[0]
  if len(array_shapes(result.type_text)) == 1:
    values = [result.name]
  else:
    values = [u.name for u in users.get(result.name, [])]
    if any(u.opcode != "get-tuple-element" for u in users.get(result.name, [])):
      return 0
  if group <= 1 or not values or not all(
      _read_as_slice(v, sizes.get(v, 0), group, users, sizes, traffic) for v in values):
    return 0
  return sum(sizes.get(v, 0) for v in values)


def count_program(text: str, num_devices: int) -> ProgramCounts:
  """FLOPs, bytes accessed and collectives of one step of a compiled module."""
  computations, entry = parse_module(text)
  times, trips, unknown = multiplicities(computations, entry)
  fused = {callee for insts in computations.values() for i in insts
           if i.opcode == "fusion" for callee in _called(i)}
  traffic = {name: _fused_traffic(computations[name]) for name in fused
             if name in computations}
  flops = bytes_accessed = 0.0
  kernels = 0
  found: dict[tuple, Collective] = {}
  sliced = {"count": 0, "bytes": 0}
  for name, insts in computations.items():
    n = times.get(name, 0)
    if not n:
      continue
    shapes = {}
    for inst in insts:
      arrays = array_shapes(inst.type_text)
      if len(arrays) == 1:
        shapes[inst.name] = arrays[0][1]
    sizes = {inst.name: type_bytes(inst.type_text) for inst in insts}
    users: dict[str, list[Instruction]] = collections.defaultdict(list)
    for inst in insts:
      for o in inst.operands:
        users[o].append(inst)
    for inst in insts:
      if inst.opcode in ("dot", "convolution"):
        flops += n * _product_flops(inst, shapes)
      if inst.opcode == "custom-call" and 'custom_call_target="tpu_custom_call"' in inst.attrs:
        kernels += n
      if name not in fused and inst.opcode not in _FREE and not inst.opcode.endswith("-done"):
        bytes_accessed += n * _traffic(inst, sizes, traffic)
      kind = _collective_kind(inst, name)
      if kind is None:
        continue
      operand_bytes = sum(sizes.get(o, 0) for o in inst.operands)
      result = type_bytes(inst.type_text)
      if inst.opcode.endswith("-start"):  # (operands, results, ...) tuples
        result = result - operand_bytes if result > operand_bytes else result
      size = {"all-gather": result, "reduce-scatter": operand_bytes}.get(kind, max(
          result, operand_bytes) if kind != "all-reduce" else operand_bytes or result)
      if kind == "ragged-all-to-all":  # its operand (then the output buffer, offsets, sizes)
        size = sizes.get(inst.operands[0], 0)
      group = _group_size(inst.attrs, num_devices)
      if kind == "all-reduce" and inst.opcode in ("all-reduce", "all-reduce-start"):
        whole = _sliced_all_reduce(inst, group, users, sizes, traffic)
        if whole:
          sliced["count"] += n
          sliced["bytes"] += n * whole
      key = (kind, size, group)
      if key in found:
        found[key].count += n
      else:
        found[key] = Collective(kind, size, group, n)
  matmuls = {"all-gather": 0, "reduce-scatter": 0}
  for body, n in trips.items():
    for kind, tag in (("all-gather", "windowed_dot_general_body_ag"),
                      ("reduce-scatter", "windowed_dot_general_body_rs")):
      if tag in body and n:
        matmuls[kind] += times.get(body, 0) // n
  return ProgramCounts(flops, bytes_accessed, list(found.values()), trips, unknown, kernels,
                       matmuls, sliced)

