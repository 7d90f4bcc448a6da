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
    BLOCK_DTYPES,
    FORMAT_VERSION,
    INDEX_FILENAME,
    ExpertBank,
    ExpertPart,
    Index,
    ShardEntry,
    TensorEntry,
)
from .gguf_convert import GGUF_SIDE_FILES, convert_gguf
from .gguf_source import ARCHITECTURES as GGUF_ARCHITECTURES
from .gguf_tokenizer import gguf_tokenizer_config, gguf_tokenizer_json
from .reader import FTWReader
from .writer import FTWWriter

__all__ = [
    "ALIGNMENT", "BLOCK_DTYPES", "FAMILIES", "FORMAT_VERSION", "GGUF_ARCHITECTURES", "GGUF_SIDE_FILES", "INDEX_FILENAME",
    "CorruptIndexError", "CorruptShardError",
    "ExpertBank", "ExpertPart", "FTWError", "FTWReader", "FTWWriter", "Index", "ShardEntry", "SourceError",
    "TensorEntry", "UnsupportedArchitectureError", "UnsupportedVersionError", "WriterStateError",
    "convert_checkpoint", "convert_gguf", "family_for_config", "gguf_tokenizer_config", "gguf_tokenizer_json",
    "load_config",
]
