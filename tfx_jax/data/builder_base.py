"""Base class of the embedded TFDS builders (array_record, no TensorFlow)."""

import inspect

from etils import epath
import tensorflow_datasets as tfds


class PackageBuilder(tfds.core.GeneratorBasedBuilder):
  """A GeneratorBasedBuilder that lives in this package rather than in TFDS.

  TFDS locates a builder's source file through `importlib_resources` for classes
  defined in a package; that backport is not a dependency of this project, and
  the builders here have no checksum or metadata files next to them anyway. The
  file is found with `inspect` instead (what TFDS itself falls back to). The
  rest of the build (`download_and_prepare(file_format="array_record")`) is
  stock TFDS, which writes array_record shards without TensorFlow.
  """

  @tfds.core.utils.classproperty
  @classmethod
  def code_path(cls) -> epath.Path | None:
    try:
      return epath.Path(inspect.getfile(cls))
    except (TypeError, OSError):
      return None
