"""FTW: ft's pre-merged, checksummed weight layout (spec: docs/FTW.md).

This package imports nothing else of ft's: the registry stores FTW files, the runtime reads them.
"""

from .errors import (
    CorruptIndexError,
    CorruptShardError,
    FTWError,
    SourceError,
    UnsupportedArchitectureError,
    UnsupportedVersionError,
    WriterStateError,
)

# The rest is imported on first use (PEP 562): the converters and the reader bring torch, numpy
# and gguf, which a command that only parses its arguments (`ft --help`) should not wait for.
_LAZY = {
    "convert_checkpoint": ".convert", "load_config": ".config_file",
    "FAMILIES": ".families", "family_for_config": ".families",
    "ALIGNMENT": ".format", "BLOCK_DTYPES": ".format", "FORMAT_VERSION": ".format", "INDEX_FILENAME": ".format",
    "ExpertBank": ".format", "ExpertPart": ".format", "Index": ".format", "ShardEntry": ".format",
    "TensorEntry": ".format",
    "GGUF_SIDE_FILES": ".gguf_convert", "convert_gguf": ".gguf_convert",
    "GGUF_ARCHITECTURES": ".gguf_source",
    "gguf_tokenizer_config": ".gguf_tokenizer", "gguf_tokenizer_json": ".gguf_tokenizer",
    "FTWReader": ".reader", "FTWWriter": ".writer",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ftw' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module, __name__), "ARCHITECTURES" if name == "GGUF_ARCHITECTURES" else name)
    globals()[name] = value
    return value


__all__ = [
    "ALIGNMENT", "BLOCK_DTYPES", "FAMILIES", "FORMAT_VERSION", "GGUF_ARCHITECTURES", "GGUF_SIDE_FILES", "INDEX_FILENAME",
    "CorruptIndexError", "CorruptShardError",
    "ExpertBank", "ExpertPart", "FTWError", "FTWReader", "FTWWriter", "Index", "ShardEntry", "SourceError",
    "TensorEntry", "UnsupportedArchitectureError", "UnsupportedVersionError", "WriterStateError",
    "convert_checkpoint", "convert_gguf", "family_for_config", "gguf_tokenizer_config", "gguf_tokenizer_json",
    "load_config",
]
