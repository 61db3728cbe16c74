"""The built-in model families: one module each (the text-only families, which differ only in
data, share ``text``), holding the adapter class and its hookimpl.

The registry loads them by module name (``posdebias.registry.manager.BUILTIN_PLUGINS``); their
tiny test models live in :mod:`posdebias.testing.tiny`.
"""
