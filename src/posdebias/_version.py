"""The package version, in one place."""

__version__ = "0.1.0"

#: The version of the plugin contract (hooks, the base classes plugins subclass, the
#: ``posdebias.adapters.hf`` surface): ``(major, minor)``. A minor step adds to the contract; a
#: major step changes or removes something, after a release of deprecation warnings. A plugin
#: checks ``posdebias.PLUGIN_API_VERSION[0] == 1``.
PLUGIN_API_VERSION: tuple[int, int] = (1, 0)
