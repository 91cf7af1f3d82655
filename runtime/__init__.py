"""Executing compiled modules on the IREE runtime, and the compiled-module cache."""

from .cache import ModuleCache, default_cache_dir
from .module import InputError, LoadedModule, aligned_copy, aligned_empty

__all__ = ["ModuleCache", "default_cache_dir", "InputError", "LoadedModule", "aligned_copy",
           "aligned_empty"]
