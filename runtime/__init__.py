"""Executing compiled modules on the IREE runtime, and the compiled-module cache."""

from int8attn.runtime.cache import ModuleCache, default_cache_dir
from int8attn.runtime.module import InputError, LoadedModule, aligned_copy, aligned_empty

__all__ = ["ModuleCache", "default_cache_dir", "InputError", "LoadedModule", "aligned_copy",
           "aligned_empty"]
