"""The ``npz`` data source kind: a NumPy ``.npz`` file's arrays, split by
``split_arrays``."""

from __future__ import annotations

from pathlib import Path

import attrs
import numpy as np

from beatloop import DataError, DataSource, DataSplit, SourceConfig
from beatloop.datasets import split_arrays


@attrs.frozen
class NpzConfig(SourceConfig):
    """``keys``: the arrays to use (by default every array in the file)."""

    keys: tuple[str, ...] = ()


class NpzSource(DataSource):
    """A NumPy .npz file: every array (or those in keys) becomes the batch key of its
    name; float64 arrays become float32. All arrays have one example per row."""

    name = "npz"
    Config = NpzConfig

    def load(self, seed: int, batch_size: int) -> DataSplit:
        path = Path(self.path)
        if not path.is_file():
            what = "a folder, not a file" if path.is_dir() else "not there"
            raise DataError(f"data source {self.label!r}: {self.path!r} is {what}")
        try:
            with np.load(path, allow_pickle=False) as archive:
                names = list(self.config.keys) or list(archive.files)
                absent = [name for name in names if name not in archive.files]
                if absent:
                    raise DataError(
                        f"data source {self.label!r}: the file has no array(s) {absent}; it "
                        f"holds {archive.files}"
                    )
                arrays = {name: archive[name] for name in names}
        except DataError:
            raise
        except (OSError, ValueError) as error:
            raise DataError(
                f"data source {self.label!r}: not a readable .npz file: {error}"
            ) from None
        if not arrays:
            raise DataError(f"data source {self.label!r}: the file holds no arrays")
        arrays = {
            name: value.astype(np.float32) if value.dtype == np.float64 else value
            for name, value in arrays.items()
        }
        return split_arrays(arrays, self.config, seed, batch_size, self.label)

    def files(self) -> list[Path]:
        """The .npz file."""
        return [Path(self.path)] if Path(self.path).is_file() else []
