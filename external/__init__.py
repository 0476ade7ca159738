"""``ragen_external``: bridges from ragen to outside systems (see external/README.md).

Each subpackage (``ragen_external.verl``, ``ragen_external.webshop``, ``ragen_external.search``) has its own README,
its own optional dependencies (a setup.py extra each) and its tests under ``external/<name>/tests``. Importing this
package imports none of them.
"""
