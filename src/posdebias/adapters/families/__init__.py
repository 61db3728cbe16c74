"""The built-in model families: one module each, holding the adapter class and its hookimpl.

The registry loads them by module name (``posdebias.registry.manager.BUILTIN_PLUGINS``); their
tiny test models live in :mod:`posdebias.testing.tiny`.
"""
