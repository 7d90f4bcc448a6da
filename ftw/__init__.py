"""FTW: ft's pre-merged, checksummed weight layout (spec: docs/FTW.md).

This package imports nothing else of ft's: the registry stores FTW files, the runtime reads them.
"""

from .convert import convert_checkpoint, load_config
from .errors import (
    CorruptIndexError,
    CorruptShardError,
    FTWError,
    SourceError,
    UnsupportedArchitectureError,
    UnsupportedVersionError,
    WriterStateError,
)
from .families import FAMILIES, family_for_config
from .format import (
    ALIGNMENT,
    FORMAT_VERSION,
    INDEX_FILENAME,
    ExpertBank,
    ExpertPart,
    Index,
    ShardEntry,
    TensorEntry,
)
from .reader import FTWReader
from .writer import FTWWriter

__all__ = [
    "ALIGNMENT", "FAMILIES", "FORMAT_VERSION", "INDEX_FILENAME", "CorruptIndexError", "CorruptShardError",
    "ExpertBank", "ExpertPart", "FTWError", "FTWReader", "FTWWriter", "Index", "ShardEntry", "SourceError",
    "TensorEntry", "UnsupportedArchitectureError", "UnsupportedVersionError", "WriterStateError",
    "convert_checkpoint", "family_for_config", "load_config",
]
