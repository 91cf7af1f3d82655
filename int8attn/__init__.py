"""int8attn: attention over an INT8 KV cache with INT8 PV matrix instructions.

The Python API lives in `int8attn.api` (re-exported lazily here):

    import int8attn
    graph = int8attn.compile(source, pv="int8")
    out = graph(q, k, k_scale, v, v_scale)
"""

__version__ = "0.1.0"

__all__ = ["compile", "compile_file", "CompiledGraph", "CompileOptions"]


def __getattr__(name):
    if name in __all__:
        from . import api

        return getattr(api, name)
    raise AttributeError(name)
